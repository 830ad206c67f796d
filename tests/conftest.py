"""Shared fixtures. Tests never download: the tiny model is bundled with evora."""

from __future__ import annotations

import os
import subprocess
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
    command = args[:1] if args[:1] == ["eval"] else []  # a subcommand comes first
    args = [*command, "tracking.progress=false", *args[len(command):]]
    return subprocess.run(evora_cmd(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


def only_run_dir(out_dir: Path) -> Path:
    runs = [p for p in out_dir.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]
