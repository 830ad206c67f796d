"""The bundled Countdown model organism, measured as a user measures it: `evora eval adapter=base
model=organism task=countdown` on its 256 held-out problems (one in eight of all, never in its
pretraining text) solves between 10% and 40% of them, room to improve and room to get worse."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from conftest import run_evora

pytestmark = pytest.mark.slow


def test_the_base_organism_solves_between_a_tenth_and_two_fifths_of_its_held_out_problems():
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    args = ["eval", "adapter=base", "model=organism", "task=countdown", "engine=hf", "hardware.num_workers=1"]
    result = run_evora([*args, f"out={out / 'eval'}"], cwd=out)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((out / "eval" / "eval.json").read_text())
    assert report["examples"] == 256 and report["adapter"] == "base model", report
    assert 0.10 <= report["adapter_metrics"]["accuracy"] <= 0.40, report["adapter_metrics"]
