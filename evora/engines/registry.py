"""The engine registry: the one place planning, `evora doctor` and the jobs learn what engines exist.

An engine declares itself in a module of `engines/catalog/` (imported by `evora.engines`, so it
must not import its engine's heavy dependencies) and its `conf/engine/<name>.yaml`:

    register_engine(
        "hf",
        engine="evora.engines.hf_engine:HFEngine",   # imported only when a worker creates one
        summary="transformers + PEFT",
        memory=RESIDENT,                              # how it holds a GPU (memory models below)
        lm_eval_backend="hf",
    )

Everything else asks the entry: which models it runs LoRA on (`support`) and which strategy
kinds (`kinds`), its own config keys (`config`, composed as engine/<name>_schema) and the spec
it is built from (`spec`), what its process's environment needs, which package must be
installed, whether it shards a model over GPUs, how its GPU memory is budgeted, and lm-eval's
backend for its exports.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from evora.config.schema import EngineConfig, HardwareConfig
from evora.engines.base import Engine, EngineSpec
from evora.errors import ConfigError
from evora.lora.modules import ModelModules
from evora.strategies.kinds import KINDS

GIB = 1 << 30


@dataclass(frozen=True)
class Support:
    engine: str
    runs: bool
    why: str = ""  # what stops it, when it does not run


class MemoryModel(Protocol):
    """How an engine holds a GPU, against one worker's memory estimate (models/memory.py)."""

    pooled: bool  # it takes hardware.gpu_memory_utilization of the GPU up front (lowering it makes room)

    def gpu_need(self, memory: Any, utilization: float, total: int) -> tuple[int, int]:
        """(bytes it needs, bytes it may use) on one GPU of `total` bytes."""

    def gpu_left(self, memory: Any, utilization: float, total: int) -> int:
        """What it leaves of the GPU beside itself (where master copies may go)."""

    def host_cache(self, kv_cache_gib: float) -> int:
        """Bytes of KV cache it keeps in host memory when it runs on CPUs."""


@dataclass(frozen=True)
class PooledMemory:
    """A share of the GPU taken at start (vLLM's gpu_memory_utilization), its KV cache inside it;
    on CPUs a KV cache of hardware.kv_cache_gib in host memory."""

    pooled: bool = True

    def gpu_need(self, memory: Any, utilization: float, total: int) -> tuple[int, int]:
        return memory.to_start(), int(utilization * total)

    def gpu_left(self, memory: Any, utilization: float, total: int) -> int:
        return int(total * (1 - utilization))

    def host_cache(self, kv_cache_gib: float) -> int:
        return int(kv_cache_gib * GIB)


@dataclass(frozen=True)
class ResidentMemory:
    """The weights and LoRA slots resident, activations as they come (transformers)."""

    pooled: bool = False

    def gpu_need(self, memory: Any, utilization: float, total: int) -> tuple[int, int]:
        return memory.weights + memory.lora_slots, total

    def gpu_left(self, memory: Any, utilization: float, total: int) -> int:
        return total - memory.weights - memory.lora_slots

    def host_cache(self, kv_cache_gib: float) -> int:
        return 0


POOLED, RESIDENT = PooledMemory(), ResidentMemory()


def no_environment(spec: EngineSpec) -> dict[str, str]:
    return {}


def common_spec(base: EngineSpec, engine: EngineConfig, hardware: HardwareConfig) -> EngineSpec:
    return base


@dataclass(frozen=True)
class EngineEntry:
    name: str
    engine: str  # "module:Class" implementing engines.base.Engine, built as Class(spec)
    summary: str  # one line for `evora doctor` and the docs
    memory: MemoryModel
    lm_eval_backend: str  # lm-eval's model type that evaluates its exports (`evora eval benchmarks=`)
    support: Callable[[ModelModules, str], Support] | None = None  # (model, device) -> whether it runs LoRA on it
    package: str | None = None  # what must be importable to run it
    install: str = ""  # how to install that package
    tensor_parallel: bool = False  # shards a model over several GPUs (hardware.tensor_parallel_size > 1)
    config: type[EngineConfig] = EngineConfig  # its keys: EngineConfig's and its own
    # (what every engine gets, its engine config, the hardware) -> the spec its class is built from
    spec: Callable[[EngineSpec, Any, HardwareConfig], EngineSpec] = common_spec
    environment: Callable[[Any], dict[str, str]] = no_environment  # (its spec) -> its process's environment
    kinds: frozenset[str] | None = None  # the strategy kinds it runs (strategies.kinds); None: every kind

    def supports(self, model: ModelModules, device: str) -> Support:
        return self.support(model, device) if self.support is not None else Support(self.name, True)

    def spec_for(self, base: EngineSpec, engine: EngineConfig, hardware: HardwareConfig) -> EngineSpec:
        if not isinstance(engine, self.config):
            raise ConfigError(
                f"engine.name={engine.name}: its config is a {type(engine).__name__}, the engine needs a "
                f"{self.config.__name__}; choose it with engine={self.name}"
            )
        return self.spec(base, engine, hardware)

    def create(self, spec: EngineSpec) -> Engine:
        module, _, cls = self.engine.partition(":")
        engine: Engine = vars(importlib.import_module(module))[cls](spec)
        return engine


_REGISTRY: dict[str, EngineEntry] = {}


def register_engine(name: str, **fields: Any) -> EngineEntry:
    entry = EngineEntry(name, **fields)
    if not (isinstance(entry.config, type) and issubclass(entry.config, EngineConfig)):
        raise TypeError(f"engine {name}: config must be a dataclass extending evora.config.schema.EngineConfig")
    unknown = sorted(set(entry.kinds or ()) - {kind.name for kind in KINDS})
    if unknown:
        raise TypeError(f"engine {name}: kinds {', '.join(unknown)} are none of {', '.join(k.name for k in KINDS)}")
    _REGISTRY[name] = entry
    return entry


def engine_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)  # in registration order: the catalog's, then a user's


def get_engine(name: str) -> EngineEntry:
    if name not in _REGISTRY:
        raise ConfigError(f"engine.name={name}: unknown engine; allowed: {', '.join(engine_names())}")
    return _REGISTRY[name]
