"""The environment variables an engine's process needs (its registration's `environment`): worker actors get them
through Ray's `runtime_env`, so that library code never writes a process's `os.environ`."""

from __future__ import annotations

import os
from typing import Mapping

from evora.engines.base import EngineSpec
from evora.engines.vllm_spec import VLLMSpec

ONEDNN_CACHE_CAPACITY = "128"


def vllm_environment(spec: VLLMSpec, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment the process of an evora engine gives vLLM (what vLLM reads from the
    environment only, or reads there first). Worker actors get it through Ray's `runtime_env`;
    a process that starts engines itself (the bench, the tests) sets it before the first.

    - one process per engine (no engine-core process): a request object then reaches the
      model runner, so adapters may travel as tensors; a user's own setting is kept;
    - vLLM's log at warnings unless the user asks for more;
    - vLLM's V1 model runner on every device, whatever the user's environment says: where Triton
      is installed (GPUs) vLLM 0.32 would pick Model Runner V2, whose LoRA requests, weight
      lookup and sampler (a Triton Gumbel kernel seeded by position, not a torch.Generator)
      evora was not written for; the CPU build has no Triton and runs V1, so every device
      runs the runner the suite exercises, and the engines' token-for-token sampling holds;
    - CPU: no thread binding, since evora sets each worker's thread count
      (hardware.cpu_threads_per_worker) and several engines on one machine must not all
      bind the same cores; the KV cache of hardware.kv_cache_gib (vLLM lets this variable
      override its engine argument, and evora's CPU image sets a default); oneDNN's
      process-wide primitive cache held to ONEDNN_CACHE_CAPACITY entries unless the user sets
      it: vLLM's CPU GEMMs keep their own cache per layer, and oneDNN's (1,024 primitives by
      default, one per matrix shape and token count) grew a worker by ~140 MiB over 60
      generations of the ecology's units of varying size (bench/soak.py; flat at 128, no slower).
    """
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
        "VLLM_LOGGING_LEVEL": environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        "VLLM_USE_V2_MODEL_RUNNER": "0",
    }
    if spec.device == "cpu":
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_gib)
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE_CAPACITY)
    return env


def engine_environment(name: str, spec: EngineSpec) -> dict[str, str]:
    """What the process hosting engine `name` must have in its environment (its registration's)."""
    from evora.engines.registry import get_engine

    return get_engine(name).environment(spec)
