"""Whether a run fits its device: one worker's memory estimate (evora/models/memory.py) held
against a GPU's memory or this host's RAM, checked before Ray and shown by `evora doctor`."""

from __future__ import annotations

from typing import Any

from evora.config.schema import RunConfig, vllm_lora_rank
from evora.models.memory import GIB, estimate
from evora.strategies import get_strategy
from evora.strategies.checks import fail
from evora.strategies.protocol import FULL_WEIGHT


def plan_memory(run: RunConfig, modules: Any, layout: Any) -> Any:
    """One worker's memory estimate for the run (evora/models/memory.py)."""
    entry = get_strategy(run.strategy.name)
    moves = entry.kind == FULL_WEIGHT
    strategy = entry.build(run.strategy, run.seed) if moves else None
    rank = strategy.perturbation_rank if strategy is not None else layout.rank
    return estimate(
        parameters=modules.parameters,
        config=modules.config,
        layout=layout,
        dtype=run.model.dtype,
        max_lora_rank=vllm_lora_rank(rank),
        max_loras=run.engine.max_loras,
        max_num_seqs=run.engine.max_num_seqs,
        max_model_len=run.model.max_model_len,
        tensor_parallel_size=max(1, run.hardware.tensor_parallel_size),  # its range is checked later
        master_bytes=strategy.master_bytes(layout) if strategy is not None else 0,
    )


def device_memory(run: RunConfig) -> tuple[str, int | None]:
    """(what, bytes) the estimate is held against: one GPU, or this host's RAM for CPU workers."""
    import psutil

    hardware = run.hardware
    if hardware.gpus_per_worker == 0:
        return "this host's RAM", psutil.virtual_memory().total
    if hardware.gpu_memory_gib is not None:
        return "one GPU (hardware.gpu_memory_gib)", int(hardware.gpu_memory_gib * GIB)
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory
    return "one GPU (none here: set hardware.gpu_memory_gib to check)", None


# What the GPU must keep free beside the engine's share and the master copies: the CUDA context,
# activations outside vLLM's pool, one matrix's update step and the fingerprint's blocks.
MASTER_MARGIN = 2 * GIB


def master_device(run: RunConfig, memory: Any) -> str:
    """Where a full-weight strategy's fp32 master copies live on each worker: `cuda`, beside the
    engine, when they fit in what it leaves of the GPU (vLLM: 1 - hardware.gpu_memory_utilization;
    transformers: the GPU less its weights and LoRA slots), with MASTER_MARGIN to spare; else
    `cpu` (the host). Their noise is drawn where they are (lora/noise.py): `device` and `host`
    choose, for runs that must draw as others did."""
    place = run.hardware.master_weights
    if memory.master == 0 or run.hardware.gpus_per_worker == 0 or place == "host":
        return "cpu"
    if place == "device":
        return "cuda"
    _, total = device_memory(run)
    if total is None:
        return "cpu"  # no GPU here and no hardware.gpu_memory_gib: the safe place
    if run.engine.name == "vllm":
        left = total * (1 - run.hardware.gpu_memory_utilization)
    else:
        left = total - memory.weights - memory.lora_slots
    return "cuda" if memory.master + MASTER_MARGIN <= left else "cpu"


def memory_need(run: RunConfig, memory: Any) -> tuple[int, int]:
    """(bytes needed, bytes available) on the device the check compares with; 0 available: unknown."""
    _, total = device_memory(run)
    hardware, vllm = run.hardware, run.engine.name == "vllm"
    if hardware.gpus_per_worker > 0:
        need = memory.to_start() if vllm else memory.weights + memory.lora_slots
        return need, int((hardware.gpu_memory_utilization if vllm else 1.0) * (total or 0))
    workers = hardware.num_workers or 1
    kv = hardware.kv_cache_gib * GIB if vllm else 0
    return workers * (memory.weights + memory.lora_slots + kv + memory.master), total or 0


def check_fits(run: RunConfig, memory: Any) -> None:
    need, budget = memory_need(run, memory)
    if not budget or need <= budget:
        return
    parts = f"weights {memory.weights / GIB:.2f}, LoRA slots {memory.lora_slots / GIB:.2f}"
    if run.hardware.gpus_per_worker > 0:
        raise fail(
            "engine.max_loras",
            run.engine.max_loras,
            f"a worker needs {need / GIB:.1f} GiB to start ({parts}, one {run.model.max_model_len}-token sequence "
            f"{memory.kv_per_sequence / GIB:.2f}) but has {budget / GIB:.1f} GiB (hardware.gpu_memory_utilization of "
            "its GPU); lower engine.max_loras or model.max_model_len, or raise hardware.tensor_parallel_size",
        )
    raise fail(
        "hardware.num_workers",
        run.hardware.num_workers,
        f"the workers need {need / GIB:.1f} GiB ({parts}, KV cache and master copies per worker) and this host "
        f"has {budget / GIB:.1f} GiB; lower hardware.num_workers, engine.max_loras or hardware.kv_cache_gib, "
        "or use model.dtype=bfloat16",
    )
