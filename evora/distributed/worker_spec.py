"""What an engine worker is given: its engine's settings, the task, the run seed, the
adapter layout and the strategy's config (`WorkerSpec`), built from the run config; and the
helpers that build an engine's spec and tokenizer from it (also for PBT's trials and the
driver's gradient training)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from evora.config.schema import RunConfig, TaskConfig, vllm_lora_rank
from evora.distributed.units import largest_call
from evora.engines import EngineSpec, get_engine
from evora.lora.layout import AdapterLayout
from evora.strategies import get_strategy
from evora.tasks import Splits, Task, build_task

ADAPTER_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs, and no more: its engine, the task, and the strategy config
    that rebuilds candidates (None for evaluation-only pools)."""

    engine_name: str
    engine: EngineSpec
    task: TaskConfig
    seed: int  # the run seed: data splits and candidate noise derive from it
    layout: AdapterLayout
    adapter_dtype: str  # candidates are materialised in the engine's dtype
    adapter_dir: str
    run_tag: str  # names this run's tmpfs scratch folders
    strategy: Any = None
    # The task and its splits as the run plan resolved them; None: the worker builds them from `task`.
    resolved: tuple[Task, Splits] | None = None
    master_device: str = "cpu"  # where a full-weight strategy's fp32 master copies live (RunPlan.master_device)
    unit_timeout_s: float | None = None  # a unit's deadline (unit_deadline); None: none
    noise_device: str = "cpu"  # where LoRA noise is drawn (RunPlan.noise_device): the payload's tensors go there


def engine_spec(
    run: RunConfig,
    model_path: str,
    max_lora_rank: int | None = None,
    lora_target_modules: tuple[str, ...] | None = None,
) -> EngineSpec:
    """The spec of the run's engine: what every engine gets, then its registration's own (`spec`)."""
    hw, engine, task = run.hardware, run.engine, run.task
    base = EngineSpec(
        model=model_path,
        tokenizer=run.model.tokenizer,
        revision=run.model.revision,
        dtype=run.model.dtype,
        max_model_len=run.model.max_model_len,
        max_lora_rank=max_lora_rank or run.lora.rank,
        max_loras=engine.max_loras,
        max_cpu_loras=host_lora_slots(run),
        max_num_seqs=engine.max_num_seqs,
        max_batch=largest_call(engine.max_loras, task.prompts_per_generation, task.samples, task.eval_samples),
        cpu_threads=hw.cpu_threads_per_worker,
        seed=run.seed,
        trust_remote_code=run.model.trust_remote_code,
        device="cuda" if hw.gpus_per_worker > 0 else "cpu",
        ignore_eos=engine.ignore_eos,
        lora_target_modules=lora_target_modules,
    )
    return get_engine(engine.name).spec_for(base, engine, hw)


def host_lora_slots(run: RunConfig) -> int:
    """Adapters an engine keeps loaded on its host: a work unit's candidates. Under
    `engine.units=whole` a unit is a worker's share of the population: all of it, were that
    worker the last one left (beyond this, vLLM would evict and re-read adapters mid-call)."""
    engine = run.engine
    if engine.units == "whole":
        return max(engine.max_loras, get_strategy(run.strategy.name).kind.population(run.strategy))
    return engine.max_loras


def engine_rank(layout: AdapterLayout) -> int:
    return vllm_lora_rank(layout.rank)


def adapter_dtype(model_dtype: str, model_path: str) -> str:
    """The engine's dtype: candidates are materialised in it (fp32 master weights stay on the driver)."""
    if model_dtype == "auto":
        config_file = Path(model_path) / "config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        model_dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    return model_dtype if model_dtype in ADAPTER_DTYPES else "float32"


def vllm_target_modules(layout: AdapterLayout) -> tuple[str, ...]:
    """vLLM's `lora_target_modules` for a layout: its suffixes, and `experts` where it adapts a
    mixture's experts. vLLM wraps a mixture layer's routed experts as one module,
    `model.layers.N.mlp.experts` (its fused-MoE runner), and `is_in_target_modules` takes it
    only by that name: its packed parts are `experts.0.gate_proj`, ..., never `gate_proj`.
    (q/k/v_proj select `qkv_proj` and gate/up_proj a dense `gate_up_proj` through the model's
    packed mapping.) vLLM's expert LoRA carries gate, up and down of every expert at once."""
    targets = tuple(layout.target_modules)
    return (*targets, "experts") if layout.has_experts and "experts" not in targets else targets


def worker_spec(
    run: RunConfig,
    model_path: str,
    layout: AdapterLayout,
    run_tag: str,
    *,
    with_strategy: bool = True,
    max_lora_rank: int | None = None,
    resolved: tuple[Task, Splits] | None = None,
    master_device: str = "cpu",
    noise_device: str = "cpu",
) -> WorkerSpec:
    # The engine wraps the modules the layout targets (PBT: the union over its search space).
    engine = engine_spec(run, model_path, max_lora_rank, vllm_target_modules(layout))
    return WorkerSpec(
        run.engine.name,
        engine,
        run.task,
        run.seed,
        layout,
        adapter_dtype(run.model.dtype, model_path),
        run.engine.adapter_dir,
        run_tag,
        run.strategy if with_strategy else None,
        resolved,
        master_device,
        unit_deadline(run),
        noise_device,
    )


# The default unit deadline: a fixed allowance (a unit's adapters, prefill, a group's noise sums,
# a first call's warm-up) and every decoding step at 1 token/s, far below any engine's pace.
UNIT_ALLOWANCE_S = 600.0
FLOOR_TOKENS_PER_S = 1.0


def unit_deadline(run: RunConfig) -> float:
    """Seconds a worker may spend on one unit before it is taken for hung (engine.unit_timeout_s)."""
    if run.engine.unit_timeout_s is not None:
        return run.engine.unit_timeout_s
    return UNIT_ALLOWANCE_S + run.task.max_tokens / FLOOR_TOKENS_PER_S


def resolve_task(cfg: TaskConfig, seed: int) -> tuple[Task, Splits]:
    task = build_task(cfg, seed)
    return task, task.splits()


def load_tokenizer(spec: EngineSpec) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        spec.tokenizer or spec.model, revision=spec.revision, trust_remote_code=spec.trust_remote_code
    )
