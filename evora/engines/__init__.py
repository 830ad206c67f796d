"""Engines behind one protocol, each declared in `catalog/` (`registry.register_engine`) and
chosen by name; an engine's module (and vLLM) is imported only when that engine is created."""

from __future__ import annotations

import importlib
import pkgutil

from evora.engines import catalog
from evora.engines.base import AdapterRef, Completion, Engine, EngineSpec, Sampling
from evora.engines.deferred_imports import defer_sklearn
from evora.engines.registry import EngineEntry, engine_names, get_engine, register_engine

for _module in pkgutil.iter_modules(catalog.__path__):
    importlib.import_module(f"{catalog.__name__}.{_module.name}")


def create_engine(name: str, spec: EngineSpec) -> Engine:
    defer_sklearn()
    return get_engine(name).create(spec)


__all__ = [
    "AdapterRef",
    "Completion",
    "Engine",
    "EngineEntry",
    "EngineSpec",
    "Sampling",
    "create_engine",
    "engine_names",
    "get_engine",
    "register_engine",
]
