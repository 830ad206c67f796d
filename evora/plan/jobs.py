"""The jobs of a command line, each planned once before Ray starts: the preflight composes,
validates and plans every job a (multi)run would run, and the job itself reuses its plan."""

from __future__ import annotations

from evora.config.schema import RunConfig
from evora.plan.compose import compose_run, expand_jobs, overrides_of
from evora.plan.overlay import resumed_run_config
from evora.plan.run_plan import RunPlan, build_plan, check_data, check_environment, check_resume, fetches_from_hub
from evora.plan.validate import validate

_PLANNED: dict[str, RunPlan] = {}  # the preflight's plans, each taken by the job that runs it


def job_run(run: RunConfig, overrides: list[str]) -> RunConfig:
    """The config a job runs: for a resume, the saved run's with the overrides it allows."""
    if run.resume is None:
        return run
    check_resume(run.resume)
    return resumed_run_config(run, overrides)  # validated there


def job_plan(run: RunConfig, overrides: list[str], validated: bool = True) -> RunPlan:
    """The plan of one job of a command line (`overrides` its override strings); the plan the
    preflight built for the same config is taken, not built again."""
    resumed = run.resume is not None
    run = job_run(run, overrides)
    planned = _PLANNED.pop(repr(run), None)
    if planned is not None:
        return planned
    if not validated and not resumed:
        check_config(run)
    return build_plan(run)


def check_config(run: RunConfig) -> None:
    """A composed job's data file, then its rules: a file still to fetch is the first thing to fix,
    and the rules that follow may depend on the model (task.max_tokens on model.max_model_len)."""
    check_data(run.task)
    validate(run)


def preflight(argv: list[str]) -> list[RunConfig]:
    """Compose, validate and plan every job `argv` would run (what comes from the hub is looked
    up when the job starts); returns the composed configs, [] when Hydra only prints."""
    overrides = overrides_of(argv)
    if overrides is None:
        return []
    jobs = expand_jobs(overrides)
    composed = [compose_run(job, validated=False) for job in jobs]
    for run in composed:
        check_config(run)
    for run, job in zip(composed, jobs):
        run = job_run(run, job)
        if fetches_from_hub(run):
            check_environment(run)
        else:
            _PLANNED[repr(run)] = build_plan(run)
    return composed
