"""`evora runs list|show|clean`: the run folders under runs/, their status, and cleanup.
Also `run_lock`, the run.lock file a live run holds, which is what tells "running" from
"crashed". No Ray here: this reads files only."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from evora.errors import ConfigError
from evora.tracking.metrics import read_metrics
from evora.tracking.run_dir import CONFIG_FILE
from evora.tracking.summary import SUMMARY_FILE as SUMMARY
from evora.tracking.summary import headline, read_summary

LOCK_FILE = "run.lock"


@contextmanager
def run_lock(run_dir: str | Path) -> Iterator[Path]:
    """run.lock with this process's pid while the block runs; removed however it ends.
    A kill -9 leaves it behind, which `status` reads as crashed once the pid is gone."""
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def status(run_dir: str | Path) -> str:
    run = Path(run_dir)
    lock = run / LOCK_FILE
    if lock.exists():
        text = lock.read_text().strip()
        if text.isdigit() and _alive(int(text)):
            return "running"
    return "finished" if (run / SUMMARY).exists() else "crashed"


def is_run(folder: Path) -> bool:
    return folder.is_dir() and (folder / CONFIG_FILE).exists()


def _summary(run: Path) -> dict[str, Any]:
    return read_summary(run) or {}


def run_info(run: Path) -> dict[str, Any]:
    config = yaml.safe_load((run / CONFIG_FILE).read_text()) or {}
    metrics = read_metrics(run)
    done = max((r.get("generation", 0) for r in metrics), default=0)
    return {
        "name": run.name,
        "strategy": config.get("strategy", {}).get("name"),
        "task": config.get("task", {}).get("name"),
        "model": config.get("model", {}).get("name"),
        "generations": f"{done}/{config.get('generations')}",
        "best_heldout": headline(read_summary(run), "best"),
        "status": status(run),
    }


def find_runs(directory: str | Path) -> list[Path]:
    """Run folders directly under `directory` and inside sweep folders (<sweep>/<job>), oldest first."""
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"{root}: no such folder")
    candidates = [p for child in sorted(root.iterdir()) for p in (child, *sorted(child.glob("*"))) if child.is_dir()]
    return sorted((p for p in candidates if is_run(p)), key=lambda p: (p.stat().st_mtime, p.name))


def list_runs(directory: str | Path) -> list[dict[str, Any]]:
    # Named relative to the folder so that sweep jobs read <sweep>/<job>, not a bare number.
    return [{**run_info(run), "name": str(run.relative_to(directory))} for run in find_runs(directory)]


def print_runs(directory: str | Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"runs in {directory}")
    table.add_column("name", no_wrap=True)  # a run name is what one copies; never split it
    for column in ("strategy", "task", "model", "generations", "best held-out", "status"):
        table.add_column(column)
    for info in list_runs(directory):
        best = "-" if info["best_heldout"] is None else f"{info['best_heldout']:.4f}"
        table.add_row(
            info["name"],
            str(info["strategy"]),
            str(info["task"]),
            str(info["model"]),
            info["generations"],
            best,
            info["status"],
        )
    # Piped or in a log, rich would assume 80 columns and cut every cell short.
    console = Console()
    Console(width=None if console.is_terminal else 200).print(table)


def show_run(run_dir: str | Path) -> None:
    run = Path(run_dir)
    if not is_run(run):
        raise ConfigError(f"{run}: not a run folder (no {CONFIG_FILE})")
    info = run_info(run)
    print(
        f"{info['name']}: {info['status']}, strategy {info['strategy']}, task {info['task']}, "
        f"model {info['model']}, generations {info['generations']}"
    )
    print(f"{SUMMARY}: " + (json.dumps(_summary(run), indent=2) if _summary(run) else "(none)"))
    metrics = read_metrics(run)
    print("last metrics: " + (json.dumps(metrics[-1]) if metrics else "(none)"))


def to_delete(directory: str | Path, keep: int) -> list[Path]:
    """All but the `keep` newest finished or crashed runs; a running run is never listed."""
    if keep < 0:
        raise ConfigError(f"--keep {keep}: must be 0 or more")
    done = [run for run in find_runs(directory) if status(run) != "running"]
    return done[: max(len(done) - keep, 0)]


def clean_runs(
    directory: str | Path, keep: int, yes: bool = False, ask: Callable[[str], str] | None = None
) -> list[Path]:
    doomed = to_delete(directory, keep)
    if not doomed:
        print("nothing to delete")
        return []
    print("\n".join(f"delete {run} ({status(run)})" for run in doomed))
    if not yes and (ask or input)(f"delete {len(doomed)} run folder(s)? [y/N] ").strip().lower() not in ("y", "yes"):
        print("nothing deleted")
        return []
    deleted = []
    for run in doomed:
        if status(run) != "running":  # checked again: a run may have started since the prompt
            shutil.rmtree(run)
            deleted.append(run)
    return deleted


SCRATCH_ROOT = "/dev/shm"  # engine.adapter_dir's default


def sweep_dead_scratch(root: str | Path = SCRATCH_ROOT) -> int:
    """Remove candidate scratch folders (`evora-<run tag>-<worker pid>`) whose worker is gone:
    what a run killed with -9, or a lost node, left on tmpfs. Returns how many."""
    removed = 0
    for folder in Path(root).glob("evora-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if folder.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed
