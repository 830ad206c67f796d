"""The engine protocol: batched generation over (adapter, prompt) pairs, greedy or sampled
with a seed per request.

Engines load adapters by path (PEFT layout), or, where the engine says it can
(`loads_from_memory`: vLLM in-process), from the tensors an `AdapterRef` carries, under an
id that is never reused: vLLM caches adapters by id, so a reused id would silently serve
old weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

if TYPE_CHECKING:  # annotations only: the CLI imports this module and must not pay for torch
    import torch

    from evora.lora.noise import DenseNoise


@dataclass(frozen=True)
class AdapterRef:
    lora_id: int  # fresh for every candidate
    name: str
    path: str  # the PEFT folder; "" for an adapter held in memory
    # In memory: PEFT-named tensors in the engine's dtype, and their adapter_config.json.
    tensors: Mapping[str, torch.Tensor] | None = field(default=None, compare=False, repr=False)
    config: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Completion:
    text: str
    num_tokens: int
    token_ids: tuple[int, ...] = ()  # the generated ids (EOS included when generated): KL is taken on them


@dataclass(frozen=True)
class Sampling:
    """How one request samples: temperature, nucleus (top_p) and the seed of its own random
    stream. Both engines sample as vLLM's seeded sampler does with `use_fp64_gumbel`:
    fp32 logits / temperature, vLLM's top-p mask, fp32 softmax, then the argmax of
    probs / q with q ~ Exp(1) in fp64 drawn over the vocabulary from a torch.Generator
    seeded with `seed`, once per generated token (`engines/sampling.py`). Where the two
    engines' logits agree, their completions agree token for token."""

    temperature: float
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class EngineSpec:
    """What every engine is built from; an engine that needs more extends it, and its
    registration's `spec` builds its own from this one (`registry.EngineEntry.spec_for`)."""

    model: str  # local directory or hub id
    tokenizer: str | None = None
    revision: str | None = None
    dtype: str = "auto"
    max_model_len: int = 512
    max_lora_rank: int = 8
    max_loras: int = 8
    max_cpu_loras: int = 16  # adapters kept loaded on the host: a work unit's candidates
    max_num_seqs: int = 256
    max_batch: int = 256  # the most requests one call makes (a work unit's)
    cpu_threads: int = 1
    seed: int = 0
    trust_remote_code: bool = False
    device: str = "cpu"  # cpu | cuda
    ignore_eos: bool = False  # always generate max_tokens tokens
    # The modules LoRA adapts (an engine that wraps modules up front wraps only these); None: any.
    lora_target_modules: tuple[str, ...] | None = None


def per_request(max_tokens: int | Sequence[int], count: int) -> list[int]:
    """`max_tokens` of each of `count` requests: one value for all, or one each."""
    if isinstance(max_tokens, int):
        return [max_tokens] * count
    if len(max_tokens) != count:
        raise ValueError(f"max_tokens for {len(max_tokens)} requests, {count} prompts")
    return [int(m) for m in max_tokens]


class Engine(Protocol):
    loads_from_memory: bool  # takes AdapterRefs that carry their tensors (no folder)

    def generate(
        self,
        prompts: Sequence[list[int]],
        adapters: Sequence[AdapterRef | None],
        max_tokens: int | Sequence[int],
        sampling: Sequence[Sampling] | None = None,
    ) -> list[Completion]:
        """Completions of token-id prompts; adapters[i] (None: base model) applies to prompts[i];
        max_tokens: one limit for every request, or one each; sampling: one `Sampling` per
        request, or None for greedy decoding."""

    def score(
        self, prompts: Sequence[list[int]], targets: Sequence[list[int]], adapters: Sequence[AdapterRef | None]
    ) -> list[list[float]]:
        """Log-probability of each token of targets[i] following prompts[i] (teacher forcing)."""

    def kl_to_base(
        self,
        prompts: Sequence[list[int]],
        completions: Sequence[list[int]],
        adapters: Sequence[AdapterRef | None],
        base: Mapping[str, torch.Tensor] | None = None,
    ) -> list[list[float]]:
        """Per-token KL(adapter || base) along completions[i] after prompts[i] (teacher forcing):
        at each completion position, sum over the vocabulary of p_a * (log p_a - log p_b) of the
        next-token distributions under adapters[i] (on the engine's current weights) and under
        the base model. One value per completion token. The base model is the engine's current
        weights without adapter, where a row whose adapter is None is all zeros; or, given
        `base` (weights by checkpoint name, as `set_base_weights` takes them: the model's own,
        for an engine whose weights a full-weight strategy moved), those weights in place of
        the current ones, every row measured, the engine's weights bitwise as they were after.
        Each engine says in its docstring how exactly it computes the sum (hf: exact; vLLM:
        top-k estimate)."""

    def release(self, adapters: Sequence[AdapterRef]) -> None:
        """Drop adapters from the engine's caches."""

    def base_weights(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """Copies (on the CPU, in the engine's dtype) of base-model weights, by their names in
        the model's checkpoint (e.g. `model.layers.0.self_attn.q_proj.weight`)."""

    def set_base_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Replace base-model weights in place, by checkpoint name: the hook full-weight
        strategies (EGGROLL) update the engine through. Values arrive in fp32 (the caller
        keeps fp32 master copies) and are cast to the engine's dtype; shapes must match.
        Adapters loaded afterwards apply on top of the new weights. vLLM implements it
        through a worker extension (`collective_rpc`), handling fused qkv / gate_up layouts
        and tensor-parallel shards."""

    def perturb_base(self, master: Mapping[str, torch.Tensor], noise: Sequence[DenseNoise]) -> None:
        """Set each named base weight to master[name] + scale * eps, cast to the engine's dtype,
        eps the term's seeded N(0, I) drawn on master[name]'s device (`lora.noise.perturb_into`):
        the candidates of strategy=es_full, set from seeds inside the engine, without a dense
        matrix passed in. `set_base_weights(master)` sets them back exactly."""

    def shutdown(self) -> None: ...
