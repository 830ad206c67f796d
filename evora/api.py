"""evora from Python (a notebook, a script): compose a config, run a job, load a finished run.

    import evora
    config = evora.compose("strategy=ga", "generations=5")      # a validated RunConfig
    run = evora.run("strategy=ga", "generations=5")             # runs the job; its Run
    run.summary["best"]["reward"], run.metrics[["generation", "reward_mean"]], run.adapters["best"]
    evora.load_run("runs/2026-11-27_06-10-00_tiny_addition_es")  # a finished (or crashed) run

Bad input raises the CLI's one-line errors as exceptions (ConfigError, DataError, RunError) before
anything starts. `run` runs the job as the `evora` command does, in a process of its own: Ray,
its signal handlers and its engines never enter the caller's (a notebook kernel keeps no Ray
session); its console lines are echoed as they come.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evora.errors import ConfigError, EvoraError, RunError

if TYPE_CHECKING:
    import pandas

    from evora.config.schema import RunConfig

__all__ = ["Run", "compose", "load_run", "run"]

ERROR_PREFIX = "evora: error: "
EXIT_ERRORS: dict[int, type[EvoraError]] = {1: RunError, 2: ConfigError}


@dataclass(frozen=True)
class Run:
    """A run folder, read: its config, its status, its summary (None until the run finished),
    its per-generation records as a table, and its exports by name (adapters and model folders).

    Attributes:
        path: The run folder, absolute.
        config: The run's resolved config, as its `config.yaml` saved it (secrets redacted).
        status: `finished` (it has `eval/summary.json`), `running` (a live process holds its
            lock) or `crashed` (neither: stopped before its end; `resume=<path>` goes on), as
            `evora runs list` says.
        summary: `eval/summary.json`: base, final and best held-out metrics, the best's
            generation, compute, exports; None until the run finished.
        metrics: `metrics.jsonl`, one row per generation (reward statistics, timings,
            tokens, compute, held-out metrics where evaluated); empty before the first.
        adapters: The exports by name (`best`, the center's, `model` for full weights), each
            the absolute path of its folder; empty until the run finished.
    """

    path: Path
    config: RunConfig
    status: str  # finished | running | crashed (evora runs list)
    summary: dict[str, Any] | None
    metrics: pandas.DataFrame
    adapters: dict[str, Path]


def compose(*overrides: str) -> RunConfig:
    """The validated config the command line `evora <overrides>` would run."""
    from evora.plan.compose import compose_run
    from evora.plan.jobs import job_run

    _check_one_job(overrides)
    return job_run(compose_run(list(overrides)), list(overrides))


def load_run(path: str | Path) -> Run:
    """The run in folder `path`, finished or not (a ConfigError where it holds no run's config)."""
    from pandas import DataFrame

    from evora.plan.overlay import saved_run_config
    from evora.runs import is_run, status
    from evora.tracking.metrics import read_metrics
    from evora.tracking.summary import read_summary

    folder = Path(path).resolve()
    if not is_run(folder):
        raise ConfigError(f"{path}: not a run folder (no config.yaml)")
    summary = read_summary(folder)
    exports = (summary or {}).get("adapters", {})
    return Run(
        path=folder,
        config=saved_run_config(folder),
        status=status(folder),
        summary=summary,
        metrics=DataFrame.from_records(read_metrics(folder)),
        adapters={name: folder / relative for name, relative in exports.items()},
    )


def run(*overrides: str, echo: bool = True) -> Run:
    """Run one job of `evora <overrides>` to its end and load it. Raises the job's one-line error
    (a RunError for a run that could not go on: its folder and last checkpoint stay, and
    `evora.run(f"resume={folder}")` goes on) or KeyboardInterrupt for an interrupted one."""
    from evora.plan.compose import new_run_dir

    config = compose(*overrides)  # bad input: raised here, before a process or a folder exists
    folder = Path(config.resume or new_run_dir(config.tracking.out_dir, config.name)).resolve()
    command = [sys.executable, "-m", "evora", *overrides, f"hydra.run.dir={shlex.quote(str(folder))}"]
    if not any(o.startswith("tracking.progress=") for o in overrides):
        command.append("tracking.progress=false")  # a bar redrawn in place is noise in a notebook
    returncode, error = _follow(command, echo)
    if returncode in (130, 143):
        raise KeyboardInterrupt(f"{folder}: interrupted; resume: evora.run('resume={folder}')")
    if returncode != 0:
        raise EXIT_ERRORS.get(returncode, RunError)(error or f"evora exited with {returncode} ({folder / 'cli.log'})")
    return load_run(folder)


def _follow(command: list[str], echo: bool) -> tuple[int, str | None]:
    """Run `command`, echoing its console lines as they come; (exit code, its error line)."""
    error = None
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as process:
        assert process.stdout is not None
        try:
            for line in process.stdout:
                if line.startswith(ERROR_PREFIX):
                    error = line[len(ERROR_PREFIX) :].strip()
                if echo:
                    print(line, end="", flush=True)
        except KeyboardInterrupt:  # Ctrl-C (a notebook's interrupt) reaches the job as the CLI's Ctrl-C
            process.send_signal(signal.SIGINT)
            process.wait()
            raise
    return process.returncode, error


def _check_one_job(overrides: tuple[str, ...]) -> None:
    from evora.plan.compose import parse_overrides

    for text, override in zip(overrides, parse_overrides(list(overrides))):
        if override.is_sweep_override():
            raise ConfigError(f"'{text}': evora.run runs one job; a sweep is one call per job, or `evora -m`")
