"""Full-weight strategies (EGGROLL): the contract between the strategy's maths and the
engines whose base weights it moves.

A strategy registered with `kind=full_weight` evaluates its candidates as LoRAs on the
engines' current weights and, after each `tell`, changes those weights themselves. The
driver holds no weights: every worker keeps fp32 `MasterWeights` (`master_weights.py`) of the
selected matrices and applies the same updates from seeds and fitness:

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

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, Sequence, TypeVar

from evora.config.checks import require
from evora.lora import Tensors
from evora.lora.layout import AdapterLayout
from evora.strategies.protocol import CandidateSpec, GenerationResults, GradientStrategy, Strategy
from evora.strategies.shaping import shaping_input

if TYPE_CHECKING:  # the protocols name them; the tensors' code is in master_weights.py (torch)
    from evora.lora.noise import DenseNoise
    from evora.strategies.master_weights import MasterWeights


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


def check_decay(weight_decay: float, anchor: str) -> None:
    require(weight_decay >= 0, "strategy.weight_decay", weight_decay, "must be >= 0")
    require(anchor in ANCHORS, "strategy.weight_decay_anchor", anchor, "allowed: " + ", ".join(ANCHORS))


def check_full_weight(snapshot_every: int, delta_rank: int) -> None:
    """The rules every full-weight strategy shares: snapshots and the delta adapter's rank
    (sharded weights need an engine that shards: config validation's rule for every run)."""
    require(snapshot_every >= 1, "strategy.snapshot_every", snapshot_every, "must be an integer >= 1")
    require(delta_rank >= 1, "strategy.delta_rank", delta_rank, "must be an integer >= 1")
