"""The `evora` command: Hydra main over conf/, with a preflight that rejects bad input in
one line before Ray starts.

    evora +experiment=quickstart/es         the quickstart, `make run` (tiny model, CPU, local Ray)
    evora model=qwen2_5_0_5b task=countdown hardware=gpu
    evora -m strategy.sigma=0.001,0.002 seed=0,1,2
    evora resume=runs/<run folder> generations=60
    evora eval adapter=runs/<run folder>/adapters/best compare=true
    evora analyze runs/<run folder>           plots/ and report.md (a sweep folder: sweep.png)
    evora compare runs/<run> runs/<run> ...   held-out reward, KL and compute, side by side
    evora runs list | show <run> | clean [--keep N] [--yes]   (clean: also dead runs' scratch)
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from evora.commands import SUBCOMMANDS
from evora.commands.exits import EXIT_FAILURE, die
from evora.errors import EvoraError
from evora.interrupts import Terminated, install_handlers, raise_pending
from evora.plan.compose import CONF_DIR, resolve_named_overrides, setup, to_run_config
from evora.plan.jobs import job_plan, preflight
from evora.strategies import entries, get_strategy
from evora.tracking.events import Event, OnEvent
from evora.tracking.run_dir import CLI_LOG, log_traceback
from evora.tracking.sweep import in_multirun, job_objective, with_sweep_tracking


def _fail(error: BaseException, run_dir: Path) -> NoReturn:
    """One line on the console; the whole traceback in the run folder's cli.log."""
    trace = log_traceback(run_dir, error)
    if os.environ.get("EVORA_DEBUG") == "1":
        print(trace, file=sys.stderr, end="")
    if isinstance(error, EvoraError):
        die(error)
    cause = getattr(error, "cause", None)  # a Ray task error: the exception raised on the cluster
    shown = cause if isinstance(cause, BaseException) else error
    first = (str(shown).strip().splitlines() or [""])[0][:300]
    print(f"evora: error: {type(shown).__name__}: {first} (traceback: {run_dir / CLI_LOG})", file=sys.stderr)
    raise SystemExit(EXIT_FAILURE)


def _checked(on_event: OnEvent) -> OnEvent:
    """on_event that first raises an interrupt swallowed since the last event."""

    def handle(event: Event) -> None:
        raise_pending()
        on_event(event)

    return handle


def _interrupted(error: BaseException, run_dir: Path) -> NoReturn:
    """The run stopped at once; its last checkpoint stays. Says how to go on."""
    from evora.tracking.checkpoint import saved_generation

    done = saved_generation(run_dir)
    where = f" after generation {done}" if done is not None else ""  # PBT keeps Tune's checkpoints
    print(f"evora: interrupted{where}; resume: evora resume={run_dir}", file=sys.stderr)
    raise SystemExit(128 + (signal.SIGTERM if isinstance(error, Terminated) else signal.SIGINT))


def run_job(cfg: DictConfig) -> Event:
    """One job: its run plan (the preflight's) -> driver on Ray -> final summary."""
    try:
        plan = job_plan(to_run_config(cfg), list(HydraConfig.get().overrides.task), validated=False)
        plan = plan.with_run(with_sweep_tracking(plan.run))
    except EvoraError as error:
        die(error)
    run = plan.run
    from evora.distributed.launch import launch
    from evora.runs import run_lock
    from evora.tracking.progress import ConsoleProgress

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    install_handlers()
    try:
        # run.lock tells `evora runs` this folder is live (and keeps `runs clean` off it).
        extra = get_strategy(run.strategy.name).console_keys
        with run_lock(run_dir), ConsoleProgress(enabled=run.tracking.progress, extra=extra) as progress:
            return launch(plan, str(run_dir), _checked(progress.handle))
    except (KeyboardInterrupt, Terminated) as error:
        _interrupted(error, run_dir)
    except Exception as error:
        interrupt = _interrupt_in(error)
        if interrupt is not None:
            _interrupted(interrupt, run_dir)
        _fail(error, run_dir)


def _interrupt_in(error: BaseException) -> BaseException | None:
    """An interrupt that reached us wrapped: raised by the signal handler inside one of Ray's
    Cython calls, it comes back as a SystemError whose cause is the interrupt."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (KeyboardInterrupt, Terminated)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_main(cfg: DictConfig) -> Event | float:
    """A job; in a multirun its value is the run's `objective`, which hydra/sweeper=optuna optimises."""
    event = run_job(cfg)
    if not in_multirun():
        return event
    return job_objective(HydraConfig.get().runtime.output_dir, cfg.objective)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup()
    for entry in entries():  # what a strategy's runner reads in this process (PBT: Ray Tune's settings)
        for name, value in entry.environment:
            os.environ.setdefault(name, value)  # a user's own settings are kept
    if argv[:1] in (["--help"], ["-h"], ["help"]):
        from evora.help import help_text

        print(help_text())
        return
    if argv[:1] and argv[0] in SUBCOMMANDS:
        importlib.import_module(f"evora.commands.{SUBCOMMANDS[argv[0]].module}").main(argv[1:])
        return
    try:
        argv = resolve_named_overrides(argv)  # a user's strategy or task by import path -> <group>=<its name>
        preflight(argv)
    except EvoraError as error:
        die(error)
    sys.argv = [sys.argv[0], *argv]
    _hydra_main()


if __name__ == "__main__":
    main()
