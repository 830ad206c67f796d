"""What one engine worker holds in memory, estimated from the model's config and the run's
settings (README, "Will it fit"; `evora doctor`). Pure arithmetic, no engine:

    weights     parameters x dtype bytes / tensor_parallel_size
    lora slots  engine.max_loras x sum over targeted modules of (in + out) x max LoRA rank x dtype bytes
    KV cache    2 x layers x KV heads x head dim x dtype bytes x tokens, for one sequence of
                model.max_model_len (what the engine needs to start) and for engine.max_num_seqs of them
    master      a full-weight strategy's fp32 copies of the matrices it moves (+ Adam's two moments), on the host
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evora.lora.layout import AdapterLayout

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


def dtype_of(config: Any, dtype: str) -> str:
    if dtype != "auto":
        return dtype
    stored = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
    return stored.removeprefix("torch.") if stored.removeprefix("torch.") in DTYPE_BYTES else "float32"


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    text = config.get_text_config()  # the standard names resolve through each config's attribute_map (GPT-2's n_head)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads  # absent: multi-head attention
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def estimate(
    *,
    parameters: int,
    config: Any,
    layout: AdapterLayout,
    dtype: str,
    max_lora_rank: int,
    max_loras: int,
    max_num_seqs: int,
    max_model_len: int,
    tensor_parallel_size: int = 1,
    master_bytes: int = 0,
) -> MemoryEstimate:
    size = DTYPE_BYTES[dtype_of(config, dtype)]
    per_token = kv_bytes_per_token(config, size) // tensor_parallel_size
    slot = sum(s.in_features + s.out_features for s in layout.modules) * max_lora_rank * size
    return MemoryEstimate(
        weights=parameters * size // tensor_parallel_size,
        lora_slots=max_loras * slot // tensor_parallel_size,
        kv_per_sequence=per_token * max_model_len,
        kv_full=per_token * max_model_len * max_num_seqs,
        master=master_bytes,
    )
