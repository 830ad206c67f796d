"""engine=vllm's own keys (`VLLMEngineConfig`, composed as engine/vllm_schema) and spec
(`VLLMSpec`): what vLLM's `LLM` and its process's environment are built from, beside what every
engine gets. Light: imported by the catalog and the planner, never importing vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from evora.config.schema import EngineConfig, HardwareConfig
from evora.engines.base import EngineSpec


@dataclass(frozen=True)
class VLLMEngineConfig(EngineConfig):
    enforce_eager: Optional[bool] = None  # None: eager on CPUs, CUDA graphs (and torch.compile) on GPUs
    adapters_in_memory: bool = True  # vLLM in-process: candidates reach the engine as tensors, not files
    vllm_args: dict[str, Any] = field(default_factory=dict)  # extra vllm.LLM keyword arguments (they win)


@dataclass(frozen=True)
class VLLMSpec(EngineSpec):
    enforce_eager: bool = True
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.05
    kv_cache_gib: int = 1
    adapters_in_memory: bool = True  # candidates as tensors, not files, where the engine can
    vllm_args: dict[str, Any] = field(default_factory=dict)


def vllm_spec(base: EngineSpec, engine: VLLMEngineConfig, hardware: HardwareConfig) -> VLLMSpec:
    """The vLLM spec of a run: `base` (what every engine gets), its engine keys and its hardware."""
    eager = base.device == "cpu" if engine.enforce_eager is None else engine.enforce_eager
    return VLLMSpec(
        **vars(base),
        enforce_eager=eager,
        tensor_parallel_size=hardware.tensor_parallel_size,
        gpu_memory_utilization=hardware.gpu_memory_utilization,
        kv_cache_gib=hardware.kv_cache_gib,
        adapters_in_memory=engine.adapters_in_memory,
        vllm_args=dict(engine.vllm_args),
    )
