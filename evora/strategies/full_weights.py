"""Full-weight strategies (EGGROLL): the contract between the strategy's maths and the
engines whose base weights it moves.

A strategy registered with `kind=full_weight` evaluates its candidates as LoRAs on the
engines' current weights and, after each `tell`, changes those weights themselves. The
driver holds no weights: every worker keeps fp32 `MasterWeights` of the selected matrices
and applies the same updates from seeds and fitness:

    update = strategy.update_of(state, generation)   # small, plain data: what follows `generation`
    norm = strategy.apply(master, update)            # in place, on every worker, bit for bit the same
    master = strategy.start_master(tensors, transposed)  # from the checkpoint's matrices (fp32), as stored
    strategy.perturbation_rank, strategy.snapshot_every   # candidates' LoRA rank; generations between snapshots
    strategy.master_bytes(layout)                     # host memory of a worker's master copies (stated at the start)

`distributed/full_weights.py` runs this on the workers, checks that their weights agree,
snapshots them, and exports them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence, TypeVar

import numpy as np
import torch

from evora.lora import Tensors
from evora.lora.layout import AdapterLayout
from evora.strategies.checks import require
from evora.strategies.protocol import CandidateSpec, GenerationResults, Strategy
from evora.strategies.shaping import shaping_input


@dataclass
class MasterWeights:
    """fp32 master copies of the selected matrices (by checkpoint name) and, with Adam, its
    moments; `generation`: how many updates they hold. The engine's weights are re-cast from them."""

    tensors: Tensors
    generation: int = 0
    adam_m: Tensors | None = None
    adam_v: Tensors | None = None
    transposed: frozenset[str] = frozenset()  # names stored [in, out] as the checkpoint has them (GPT-2's Conv1D)

    def checksum(self) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for group in (self.tensors, self.adam_m or {}, self.adam_v or {}):
            for name in sorted(group):
                digest.update(name.encode())
                digest.update(group[name].contiguous().view(torch.uint8).numpy().data)  # no copy
        return digest.hexdigest()

    def finite(self) -> bool:
        return all(bool(torch.isfinite(t).all()) for t in self.tensors.values())

    def snapshot(self) -> Tensors:
        """Every tensor, flat (moments prefixed), for one safetensors file."""
        out = dict(self.tensors)
        for prefix, group in (("adam_m/", self.adam_m), ("adam_v/", self.adam_v)):
            out.update({prefix + k: v for k, v in (group or {}).items()})
        return out

    @classmethod
    def from_snapshot(
        cls, tensors: Tensors, generation: int, transposed: frozenset[str] = frozenset()
    ) -> "MasterWeights":
        plain = {k: v.clone() for k, v in tensors.items() if "/" not in k}
        m, v = ({k[len(p) :]: t.clone() for k, t in tensors.items() if k.startswith(p)} for p in ("adam_m/", "adam_v/"))
        return cls(plain, generation, m or None, v or None, transposed)


def matrix_name(module: str) -> str:
    """A module's weight by its checkpoint name: what engines' base-weight hooks take."""
    return f"{module}.weight"


def transposed_matrices(layout: AdapterLayout) -> frozenset[str]:
    """The layout's matrices the checkpoint stores [in, out] (their updates are transposed)."""
    return frozenset(matrix_name(slot.name) for slot in layout.modules if slot.stored_transposed)


class FullWeightStrategy(Strategy, Protocol):
    """Registered with kind=full_weight (see the module's docstring)."""

    @property
    def perturbation_rank(self) -> int: ...

    @property
    def snapshot_every(self) -> int: ...

    @property
    def delta_rank(self) -> int: ...

    def update_of(self, state: Any, generation: int) -> Any: ...

    def apply(self, master: MasterWeights, update: Any) -> float: ...

    def start_master(self, tensors: Tensors, transposed: frozenset[str] = frozenset()) -> MasterWeights: ...

    def master_bytes(self, layout: AdapterLayout) -> int: ...


class InPlaceStrategy(FullWeightStrategy, Protocol):
    """Registered with kind=full_weight and in_place=True (the ES paper's algorithm): a worker
    evaluates each candidate on the engine's own weights, set to `perturbed(...)`, and sets
    them back to the master copies (cast again, never un-perturbed by subtraction) after it."""

    def perturbed(self, master: MasterWeights, payload: Any, spec: Any) -> Tensors:
        """The candidate's weights (fp32, by checkpoint name, as stored): master + its perturbation."""


class FitnessHistory(Protocol):
    fitness: list[list[float]]  # per generation: what the update is computed from


H = TypeVar("H", bound=FitnessHistory)


def with_fitness(state: H, specs: list[CandidateSpec], results: GenerationResults, shaping: str) -> H:
    """The state with the generation's fitness (shaping=per_prompt: its per-prompt normalised
    means) appended: the numbers every worker replays the generation's update from, by position."""
    if [s.index for s in specs] != list(range(len(specs))):
        raise ValueError("specs must be the whole population in index order")
    generation = specs[0].generation
    if generation != len(state.fitness):  # the updates are replayed by position: no gaps
        raise ValueError(f"tell of generation {generation} after {len(state.fitness)} generations")
    shaped = shaping_input(results, shaping)
    return replace(state, fitness=[*state.fitness, [float(f) for f in shaped]])  # type: ignore[type-var]  # H is a dataclass


def member_coefficients(specs: Sequence[CandidateSpec], weights: np.ndarray) -> tuple[float, ...]:
    """Per member: the sum over its candidates of shaped fitness x sign (mirrored pairs share a member)."""
    coefficients = [0.0] * (max(spec.member for spec in specs) + 1)
    for spec, w in zip(specs, weights):
        coefficients[spec.member] += float(w) * spec.sign
    return tuple(coefficients)


def check_full_weight(name: str, snapshot_every: int, delta_rank: int, run: Any = None) -> None:
    """The rules every full-weight strategy shares: snapshots, the delta adapter's rank, and
    weights sharded only through vLLM."""
    require(snapshot_every >= 1, "strategy.snapshot_every", snapshot_every, "must be an integer >= 1")
    require(delta_rank >= 1, "strategy.delta_rank", delta_rank, "must be an integer >= 1")
    if run is not None:
        require(
            run.hardware.tensor_parallel_size == 1 or run.engine.name == "vllm",
            "hardware.tensor_parallel_size",
            run.hardware.tensor_parallel_size,
            f"strategy={name} shards weights only through vLLM (engine=vllm)",
        )
