"""The strategy registry: every strategy folder registers itself and has a config that
composes; a user's strategy is found by import path and composed like a built-in one."""

import dataclasses
import sys
from pathlib import Path

import pytest

from evora.config.compose import CONF_DIR, compose_run, group_options
from evora.errors import ConfigError
from evora.strategies import entries, get_strategy, register_strategy, strategy_names

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
    assert message.startswith("strategy=nope: unknown strategy; allowed: ecology, eggroll, es, ga, ")
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
