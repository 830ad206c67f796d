"""Engines behind one protocol, chosen by name; an engine's module (and vLLM) is
imported only when that engine is created."""

from __future__ import annotations

from importlib import import_module

from evora.engines.base import AdapterRef, Completion, Engine, EngineSpec, Sampling
from evora.engines.deferred_imports import defer_sklearn

ENGINES = {
    "vllm": "evora.engines.vllm_engine:VLLMEngine",
    "hf": "evora.engines.hf_engine:HFEngine",
}


def create_engine(name: str, spec: EngineSpec) -> Engine:
    defer_sklearn()
    module, _, cls = ENGINES[name].partition(":")
    return getattr(import_module(module), cls)(spec)


__all__ = ["AdapterRef", "Completion", "Engine", "EngineSpec", "ENGINES", "Sampling", "create_engine"]
