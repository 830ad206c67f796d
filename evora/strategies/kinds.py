"""What kind of strategy it is: a type that owns everything the kind changes.

A kind is declared at registration (`register_strategy(kind=FULL_WEIGHT)`) and says

- which protocol its strategies implement (checked when a strategy registers, and by mypy,
  which types `register_strategy`'s decorator by it);
- which fields its configs have (population, steps per generation);
- the search that runs its generations and the exporter that writes its finish, both in the
  distributed runtime and so named as "module:attribute" (strategies import no runtime);
- what the driver holds of the engines' weights (full-weight kinds: their master copies);
- its part in the memory estimate and the candidates' layout.

No module outside this one asks which kind a strategy is: each asks its kind.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Generic, Protocol, TypeVar

from evora.lora.layout import AdapterLayout
from evora.strategies.full_weights import FullWeightStrategy, InPlaceStrategy, TrainedWeightsStrategy
from evora.strategies.noise_sums import SummedStrategy
from evora.strategies.protocol import (
    DeviceNoiseStrategy,
    GradientStrategy,
    PortfolioStrategy,
    RefiningStrategy,
    Strategy,
)

P = TypeVar("P")

POPULATION_SEARCH = "evora.distributed.search:PopulationSearch"
EXPORT_ADAPTERS = "evora.distributed.exporters:export_adapters"
# A trait a strategy may declare at registration, and the protocol that it adds.
TRAITS: dict[str, type] = {
    "refines": RefiningStrategy,
    "summed": SummedStrategy,
    "in_place": InPlaceStrategy,
    "device_noise": DeviceNoiseStrategy,
}


def protocol_members(protocol: type) -> set[str]:
    """The members a protocol declares, its bases' too."""
    return {
        name
        for klass in protocol.__mro__
        if klass not in (object, Protocol, Generic) and vars(klass).get("_is_protocol", False)
        for name in [*vars(klass), *vars(klass).get("__annotations__", {})]
        if not name.startswith("_")
    }


def missing_members(cls: type, protocol: type) -> list[str]:
    """What `cls` lacks of `protocol`: methods and properties, and the attributes it declares."""
    declared = set(dir(cls)) | {name for klass in cls.__mro__ for name in vars(klass).get("__annotations__", {})}
    return sorted(protocol_members(protocol) - declared)


def resolve(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return vars(importlib.import_module(module))[attribute]


@dataclass(frozen=True)
class Kind(Generic[P]):
    name: str
    protocol: type | None  # what its strategies implement; None: the strategy runs its whole job (a runner)
    meaning: str = ""  # one line for a reader: what a generation of this kind does (the docs print it)
    search: str | None = POPULATION_SEARCH  # "module:Class" in evora.distributed, built with SearchParts
    exporter: str | None = EXPORT_ADAPTERS  # "module:function" taking ExportParts
    weights: str | None = None  # "module:Class": what the driver holds of the engines' weights (None: nothing)
    moves_weights: bool = False  # its tell moves the engines' base weights (not a LoRA over them)
    trains_on_driver: bool = False  # every strategy of the kind trains on the driver (a TrainingContext)
    config_fields: tuple[str, ...] = ()  # fields its strategies' configs must have
    traits: frozenset[str] = frozenset()  # TRAITS its strategies may declare

    def check(self, name: str, strategy: type | str | None, config: type, traits: set[str]) -> None:
        """At registration: the strategy implements the kind's protocol (and its traits'), its
        config has the kind's fields, and its traits are the kind's to have. A strategy named
        by import path has its members checked when it is imported (registry.strategy_class)."""
        if (self.protocol is None) != (strategy is None):
            raise TypeError(f"strategy {name}: a runner, and only a runner, makes kind={self.name!r}")
        for trait in sorted(traits - self.traits):
            raise TypeError(f"strategy {name}: {trait}=True is not for kind={self.name!r}")
        fields = {f.name for f in dataclasses.fields(config)}
        for field in self.config_fields:
            if field not in fields:
                raise TypeError(f"strategy {name}: kind={self.name!r} needs a config with a `{field}` field")
        protocols = [p for p in (self.protocol, *(TRAITS[t] for t in sorted(traits))) if p is not None]
        for protocol in protocols:
            missing = missing_members(strategy, protocol) if isinstance(strategy, type) else []
            if missing:
                raise TypeError(f"strategy {name}: {protocol.__name__} needs {', '.join(missing)}")

    def population(self, cfg: Any) -> int:
        """Candidates a generation evaluates, from the config (0: the kind has no fixed population)."""
        return 0

    def steps_per_generation(self, cfg: Any) -> int:
        """Optimizer steps a generation takes on the driver (refinement after a tell: one)."""
        return 1

    def candidates(self, build: Callable[[], Any], layout: AdapterLayout) -> AdapterLayout:
        """What its candidates are on the engines: the run's LoRA."""
        return layout

    def master_bytes(self, build: Callable[[], Any], layout: AdapterLayout) -> int:
        """Bytes a worker holds beside its engine (full-weight master copies)."""
        return 0

    def driver_bytes(self, build: Callable[[], Any], layout: AdapterLayout, parameters: int) -> int:
        """Bytes its training takes on the driver, activations aside (0: it trains nowhere there)."""
        return 0

    def search_class(self) -> Any:
        assert self.search is not None, f"kind={self.name} runs its own job"
        return resolve(self.search)

    def export_function(self) -> Any:
        assert self.exporter is not None, f"kind={self.name} runs its own job"
        return resolve(self.exporter)

    def engine_weights(self) -> Any | None:
        return resolve(self.weights) if self.weights is not None else None


class PopulationConfig(Protocol):
    population: int


@dataclass(frozen=True)
class PopulationKind(Kind[P]):
    config_fields: tuple[str, ...] = ("population",)

    def population(self, cfg: PopulationConfig) -> int:
        return cfg.population


@dataclass(frozen=True)
class FullWeightKind(PopulationKind[FullWeightStrategy]):
    """Its candidates are LoRAs of the strategy's perturbation rank at scale 1 (alpha = rank) on
    the run's modules, over weights its tell moves; workers keep fp32 master copies of them."""

    moves_weights: bool = True
    weights: str | None = "evora.distributed.full_weights:EngineWeights"
    exporter: str | None = "evora.distributed.exporters:export_weights"

    def candidates(self, build: Callable[[], Any], layout: AdapterLayout) -> AdapterLayout:
        strategy: FullWeightStrategy = build()
        rank = strategy.perturbation_rank
        return dataclasses.replace(layout, rank=rank, alpha=float(rank))

    def master_bytes(self, build: Callable[[], Any], layout: AdapterLayout) -> int:
        strategy: FullWeightStrategy = build()
        return strategy.master_bytes(layout)


class GradientConfig(Protocol):
    steps_per_generation: int


@dataclass(frozen=True)
class GradientKind(Kind[GradientStrategy]):
    search: str | None = "evora.distributed.search:GradientSearch"
    trains_on_driver: bool = True
    config_fields: tuple[str, ...] = ("steps_per_generation",)

    def steps_per_generation(self, cfg: GradientConfig) -> int:
        return cfg.steps_per_generation

    def driver_bytes(self, build: Callable[[], Any], layout: AdapterLayout, parameters: int) -> int:
        """The model in fp32 (4 bytes a weight) and, per adapter weight, its gradient and AdamW's
        two moments (12 more); a KL term's reference is the model with the adapter off."""
        return 4 * parameters + 12 * layout.num_parameters()


@dataclass(frozen=True)
class TrainedWeightsKind(GradientKind):
    """Trained on the driver, over the engines' own weights: the workers keep fp32 master copies
    of the trained matrices in step, snapshotted and exported as a full-weight kind's."""

    moves_weights: bool = True
    weights: str | None = "evora.distributed.full_weights:EngineWeights"
    exporter: str | None = "evora.distributed.exporters:export_weights"

    def master_bytes(self, build: Callable[[], Any], layout: AdapterLayout) -> int:
        strategy: TrainedWeightsStrategy = build()
        return strategy.master_bytes(layout)

    def driver_bytes(self, build: Callable[[], Any], layout: AdapterLayout, parameters: int) -> int:
        strategy: TrainedWeightsStrategy = build()
        return strategy.driver_bytes(layout, parameters)


POPULATION: PopulationKind[Strategy] = PopulationKind(
    "population",
    Strategy,
    "ask/tell: each generation's candidates are LoRAs evaluated on the engine workers in one multi-LoRA batch",
    traits=frozenset({"refines", "summed", "device_noise"}),
)
PORTFOLIO: Kind[PortfolioStrategy] = Kind(
    "portfolio",
    PortfolioStrategy,
    "a population whose members serve together as a routed portfolio of specialists",
    exporter="evora.distributed.exporters:export_portfolio",
    traits=frozenset({"refines"}),
)
FULL_WEIGHT = FullWeightKind(
    "full_weight",
    FullWeightStrategy,
    "a population whose update moves the engines' own weights (not a LoRA over them); exports a full model",
    traits=frozenset({"in_place"}),
)
GRADIENT = GradientKind(
    "gradient",
    GradientStrategy,
    "trained by gradient steps on the driver each generation; the engine workers score it",
)
TRAINED_WEIGHTS = TrainedWeightsKind(
    "trained_weights",
    TrainedWeightsStrategy,
    "trained by gradient steps on the driver over the engines' own weights, which every worker keeps in step",
)
# PBT on Ray Tune: its population is the members it trains at once (the engines keep them all
# loaded under engine.units=whole)
JOB: PopulationKind[None] = PopulationKind(
    "job",
    None,
    "runs its whole job itself (a runner, e.g. on Ray Tune), scoring on the same engine workers",
    search=None,
    exporter=None,
)
KINDS: tuple[Kind[Any], ...] = (POPULATION, PORTFOLIO, FULL_WEIGHT, GRADIENT, TRAINED_WEIGHTS, JOB)
