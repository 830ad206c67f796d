"""Registers the schemas in Hydra's ConfigStore.

Every YAML option of a group starts with `defaults: [<schema>, _self_]`, so Hydra
type-checks it and rejects unknown keys while composing.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from evora.config import schema

# (group, stored name) -> schema dataclass
SCHEMAS: dict[tuple[str, str], type] = {
    ("model", "schema"): schema.ModelConfig,
    ("task", "schema"): schema.TaskConfig,
    ("strategy", "es_schema"): schema.ESConfig,
    ("strategy", "ga_schema"): schema.GAConfig,
    ("strategy", "pbt_schema"): schema.PBTConfig,
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
    store = ConfigStore.instance()
    store.store(name="run_schema", node=writable_schema(schema.RunConfig))
    for (group, name), cls in SCHEMAS.items():
        store.store(group=group, name=name, node=writable_schema(cls))
