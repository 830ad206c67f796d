"""Atomic checkpoints: write a temporary file, fsync it, rename it over the old one,
fsync the folder. A crash at any moment leaves the previous checkpoint or the new one,
never a torn file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

LATEST = "latest.pt"


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def load(path: str | os.PathLike) -> Any:
    # Checkpoints hold plain data only (dicts, lists, numbers, strings, tensors).
    return torch.load(path, map_location="cpu", weights_only=True)


def latest_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints" / LATEST
