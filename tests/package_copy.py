"""A copy of the evora package with a few files added, and a script run against it in a new
process: how the registry tests show that a new task or engine is its files and nothing else."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import evora

PACKAGE = Path(evora.__file__).resolve().parent


def run_in_copy(tmp_path: Path, files: dict[str, str], script: str) -> list[str]:
    """`files` (paths inside the package -> text) added to a copy of it; `script`'s stdout lines."""
    copy = tmp_path / "evora"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))  # conf/ (a link) copied in full
    for path, text in files.items():
        (copy / path).write_text(textwrap.dedent(text))
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()
