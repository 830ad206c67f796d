"""`evora eval`: one adapter (or the base model) on a split, optionally against the base
model, on a worker pool of its own; the same comparison every run's finish writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evora.config.schema import RunConfig
from evora.distributed.evaluate import evaluate_split
from evora.distributed.finish import report_against_base
from evora.distributed.pool import WorkerPool
from evora.distributed.ray_session import init_ray
from evora.distributed.worker import worker_spec
from evora.engines.adapter_store import sweep_run_scratch
from evora.lora.layout import build_layout, linear_shapes_of_model
from evora.lora.peft_io import layout_of_adapter, load_adapter_tensors
from evora.models import locate_model
from evora.tasks import build_task
from evora.tracking.run_dir import run_tag


def run_evaluation(run: RunConfig, adapter: str | None, compare: bool, split: str, out_dir: str) -> dict[str, Any]:
    """Writes <out_dir>/{compare,eval}.{md,json}; returns the report."""
    location = locate_model(run.model.path)
    shapes = linear_shapes_of_model(
        location.path, revision=run.model.revision, trust_remote_code=run.model.trust_remote_code
    )
    if adapter is not None:
        layout, theta = layout_of_adapter(adapter, shapes), load_adapter_tensors(adapter)
    else:
        layout, theta = (
            build_layout(
                shapes,
                rank=run.lora.rank,
                alpha=run.lora.alpha,
                target_modules=run.lora.target_modules,
                layers=run.lora.layers,
                base_model=location.path,
            ),
            None,
        )
    examples = build_task(run.task, run.seed).splits().get(split)
    init_ray(run)
    tag = run_tag(out_dir)
    spec = worker_spec(run, location.path, layout, tag, with_strategy=False, max_lora_rank=layout.rank)
    pool = WorkerPool.start(spec, run.hardware)
    try:
        return report_against_base(
            lambda theta_, layout_, ops: evaluate_split(
                pool, theta_, ops, split, len(examples), keep_texts=True, perplexity=True
            ),
            theta,
            None,
            examples,
            task=run.task.name,
            split=split,
            adapter_name=adapter or "base model",
            out_dir=Path(out_dir),
            stem="compare" if compare else "eval",
            with_base=compare,
        )
    finally:
        pool.shutdown()
        sweep_run_scratch(run.engine.adapter_dir, tag)
