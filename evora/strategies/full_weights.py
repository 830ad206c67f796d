"""Full-weight strategies (EGGROLL): the contract between the strategy's maths and the
engines whose base weights it moves.

A strategy registered with `kind=full_weight` evaluates its candidates as LoRAs on the
engines' current weights and, after each `tell`, changes those weights themselves. The
driver holds no weights: every worker keeps fp32 `MasterWeights` of the selected matrices
and applies the same updates from seeds and fitness:

    update = strategy.update_of(state, generation)   # small, plain data: what follows `generation`
    norm = strategy.apply(master, update)            # in place, where the copies are, on every worker bit for bit
    master = strategy.start_master(tensors, transposed)  # from the checkpoint's matrices (fp32), as stored
    strategy.perturbation_rank, strategy.snapshot_every   # candidates' LoRA rank; generations between snapshots
    strategy.master_bytes(layout)                     # memory of a worker's master copies (the plan places them)
    strategy.anchored                                 # decay pulls towards the model's weights (MasterWeights.anchor)

The master copies live on the engine's device when they fit beside it, on the host otherwise
(the run plan decides: `RunPlan.master_device`), and every noise draw of the update is made
there: workers agree bit for bit within one device class (docs/architecture.md, "Determinism
rules").

`distributed/full_weights.py` runs this on the workers, checks that their weights agree,
snapshots them, and exports them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence, TypeVar

import torch
import xxhash

from evora.config.checks import require
from evora.lora import Tensors
from evora.lora.layout import AdapterLayout
from evora.lora.noise import DenseNoise, in_parallel
from evora.strategies.protocol import CandidateSpec, GenerationResults, GradientStrategy, Strategy
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
    # weight_decay_anchor=start: the model's own weights (fp32), which decay pulls towards; never
    # snapshotted (a resumed worker reads them from the model again) and constant, so unchecked.
    anchor: Tensors | None = None

    @property
    def device(self) -> torch.device:
        """Where the copies live (the plan's choice: the engine's device when they fit beside it)."""
        return next(iter(self.tensors.values())).device if self.tensors else torch.device("cpu")

    def checksum(self) -> str:
        """A digest of every value's bits, computed where they are (`tensor_digest`): workers
        compare their weights without copying them off the device."""
        named = [
            (name, t) for group in (self.tensors, self.adam_m or {}, self.adam_v or {}) for name, t in group.items()
        ]
        named.sort(key=lambda item: item[0])
        digest = hashlib.blake2b(digest_size=16)
        for (name, _), part in zip(
            named, in_parallel(tensor_digest, [t for _, t in named], self.device, cost=torch.Tensor.numel)
        ):
            digest.update(name.encode())
            digest.update(part)
        return digest.hexdigest()

    def to(self, device: str | torch.device) -> "MasterWeights":
        """The same copies on `device` (itself when they are there already)."""
        if self.device == torch.device(device):
            return self

        def moved(group: Tensors | None) -> Tensors | None:
            return None if group is None else {k: v.to(device) for k, v in group.items()}

        tensors = moved(self.tensors)
        assert tensors is not None
        return MasterWeights(
            tensors, self.generation, moved(self.adam_m), moved(self.adam_v), self.transposed, moved(self.anchor)
        )

    def decay(self, name: str, rate: float) -> torch.Tensor:
        """Decoupled weight decay's step of a matrix: rate * W towards zero, or rate * (W - W_0)
        towards the model's own weights when the copies carry them (weight_decay_anchor=start)."""
        weight = self.tensors[name]
        return rate * (weight if self.anchor is None else weight - self.anchor[name])

    def finite(self) -> bool:
        return all(bool(torch.isfinite(t).all()) for t in self.tensors.values())

    def snapshot(self) -> Tensors:
        """Every tensor on the CPU, flat (moments prefixed), for one safetensors file."""
        out = {k: v.cpu() for k, v in self.tensors.items()}
        for prefix, group in (("adam_m/", self.adam_m), ("adam_v/", self.adam_v)):
            out.update({prefix + k: v.cpu() for k, v in (group or {}).items()})
        return out

    @classmethod
    def from_snapshot(
        cls, tensors: Tensors, generation: int, transposed: frozenset[str] = frozenset()
    ) -> "MasterWeights":
        plain = {k: v.clone() for k, v in tensors.items() if "/" not in k}
        m, v = ({k[len(p) :]: t.clone() for k, t in tensors.items() if k.startswith(p)} for p in ("adam_m/", "adam_v/"))
        return cls(plain, generation, m or None, v or None, transposed)


# Rows of a fingerprint's block: 2**20 values each, weighted by odd int64 constants.
FINGERPRINT_ROW = 1 << 20
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64


def _odd_weights(count: int, device: torch.device, salt: int = 0) -> torch.Tensor:
    """count odd int64 constants (a Weyl sequence: exact integer arithmetic, wrapping)."""
    steps = torch.arange(1, count + 1, dtype=torch.int64, device=device) + salt
    return steps * _GOLDEN | 1


def tensor_digest(tensor: torch.Tensor) -> bytes:
    """A tensor's bits digested where they are: XXH3-64 of its bytes on the CPU (at memory
    speed: CRC-32 took 4-6x the time to read them, bench/real_shapes.py), `fingerprint` on a GPU
    (no copy to the host). Any single changed bit changes either."""
    if tensor.device.type == "cpu":
        return xxhash.xxh3_64_digest(tensor.detach().contiguous().view(torch.uint8).numpy().data)
    return fingerprint(tensor).to_bytes(8, "little", signed=True)


def fingerprint(tensor: torch.Tensor) -> int:
    """sum_i bits_i w_i mod 2**64 over the tensor's 32-bit words, w_i odd: any single changed
    value changes it (w_i is invertible mod 2**64), and integer sums do not depend on the order
    a device reduces in, so every device and thread count gives the same number for the same
    bits. Computed on the tensor's device, a block of rows at a time."""
    words = tensor.detach().contiguous().view(-1).view(torch.int32)
    row = min(FINGERPRINT_ROW, max(1, words.numel()))
    weights = _odd_weights(row, words.device)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    for block, start in enumerate(range(0, words.numel(), row * 16)):
        chunk = words[start : start + row * 16].to(torch.int64)
        full = chunk.numel() // row * row
        sums = (chunk[:full].view(-1, row) * weights).sum(dim=1)
        if full < chunk.numel():
            tail = (chunk[full:] * weights[: chunk.numel() - full]).sum().view(1)
            sums = torch.cat([sums, tail])
        total += (sums * _odd_weights(sums.numel(), words.device, salt=block * 16)).sum()
    return int(total)


def matrix_name(module: str) -> str:
    """A module's weight by its checkpoint name: what engines' base-weight hooks take."""
    return f"{module}.weight"


def transposed_matrices(layout: AdapterLayout) -> frozenset[str]:
    """The layout's matrices the checkpoint stores [in, out] (their updates are transposed)."""
    return frozenset(matrix_name(slot.name) for slot in layout.modules if slot.stored_transposed)


class MovesWeights(Protocol):
    """What moves the engines' own weights, whatever finds the update: the workers' side (update,
    apply, master copies), snapshots and the export (kind=full_weight; kind=trained_weights:
    full-weight GRPO, whose update is the trained matrices themselves)."""

    @property
    def snapshot_every(self) -> int: ...

    @property
    def delta_rank(self) -> int: ...

    def update_of(self, state: Any, generation: int) -> Any: ...

    def apply(self, master: MasterWeights, update: Any) -> float: ...

    def start_master(self, tensors: Tensors, transposed: frozenset[str] = frozenset()) -> MasterWeights: ...

    @property
    def anchored(self) -> bool:
        """Whether its decay pulls towards the model's own weights (MasterWeights.anchor)."""

    def master_bytes(self, layout: AdapterLayout) -> int: ...


class FullWeightStrategy(Strategy, MovesWeights, Protocol):
    """Registered with kind=full_weight (see the module's docstring): a population whose
    candidates are LoRAs of `perturbation_rank` over the moved weights."""

    @property
    def perturbation_rank(self) -> int: ...


class TrainedWeightsStrategy(GradientStrategy, MovesWeights, Protocol):
    """Registered with kind=trained_weights (full-weight GRPO): trained by gradient steps on the
    driver, its update the trained matrices themselves."""

    def driver_bytes(self, layout: AdapterLayout, parameters: int) -> int:
        """Bytes its training takes on the driver, activations aside."""


class InPlaceStrategy(FullWeightStrategy, Protocol):
    """Registered with kind=full_weight and in_place=True (the ES paper's algorithm): a worker
    evaluates each candidate on the engine's own weights, which the engine sets to master +
    its perturbation from seeds (`Engine.perturb_base`), and sets back to the master copies
    (cast again, never un-perturbed by subtraction) after the unit's candidates."""

    def perturbation(self, payload: Any, spec: Any) -> Sequence[DenseNoise]:
        """The candidate as seeds: each perturbed matrix's noise key and scale."""

    def perturbed(self, master: MasterWeights, payload: Any, spec: Any) -> Tensors:
        """The candidate's weights (fp32, by checkpoint name, as stored): master + its
        perturbation, what `perturbation` makes an engine set (a reference, for tests)."""


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


ANCHORS = ("zero", "start")


def decays_to_start(weight_decay: float, anchor: str) -> bool:
    return weight_decay > 0 and anchor == "start"


def start_copies(tensors: Tensors, transposed: frozenset[str], anchored: bool) -> MasterWeights:
    """fp32 master copies of the checkpoint's matrices, as stored; `anchored`: with a second fp32
    copy that decay pulls towards."""
    copies = {k: v.detach().to(torch.float32).clone() for k, v in tensors.items()}
    anchor = {k: v.clone() for k, v in copies.items()} if anchored else None
    return MasterWeights(copies, transposed=transposed, anchor=anchor)


def check_decay(weight_decay: float, anchor: str) -> None:
    require(weight_decay >= 0, "strategy.weight_decay", weight_decay, "must be >= 0")
    require(anchor in ANCHORS, "strategy.weight_decay_anchor", anchor, "allowed: " + ", ".join(ANCHORS))


def check_full_weight(snapshot_every: int, delta_rank: int) -> None:
    """The rules every full-weight strategy shares: snapshots and the delta adapter's rank
    (sharded weights need an engine that shards: config validation's rule for every run)."""
    require(snapshot_every >= 1, "strategy.snapshot_every", snapshot_every, "must be an integer >= 1")
    require(delta_rank >= 1, "strategy.delta_rank", delta_rank, "must be an integer >= 1")
