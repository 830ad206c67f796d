"""What one engine worker holds in memory, estimated from the model's config and the run's
settings (docs/models.md, "Will it fit"; `evora doctor`). Pure arithmetic, no engine:

    weights     parameters x dtype bytes / tensor_parallel_size
    lora slots  engine.max_loras x sum over targeted modules of (in + out) x max LoRA rank x dtype bytes
    KV cache    2 x layers x KV heads x head dim x dtype bytes x tokens, for one sequence of
                model.max_model_len (what the engine needs to start) and for engine.max_num_seqs of them
    master      a full-weight strategy's fp32 copies of the matrices it moves (+ Adam's two moments), on the host
"""

from __future__ import annotations

from dataclasses import dataclass

from evora.lora.layout import AdapterLayout
from evora.lora.modules import ConfigFacts

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    lora_slots: int
    kv_per_sequence: int
    kv_full: int  # max_num_seqs sequences of max_model_len tokens
    master: int  # host memory of full-weight strategies' fp32 copies

    def to_start(self) -> int:
        """Device bytes an engine needs to start: weights, LoRA slots, one full-length sequence."""
        return self.weights + self.lora_slots + self.kv_per_sequence


def dtype_of(facts: ConfigFacts, dtype: str) -> str:
    if dtype != "auto":
        return dtype
    return facts.stored_dtype if facts.stored_dtype in DTYPE_BYTES else "float32"


def estimate(
    *,
    parameters: int,
    facts: ConfigFacts,
    layout: AdapterLayout,
    dtype: str,
    max_lora_rank: int,
    max_loras: int,
    max_num_seqs: int,
    max_model_len: int,
    tensor_parallel_size: int = 1,
    master_bytes: int = 0,
) -> MemoryEstimate:
    size = DTYPE_BYTES[dtype_of(facts, dtype)]
    per_token = facts.kv_values_per_token * size // tensor_parallel_size
    slot = sum(s.in_features + s.out_features for s in layout.modules) * max_lora_rank * size
    return MemoryEstimate(
        weights=parameters * size // tensor_parallel_size,
        lora_slots=max_loras * slot // tensor_parallel_size,
        kv_per_sequence=per_token * max_model_len,
        kv_full=per_token * max_model_len * max_num_seqs,
        master=master_bytes,
    )
