"""Registers the schemas in Hydra's ConfigStore.

Every YAML option of a group starts with `defaults: [<schema>, _self_]`, so Hydra
type-checks it and rejects unknown keys while composing.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from evora.config import schema
from evora.engines import engine_names, get_engine
from evora.strategies import entries
from evora.tasks import registry as tasks

# (group, stored name) -> schema dataclass; each strategy's, task's and engine's come from their registries.
SCHEMAS: dict[tuple[str, str], type] = {
    ("model", "schema"): schema.ModelConfig,
    ("task", "schema"): schema.TaskConfig,
    ("engine", "schema"): schema.EngineConfig,
    ("hardware", "schema"): schema.HardwareConfig,
    ("tracking", "schema"): schema.TrackingConfig,
}


def writable_schema(cls: type) -> DictConfig:
    # Frozen dataclasses become read-only nodes (nested ones too), which Hydra cannot
    # merge YAML into; the typed nodes stay typed once made writable.
    return unfreeze(OmegaConf.structured(cls))


def unfreeze(node: DictConfig) -> DictConfig:
    """The same node, writable all the way down."""
    OmegaConf.set_readonly(node, False)
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            unfreeze(child)
    return node


def register() -> None:
    """Every schema, each stored once per process unless its class changed (a half second per
    compose otherwise: Hydra deep-copies what it loads, so a stored node is never mutated)."""
    _store(None, "run_schema", schema.RunConfig)
    for (group, name), cls in SCHEMAS.items():
        _store(group, name, cls)
    for entry in entries():
        _store("strategy", f"{entry.name}_schema", entry.config)
    for task in tasks.entries():
        _store("task", f"{task.name}_schema", task.config)
    for name in engine_names():
        _store("engine", f"{name}_schema", get_engine(name).config)


# (group, name) -> the class whose schema is stored there, by this module
_STORED: dict[tuple[str | None, str], type] = {}


def _store(group: str | None, name: str, cls: type) -> None:
    store = ConfigStore.instance()
    folder = store.repo
    for part in group.split("/") if group else ():
        folder = folder.get(part, {})
    if _STORED.get((group, name)) is cls and f"{name}.yaml" in folder:
        return
    store.store(group=group, name=name, node=writable_schema(cls))
    _STORED[(group, name)] = cls


def register_option(group: str, option: str, config: type, name: str) -> None:
    """`<group>=<option>` for a strategy or task with no YAML of its own (a user's, named by
    import path or entry point): its config's defaults, with `name` set to how it was
    named, so a saved config.yaml finds it again on resume."""
    node = writable_schema(config)
    node.name = name
    ConfigStore.instance().store(group=group, name=option, node=node)
