"""The strategy registry: every strategy folder registers itself and has a config that
composes; a user's strategy is found by import path and composed like a built-in one."""

import dataclasses
import re
import sys
from pathlib import Path
from typing import Generic, Protocol

import pytest

from evora.errors import ConfigError
from evora.plan.compose import CONF_DIR, compose_run, group_options
from evora.strategies import entries, get_strategy, register_strategy, strategy_names
from evora.strategies.full_weights import FullWeightStrategy
from evora.strategies.protocol import (
    FULL_WEIGHT,
    GRADIENT,
    JOB,
    KINDS,
    POPULATION,
    PORTFOLIO,
    GradientStrategy,
    PortfolioStrategy,
    RefiningStrategy,
    Strategy,
)

STRATEGIES_DIR = Path(__file__).resolve().parents[2] / "evora" / "strategies"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_strategy_folder_is_registered_with_a_yaml_that_composes():
    folders = {p.name for p in STRATEGIES_DIR.iterdir() if (p / "__init__.py").is_file()}
    built_in = [e for e in entries() if e.config.__module__.startswith("evora.")]  # other tests may add a user's
    assert folders == {e.name for e in built_in} and folders <= set(strategy_names())
    for entry in built_in:
        assert (CONF_DIR / "strategy" / f"{entry.name}.yaml").is_file(), entry.name
        extra = ["task.selection_size=8"] if entry.name == "pbt" else []
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


# The members each kind's protocol declares (protocol.py, full_weights.py), read from the protocols.
def protocol_members(protocol: type) -> set[str]:
    return {
        name
        for klass in protocol.__mro__
        if klass not in (object, Protocol, Generic) and getattr(klass, "_is_protocol", False)
        for name in vars(klass)
        if not name.startswith("_")
    }


KIND_PROTOCOLS = {
    POPULATION: Strategy,
    PORTFOLIO: PortfolioStrategy,
    FULL_WEIGHT: FullWeightStrategy,
    GRADIENT: GradientStrategy,
}


def test_every_built_in_strategy_implements_the_protocol_of_its_declared_kind():
    built_in = [e for e in entries() if e.config.__module__.startswith("evora.")]
    assert {e.kind for e in built_in} == set(KINDS)
    for entry in built_in:
        if entry.kind == JOB:
            assert entry.runner is not None and entry.strategy is None
            continue
        wanted = protocol_members(KIND_PROTOCOLS[entry.kind]) | (
            protocol_members(RefiningStrategy) if entry.refines else set()
        )
        missing = {name for name in wanted if not hasattr(entry.strategy, name)}
        assert not missing, f"{entry.name} ({entry.kind}) lacks {missing}"


def test_a_kind_must_be_one_the_loop_knows_and_only_a_runner_makes_a_job():
    @dataclasses.dataclass(frozen=True)
    class OddConfig:
        name: str = "odd"

    with pytest.raises(TypeError, match="kind='swarm'"):
        register_strategy("odd", config=OddConfig, summary="odd", kind="swarm")(object)
    with pytest.raises(TypeError, match="only a runner"):
        register_strategy("odd", config=OddConfig, summary="odd", kind=JOB)(object)
    assert "odd" not in strategy_names()


PROBE = re.compile(r"(getattr|hasattr|callable\(getattr)\((self\.)?strategy(_cfg)?\b")


def test_nothing_probes_a_strategy_for_attributes():
    sources = Path(__file__).resolve().parents[2] / "evora"
    probes = [
        f"{path.relative_to(sources)}:{number}"
        for path in sorted(sources.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PROBE.search(line)
    ]
    assert probes == []
