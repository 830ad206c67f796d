"""How a generation's candidates and prompts are cut into work units, one `generate` call each
(engine.units, hardware.min_units): a pure function of the generation in `fixed` mode, so that
the pool's size never changes a result (docs/architecture.md, "Determinism rules")."""

from __future__ import annotations

from dataclasses import dataclass

from evora.engines import Sampling
from evora.lora import Tensors
from evora.strategies.noise_sums import NoiseSums
from evora.strategies.protocol import Spec, prompts_of
from evora.training.rollouts import RolloutRequest

EVAL_CHUNK = 64  # examples per work unit of an evaluation (held-out, selection)


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def search_units(
    specs: list[Spec], prompts: tuple[int, ...], units: str, max_loras: int, workers: int, min_units: int = 1
) -> list[tuple[list, tuple[int, ...]]]:
    """A generation's (candidates, prompts) work units (one `generate` call each). `fixed`: at
    most max_loras candidates a unit and, when that makes fewer than `min_units` units, the
    prompts cut into near-equal parts as well (not for candidates routed to prompts of their
    own), so that a pool of up to min_units workers all have work: a pure function of the
    generation, whatever the pool, so any number of workers gives bitwise the same results
    (docs/architecture.md, "Determinism rules"). `whole`: one unit per live worker, vLLM's
    scheduler keeping max_loras adapters in flight; no call waits at its end for a few long
    sequences, but batches, and so float sums, change with the number of workers."""
    if units == "whole":
        return [(c, prompts) for c in chunks(specs, max(1, -(-len(specs) // max(1, workers))))]
    groups = chunks(specs, max_loras)
    routed = any(prompts_of(spec) is not None for spec in specs)
    parts = 1 if routed or not groups else max(1, min(len(prompts), -(-min_units // len(groups))))
    return [(group, part) for group in groups for part in even_parts(prompts, parts)]


def even_parts(items: tuple[int, ...], count: int) -> list[tuple[int, ...]]:
    """`items` in `count` consecutive parts whose sizes differ by at most one."""
    size, extra = divmod(len(items), count)
    bounds = [i * size + min(i, extra) for i in range(count + 1)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(count)]


def largest_call(max_loras: int, prompts: int, samples: int, eval_samples: int) -> int:
    """The most requests one `generate` call of a run makes: a search unit (max_loras candidates
    on a generation's prompts, each sampled) or an evaluation unit (the base model and the center
    on EVAL_CHUNK examples)."""
    return max(max_loras * prompts * samples, 2 * EVAL_CHUNK * eval_samples)


@dataclass(frozen=True)
class GroupTask:
    """A unit of a summed strategy's update: one fixed group of members to sum (strategies/noise_sums.py)."""

    sums: NoiseSums
    group: int


@dataclass(frozen=True)
class GroupSum:
    group: int
    tensors: Tensors  # sum over the group's members of c_m eps_m, per tensor
    worker: int
    seconds: float


@dataclass(frozen=True)
class RolloutUnit:
    label: str  # the adapter's name on the engines: its step's
    prompts: tuple[tuple[int, ...], ...]
    sampling: tuple[Sampling, ...]  # one per row
    max_tokens: int
    logprobs: bool  # also score each completion under the same adapter (teacher forcing)


@dataclass
class RolloutResult:
    completions: list[tuple[int, ...]]
    logprobs: list[tuple[float, ...]] | None
    worker: int


def rollout_units(request: RolloutRequest) -> list[RolloutUnit]:
    """A trainer's rollout rows in units of `rows_per_unit`, in row order (distributed/rollouts.py)."""
    rows = list(range(len(request.prompts)))
    return [
        RolloutUnit(
            label=f"grpo-s{request.step}",
            prompts=tuple(request.prompts[r] for r in part),
            sampling=tuple(Sampling(request.temperature, request.top_p, request.seeds[r]) for r in part),
            max_tokens=request.max_tokens,
            logprobs=request.logprobs,
        )
        for part in chunks(rows, request.rows_per_unit)
    ]
