"""`run_pbt`, the job strategy=pbt registers: Ray, the shared EvaluationService (the engine
workers that score every member), the Tune experiment, and the finish. It takes the run plan
(`evora/plan/run_plan.py`): the model, its modules and parameter count, the task's splits."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray

from evora.config.schema import RunConfig
from evora.distributed.evaluate import EvaluationService
from evora.distributed.placement import engine_gpus
from evora.distributed.ray_session import init_ray
from evora.distributed.recorder import start_event
from evora.distributed.worker_spec import worker_spec
from evora.errors import ConfigError
from evora.jobs.pbt.experiment import experiment_dir, quiet_tune, tuner
from evora.jobs.pbt.finish import finish
from evora.jobs.pbt.trial import TrialContext
from evora.jobs.pbt.tune_private import require_written_for_this_ray
from evora.lora.layout import build_layout
from evora.plan.run_plan import RunPlan
from evora.tracking.compute import ComputeLedger
from evora.tracking.events import Event, OnEvent
from evora.tracking.run_dir import run_tag, write_config


def evaluation_service(plan: RunPlan, name: str) -> Any:
    """The shared EvaluationService; its engines accept the largest rank of the search space."""
    run, model_path = plan.run, plan.model_path
    # num_workers=null means one engine per GPU for es/ga; here trials train on the GPUs, so one engine.
    hardware = replace(run.hardware, num_workers=run.hardware.num_workers or 1)
    widest = max(run.strategy.ranks)
    layout = build_layout(
        plan.modules.adaptable,
        rank=widest,
        alpha=widest,
        target_modules=sorted({m for ts in run.strategy.target_modules for m in ts}),
        layers=run.lora.layers,
        base_model=model_path,
    )
    sizes = {split: len(plan.splits.get(split)) for split in ("train", "selection", "heldout")}
    tag, resolved = name.rsplit("-", 1)[-1], (plan.task, plan.splits)
    spec = worker_spec(run, model_path, layout, tag, with_strategy=False, max_lora_rank=widest, resolved=resolved)
    return ray.remote(EvaluationService).options(name=name, num_cpus=0).remote(spec, hardware, sizes)


def check_trial_resources(run: RunConfig, engines_to_start: bool = False) -> None:
    """Fail now, not hang in Tune's queue, when no member fits beside the engine workers
    (`engines_to_start`: before they start, counting what they will reserve)."""
    free = ray.available_resources()
    workers = (run.hardware.num_workers or 1) if engines_to_start else 0
    for key, resource, per_worker in (
        ("trial_cpus", "CPU", run.hardware.cpus_per_worker),
        ("trial_gpus", "GPU", engine_gpus(run.hardware)),
    ):
        wanted, left = getattr(run.hardware, key), free.get(resource, 0.0) - workers * per_worker
        if wanted > left + 1e-9:
            raise ConfigError(
                f"hardware.{key}={wanted}: only {max(left, 0.0):g} {resource} left beside "
                f"the engine workers; lower hardware.{key} or hardware.num_workers"
            )


def run_pbt(plan: RunPlan, run_dir: str, on_event: OnEvent) -> Event:
    started, run = time.perf_counter(), plan.run
    require_written_for_this_ray()
    quiet_tune()
    folder = Path(run_dir)
    restore = (experiment_dir(folder) / "tuner.pkl").exists()
    if not restore:
        write_config(folder, run)
    init_ray(run)
    check_trial_resources(run, engines_to_start=True)  # before minutes of engine start-up
    name = f"evora-eval-{run_tag(run_dir)}"
    service = evaluation_service(plan, name)
    # Engines first: trials started earlier could take the CPUs/GPUs the engine workers need.
    workers = ray.get(service.workers.remote())
    check_trial_resources(run)
    context = TrialContext(run, plan.model_path, name, plan.modules.adaptable, (plan.task, plan.splits))
    on_event(
        start_event(
            plan.entry.name,
            generations=run.generations,
            start=0,
            workers=workers,
            base_heldout=None,
            resumed=restore,
            adapter_parameters=None,
            setup_seconds=time.perf_counter() - started,
            population=run.strategy.population,
        )
    )
    ledger = ComputeLedger(plan.parameters)
    ledger.add_seconds("setup", time.perf_counter() - started)
    try:
        searched = time.perf_counter()
        results = tuner(run, folder, context, ledger.parameters, restore).fit()
        ledger.add_seconds("search", time.perf_counter() - searched)
        final = finish(plan, folder, context, service, results, ledger)
        on_event(final)
        return final
    finally:
        ray.get(service.shutdown.remote())
        ray.kill(service)
