"""Whether a run fits its device: one worker's memory estimate (evora/models/memory.py) held
against a GPU's memory or this host's RAM, checked before Ray and shown by `evora doctor`."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from evora.config.checks import fail
from evora.config.schema import RunConfig, vllm_lora_rank
from evora.engines.registry import get_engine
from evora.models.memory import GIB, estimate
from evora.strategies import get_strategy


def plan_memory(run: RunConfig, modules: Any, layout: Any) -> Any:
    """One worker's memory estimate for the run (evora/models/memory.py)."""
    entry = get_strategy(run.strategy.name)

    @functools.cache  # the kind asks for it twice (rank and master copies), and builds it only if it needs it
    def build() -> Any:
        return entry.build(run.strategy, run.seed)

    return estimate(
        parameters=modules.parameters,
        facts=modules.facts,
        layout=layout,
        dtype=run.model.dtype,
        max_lora_rank=vllm_lora_rank(entry.kind.candidates(build, layout).rank),
        max_loras=run.engine.max_loras,
        max_num_seqs=run.engine.max_num_seqs,
        max_model_len=run.model.max_model_len,
        tensor_parallel_size=max(1, run.hardware.tensor_parallel_size),  # its range is checked later
        master_bytes=entry.kind.master_bytes(build, layout),
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
    left = get_engine(run.engine.name).memory.gpu_left(memory, run.hardware.gpu_memory_utilization, total)
    return "cuda" if memory.master + MASTER_MARGIN <= left else "cpu"


def memory_need(run: RunConfig, memory: Any) -> tuple[int, int]:
    """(bytes needed, bytes available) on the device the check compares with; 0 available: unknown."""
    _, total = device_memory(run)
    hardware, model = run.hardware, get_engine(run.engine.name).memory
    if hardware.gpus_per_worker > 0:
        return model.gpu_need(memory, hardware.gpu_memory_utilization, total or 0)
    workers = hardware.num_workers or 1
    kv = model.host_cache(hardware.kv_cache_gib)
    return workers * (memory.weights + memory.lora_slots + kv + memory.master), total or 0


# What a GPU run holds on its node's host besides the master copies, by Ray's and vLLM's defaults.
OBJECT_STORE_SHARE = 0.3  # Ray's object store: 30% of a node's RAM unless told otherwise
ENGINE_HOST_BYTES = 4 * GIB  # an engine process's own host memory (the Python process, CUDA's host side, tokenizer)
NODE_GPUS = 8  # doctor's assumption where neither this host nor hardware.gpus_per_node says


@dataclass(frozen=True)
class HostNeed:
    """One GPU node's host memory: its workers' shares beside Ray's object store."""

    workers: int  # on one node
    per_worker: dict[str, int]  # what each worker holds on the host, by part
    object_store: int
    total: int  # the node's RAM (0: unknown)

    @property
    def need(self) -> int:
        return self.workers * sum(self.per_worker.values()) + self.object_store


def host_need(run: RunConfig, memory: Any) -> HostNeed:
    """A GPU run's host memory on one node: each worker's master copies when they are on the
    host, with a second copy while a snapshot is restored into them, the base weights a KL
    measurement keeps, and its engine process; and Ray's object store."""
    import psutil

    hardware = run.hardware
    total = (
        int(hardware.host_memory_gib * GIB) if hardware.host_memory_gib is not None else psutil.virtual_memory().total
    )
    gpus = hardware.gpus_per_node or _local_gpus() or NODE_GPUS
    per_node = max(1, gpus // max(1, hardware.gpus_per_worker * max(1, hardware.tensor_parallel_size)))
    workers = min(hardware.num_workers or per_node, per_node)
    parts = {"engine process": ENGINE_HOST_BYTES}
    if memory.master and master_device(run, memory) == "cpu":
        parts["master copies"] = memory.master
        parts["a snapshot being restored"] = memory.master
    if memory.master:
        parts["the base weights KL keeps"] = memory.weights
    return HostNeed(workers, parts, int(OBJECT_STORE_SHARE * total), total)


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_fits(run: RunConfig, memory: Any) -> None:
    if run.hardware.gpus_per_worker > 0 and memory.master and (run.hardware.gpus_per_node or _local_gpus()):
        check_host(run, memory)  # where a node is known: its GPUs stated, or this host's
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


def check_host(run: RunConfig, memory: Any) -> None:
    """A full-weight GPU run's workers fit their node's RAM, or one line naming what to change:
    else each worker is killed for memory, and its replacements die the same way. (A LoRA run's
    workers hold little on the host beside their engine process.)"""
    host = host_need(run, memory)
    if not host.total or host.need <= host.total:
        return
    parts = ", ".join(f"{name} {size / GIB:.1f}" for name, size in host.per_worker.items())
    on_host = "master copies" in host.per_worker
    key, value = (
        ("hardware.master_weights", run.hardware.master_weights)
        if on_host
        else ("hardware.num_workers", run.hardware.num_workers)
    )
    raise fail(
        key,
        value,
        f"{host.workers} workers on a node need {host.need / GIB:.0f} GiB of host memory ({parts} GiB each, and "
        f"Ray's object store {host.object_store / GIB:.0f}) and a node has {host.total / GIB:.0f} GiB "
        "(hardware.host_memory_gib); put the master copies on the GPUs (hardware.master_weights=device, with a lower "
        "hardware.gpu_memory_utilization), use fewer workers a node, or raise hardware.tensor_parallel_size",
    )
