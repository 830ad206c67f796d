"""Shared fixtures. Tests never download: the tiny model is bundled with evora."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "evora" / "models" / "tiny"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_path() -> str:
    return str(TINY)


@pytest.fixture(scope="session")
def tiny_shapes(tiny_path):
    from evora.lora.layout import linear_shapes_of_model

    return linear_shapes_of_model(tiny_path)


def evora_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "evora", *args]


def run_evora(args: list[str], cwd: Path, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess (its own local Ray)."""
    full_env = {**os.environ, **(env or {})}
    if args[:1] in (["analyze"], ["runs"]):  # not a run: no config overrides
        return subprocess.run(evora_cmd(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    command = args[:1] if args[:1] in (["eval"], ["-m"]) else []  # a subcommand or -m comes first
    args = [*command, "tracking.progress=false", *args[len(command):]]
    return subprocess.run(evora_cmd(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


def only_run_dir(out_dir: Path) -> Path:
    runs = [p for p in out_dir.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


# A small, fast variant of the quickstart: 8 candidates in units of 4, so two workers share work.
SMALL = ["strategy.population=8", "engine.max_loras=4", "task.prompts_per_generation=16", "task.eval_size=64",
         "eval_every=2"]


@functools.lru_cache(maxsize=None)
def cli_run(*args: str) -> tuple[Path, str]:
    """Run evora once per distinct argument list; returns (run folder, stdout)."""
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    result = run_evora([f"tracking.out_dir={out}", *args], cwd=out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return only_run_dir(out), result.stdout
