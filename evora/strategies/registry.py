"""The strategy registry: the one place config, the run loop, the console and the
reports learn what strategies exist.

A strategy registers itself from its own folder (or from a user's module):

    @register_strategy("es", config=ESConfig, summary="evolution strategies over the LoRA tensors",
                       validate=check_es, center="mean")
    class EvolutionStrategy: ...          # ask/tell (protocol.Strategy), run by the shared loop

Its kind (`kinds.py`: POPULATION, the default; PORTFOLIO, FULL_WEIGHT, GRADIENT) is a type that
owns what the kind changes: the protocol the strategy implements (checked here, at import, and
by mypy through the decorator's type), its search, its exporter, its memory. Traits add a
protocol each (`kinds.TRAITS`): `refines=True` declares that its config may ask for gradient
refinement after each tell (protocol.RefiningStrategy).

evora's own strategies name their class by import path instead, so that registering one (as
the CLI does for every strategy, to compose and check its config) imports no torch; the class is
imported, and checked against its kind's protocol, when a run first builds it:

    register_strategy("es", config=ESConfig, summary=..., strategy="evora.strategies.es.strategy:EvolutionStrategy")

A strategy that runs a whole job itself (PBT on Ray Tune) names its runner instead, as
"module:function", so that registering it imports no Ray:

    register_strategy("pbt", config=PBTConfig, runner="evora.jobs.pbt.run:run_pbt", ...)

`strategy.name` may also be an import path, `mypkg.strategies:MyStrategy`, or the name of
a Python entry point in the `evora.strategies` group; either is imported on first use.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Callable, TypeVar, overload

from evora.errors import ConfigError
from evora.strategies.analysis_hooks import NO_ANALYSIS, Analysis
from evora.strategies.kinds import JOB, POPULATION, TRAITS, Kind, resolve
from evora.strategies.protocol import Strategy

ENTRY_POINT_GROUP = "evora.strategies"
T = TypeVar("T")
P = TypeVar("P")


@dataclass(frozen=True)
class StrategyEntry:
    name: str
    config: type  # frozen dataclass with a `name` field; Hydra composes conf/strategy/<name>.yaml onto it
    summary: str  # one line for `evora --help`
    # ask/tell class, built as strategy(config, run_seed); or "module:Class", imported on first use
    strategy: type | str | None = None
    runner: str | None = None  # "module:function(plan, run_dir, on_event) -> final event" for job-level strategies
    validate: Callable[[Any, Any], None] | None = None  # (strategy config, run config); raises ConfigError
    center: str | None = None  # what the final adapter is called in the run folder (mean, elite)
    report_keys: tuple[str, ...] = ()  # config keys the run report shows
    console_keys: tuple[tuple[str, str], ...] = ()  # (metrics key, label) added to each generation line
    kind: Kind[Any] = POPULATION  # kinds.py: the protocol the strategy implements, the search that runs it
    refines: bool = False  # a protocol.RefiningStrategy: its config may refine by gradient after each tell
    # kind=full_weight: candidates perturb the engines' weights in place, one after another
    # (full_weights.InPlaceStrategy, the ES paper's way), rather than run as LoRAs on them.
    in_place: bool = False
    # A noise_sums.SummedStrategy: workers sum the members' noise in fixed groups for its tell
    # (noise_sums / group_sum / tell_with), rather than the driver redrawing the population's.
    summed: bool = False
    # A protocol.DeviceNoiseStrategy: it draws noise only on the workers, which may then draw it
    # on their GPU (hardware.noise_device); the others draw on the CPU's streams, as the driver
    # that redraws theirs must.
    device_noise: bool = False
    # Figures, report sections, findings and compare table the analysis adds for the strategy's runs:
    # an analysis_hooks.Analysis, or "module:attribute" naming one (imported only when a run is analysed,
    # so registering imports no matplotlib). evora.analysis names no strategy; it asks analysis_hooks().
    analysis: Analysis | str | None = None
    # Process environment its runner reads in the CLI's process, set there before any job (a
    # user's own settings kept): PBT's Ray Tune settings.
    environment: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        self._check(self.strategy)  # a class by path: all but its members, checked when imported

    def _check(self, strategy: type | str | None) -> None:
        traits = {trait for trait in TRAITS if vars(self)[trait]}
        self.kind.check(self.name, strategy, self.config, traits)

    def strategy_class(self) -> type | None:
        """The ask/tell class (None for a runner), imported and checked on first use."""
        if not isinstance(self.strategy, str):
            return self.strategy
        if self.strategy not in _LOADED:
            strategy = resolve(self.strategy)
            self._check(strategy)
            _LOADED[self.strategy] = strategy
        return _LOADED[self.strategy]

    def names(self, obj: object) -> bool:
        """Whether `obj` is this entry's config or ask/tell class (a class by path: compared by
        its defining module and name, so that no other strategy is imported to tell)."""
        if obj is self.config or obj is self.strategy:
            return True
        return isinstance(obj, type) and f"{obj.__module__}:{obj.__qualname__}" == self.strategy

    def trains_on_driver(self, strategy: Any) -> bool:
        """Whether the loop builds a TrainingContext: gradient strategies, and refining ones
        whose config refines."""
        return self.kind.trains_on_driver or (self.refines and strategy.refines)

    def keeps_texts(self, strategy: Any) -> bool:
        """Whether evaluation returns the candidates' completions to `tell`."""
        return self.refines and strategy.keeps_texts

    def build(self, cfg: Any, run_seed: int) -> Any:
        strategy = self.strategy_class()
        if strategy is None:
            raise ConfigError(f"strategy={self.name}: runs as its own job, it has no ask/tell strategy")
        return strategy(cfg, run_seed)

    def analysis_hooks(self) -> Analysis:
        """The strategy's analysis hooks (no hooks: an empty Analysis)."""
        if isinstance(self.analysis, str):
            module, _, attribute = self.analysis.partition(":")
            return getattr(importlib.import_module(module), attribute)
        return self.analysis or NO_ANALYSIS

    def run_function(self) -> Callable[..., Any] | None:
        if self.runner is None:
            return None
        module, _, function = self.runner.partition(":")
        return getattr(importlib.import_module(module), function)


_REGISTRY: dict[str, StrategyEntry] = {}
_LOADED: dict[str, type] = {}  # classes named by path, once imported and checked
_ALIASES: dict[str, StrategyEntry] = {}  # import paths and entry-point names already resolved


@overload
def register_strategy(
    name: str, *, config: type, summary: str, kind: Kind[P], **fields: Any
) -> Callable[[type[P]], type[P]]: ...


@overload
def register_strategy(
    name: str, *, config: type, summary: str, **fields: Any
) -> Callable[[type[Strategy]], type[Strategy]]: ...


def register_strategy(name: str, *, config: type, summary: str, **fields: Any) -> Callable[[Any], Any]:
    """Decorator for an ask/tell class, typed by its kind's protocol; called as a statement when
    `runner` is given (kind JOB) or `strategy` names the class by import path."""
    if not dataclasses.is_dataclass(config) or "name" not in {f.name for f in dataclasses.fields(config)}:
        raise TypeError(f"strategy {name}: config must be a dataclass with a `name` field")

    def add(strategy: Any) -> Any:
        _REGISTRY[name] = StrategyEntry(name, config, summary, strategy=strategy, **fields)
        return strategy

    if fields.get("runner") is not None:
        fields.setdefault("kind", JOB)
        add(None)
    elif isinstance(fields.get("strategy"), str):
        add(fields.pop("strategy"))
    return add


def lazy_exports(module: str, names: tuple[str, ...]) -> Callable[[str], Any]:
    """A strategy folder's module `__getattr__`: `names` from its `module`, imported when first
    asked for (so that importing the folder, which registers it, imports no torch)."""

    def attribute(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module.rpartition('.')[0]!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return attribute


def strategy_names() -> list[str]:
    return sorted(_REGISTRY)


def entries() -> list[StrategyEntry]:
    return [_REGISTRY[n] for n in strategy_names()]


def _import_path(path: str) -> StrategyEntry:
    module, _, attr = path.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f'strategy.name="{path}": cannot import it ({error})') from None
    for entry in _REGISTRY.values():
        if entry.names(obj):
            return entry
    raise ConfigError(
        f'strategy.name="{path}": not a registered strategy; decorate it with @evora.strategies.register_strategy(...)'
    )


def _from_entry_points(name: str) -> StrategyEntry | None:
    for point in entry_points(group=ENTRY_POINT_GROUP, name=name):
        point.load()  # registers
        return _REGISTRY.get(name)
    return None


def get_strategy(name: str) -> StrategyEntry:
    """The entry for a registered name, an import path (module:attr) or an entry point."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in _ALIASES:
        return _ALIASES[name]
    entry = _import_path(name) if ":" in name else _from_entry_points(name)
    if entry is None:
        raise ConfigError(
            f"strategy={name}: unknown strategy; allowed: {', '.join(strategy_names())}, "
            "or strategy.name=<module>:<class>"
        )
    _ALIASES[name] = entry
    return entry
