"""The strategy registry: every strategy folder registers itself and has a config that
composes; a user's strategy is found by import path and composed like a built-in one."""

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from conftest import MERGE_SOURCES
from evora.errors import ConfigError
from evora.plan.compose import CONF_DIR, compose_run, group_options
from evora.strategies import entries, get_strategy, register_strategy, strategy_names
from evora.strategies.kinds import FULL_WEIGHT, JOB, KINDS, POPULATION, Kind, missing_members

STRATEGIES_DIR = Path(__file__).resolve().parents[2] / "evora" / "strategies"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_strategy_folder_is_registered_with_a_yaml_that_composes():
    folders = {p.name for p in STRATEGIES_DIR.iterdir() if (p / "__init__.py").is_file()}
    built_in = [e for e in entries() if e.config.__module__.startswith("evora.")]  # other tests may add a user's
    assert folders == {e.name for e in built_in} and folders <= set(strategy_names())
    for entry in built_in:
        assert (CONF_DIR / "strategy" / f"{entry.name}.yaml").is_file(), entry.name
        extra = {"pbt": ["task.selection_size=8"], "merge": list(MERGE_SOURCES)}.get(entry.name, [])
        run = compose_run([f"strategy={entry.name}", *extra])
        assert isinstance(run.strategy, entry.config) and run.strategy.name == entry.name
        assert (entry.strategy is None) != (entry.runner is None), entry.name  # ask/tell, or a job runner
        assert entry.summary and entry.name in group_options("strategy")


def test_an_unknown_strategy_is_one_line_naming_the_options():
    with pytest.raises(ConfigError) as error:
        get_strategy("nope")
    message = str(error.value)
    assert message.startswith("strategy=nope: unknown strategy; allowed: ecology, eggroll, es, es_full, ga, ")
    assert "\n" not in message
    assert "pbt" in message and ":" not in message.split("allowed:")[1].split(", or")[0]  # names, not import paths
    with pytest.raises(ConfigError, match="cannot import it"):
        get_strategy("nopkg.nothere:Nothing")
    with pytest.raises(ConfigError, match="not a registered strategy"):
        get_strategy("evora.strategies.registry:StrategyEntry")


def test_a_config_needs_a_name_field():
    @dataclasses.dataclass(frozen=True)
    class Nameless:
        population: int = 2

    with pytest.raises(TypeError, match="name"):
        register_strategy("nameless", config=Nameless, summary="-")


@pytest.fixture
def examples_on_path(monkeypatch):
    """examples/ importable for one test; the registry forgets what the test registered."""
    from evora.strategies import registry

    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_ALIASES", dict(registry._ALIASES))
    yield
    sys.modules.pop("mypkg.strategies", None)


def test_a_user_strategy_composes_by_import_path_like_a_built_in(examples_on_path):
    run = compose_run(["strategy.name=mypkg.strategies:RandomSearch", "strategy.scale=0.05"])
    assert type(run.strategy).__name__ == "RandomSearchConfig"
    assert run.strategy.name == "mypkg.strategies:RandomSearch" and run.strategy.scale == 0.05
    assert get_strategy(run.strategy.name).name == "random_search"
    with pytest.raises(ConfigError) as error:
        compose_run(["strategy.name=mypkg.strategies:RandomSearch", "strategy.scale=-1"])
    assert str(error.value) == "strategy.scale=-1.0: must be > 0"
    with pytest.raises(ConfigError, match="strategy.sigma: unknown key"):
        compose_run(["strategy.name=mypkg.strategies:RandomSearch", "strategy.sigma=0.1"])


def test_every_built_in_strategy_implements_the_protocol_of_its_declared_kind():
    """Registration checks it at import (kinds.Kind.check), or at first use for a class named by
    path (every built-in); here, the check itself against each built-in, and each kind is used."""
    built_in = [e for e in entries() if e.config.__module__.startswith("evora.")]
    assert {e.kind.name for e in built_in} == {k.name for k in KINDS}
    for entry in built_in:
        assert (entry.kind.protocol is None) == (entry.runner is not None), entry.name
        if entry.kind.protocol is not None:
            assert missing_members(entry.strategy_class(), entry.kind.protocol) == [], entry.name


@dataclasses.dataclass(frozen=True)
class OddConfig:
    name: str = "odd"
    population: int = 2


class Half:
    """Half a population strategy: ask and tell, no initial_state, materialise or center."""

    state_type = dict

    def ask(self, state, generation): ...

    def tell(self, state, specs, results): ...


def test_registration_checks_the_kind_its_protocol_fields_and_traits():
    with pytest.raises(TypeError, match="only a runner"):
        register_strategy("odd", config=OddConfig, summary="odd", kind=JOB)(object)
    with pytest.raises(TypeError) as error:
        register_strategy("odd", config=OddConfig, summary="odd")(Half)  # type: ignore[arg-type]  # the point
    assert str(error.value) == "strategy odd: Strategy needs center, initial_state, materialise"
    with pytest.raises(TypeError, match="FullWeightStrategy needs .*master_bytes"):
        register_strategy("odd", config=OddConfig, summary="odd", kind=FULL_WEIGHT)(get_strategy("es").strategy_class())
    with pytest.raises(TypeError, match="in_place=True is not for kind='population'"):
        register_strategy("odd", config=OddConfig, summary="odd", in_place=True)(get_strategy("es").strategy_class())

    @dataclasses.dataclass(frozen=True)
    class NoPopulation:
        name: str = "odd"

    with pytest.raises(TypeError, match="kind='population' needs a config with a `population` field"):
        register_strategy("odd", config=NoPopulation, summary="odd")(get_strategy("es").strategy_class())
    assert "odd" not in strategy_names()


def test_a_strategy_named_by_path_is_imported_and_checked_when_first_used(examples_on_path):
    """What every built-in does (its registration imports no torch): the class is imported, and
    held to its kind's protocol, when a run first builds it; an import path finds its entry."""
    register_strategy("half", config=OddConfig, summary="half", strategy=f"{__name__}:Half")
    entry = get_strategy("half")
    assert entry.strategy == f"{__name__}:Half" and get_strategy(f"{__name__}:Half") is entry
    with pytest.raises(TypeError, match="strategy half: Strategy needs center, initial_state, materialise"):
        entry.build(OddConfig(), 0)
    es = get_strategy("es")
    assert es.strategy == "evora.strategies.es.strategy:EvolutionStrategy"
    assert get_strategy("evora.strategies.es:EvolutionStrategy") is es  # the folder's lazy export
    assert es.strategy_class() is sys.modules["evora.strategies.es.strategy"].EvolutionStrategy
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        import evora.strategies.es as folder

        folder.Nope  # noqa: B018  # the lazy exports name only their own


def test_a_kind_answers_for_its_configs_and_its_memory():
    es, eggroll, sft = (get_strategy(name) for name in ("es", "eggroll", "sft"))
    assert es.kind is POPULATION and isinstance(es.kind, Kind)
    assert es.kind.population(es.config(population=12)) == 12 and sft.kind.population(sft.config()) == 0
    assert sft.kind.steps_per_generation(sft.config(steps_per_generation=7)) == 7
    assert es.kind.steps_per_generation(es.config()) == 1
    assert eggroll.kind.moves_weights and not es.kind.moves_weights and sft.kind.trains_on_driver


# A getattr/hasattr on a strategy, its config, a spec, a payload or a state, anywhere under evora/;
# under evora/strategies/ any getattr/hasattr but a module's attribute by name and TRL's trainer.
PROBE = re.compile(
    r"(getattr|hasattr)\((self\.)?(strategy|strategy_cfg|cfg|spec|payload|state|run\.strategy|run_cfg\.strategy)\b"
)
ANY_PROBE = re.compile(r"(getattr|hasattr)\((?!importlib|import_module|module\b|trainer\b)")


def test_nothing_probes_a_strategy_its_config_specs_or_payloads():
    sources = Path(__file__).resolve().parents[2] / "evora"
    probes = [
        f"{path.relative_to(sources)}:{number}: {line.strip()}"
        for path in sorted(sources.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PROBE.search(line) or (path.is_relative_to(sources / "strategies") and ANY_PROBE.search(line))
    ]
    assert probes == []
