"""strategy=randopt end to end through the CLI, Ray and vLLM (+experiment=quickstart/randopt, 3
rounds): the distilled adapter lifts the held-out reward from the base model's after its first
round, every round reports its ensemble's vote and what it distilled, the SFT's tokens count as
training compute, and the exported adapter reloads in PEFT like its merged reference. Its
determinism (1 and N workers, killed workers, a restarted driver) is test_chaos.py's."""

from __future__ import annotations

import json

import pytest
from test_model_families import assert_reloads_like_reference

from conftest import cli_run
from evora.tracking.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_the_randopt_quickstart_distils_an_ensemble_that_beats_the_base_model(tiny_path):
    run_dir, stdout = cli_run("+experiment=quickstart/randopt", "generations=3", "strategy.population=16")
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    records = read_metrics(run_dir)
    assert records[1]["heldout_reward"] > summary["base"]["reward"] + 0.2, (records[1], summary["base"])
    rounds = records[1:]
    assert all(r["distil_examples"] > 0 and r["distil_steps"] > 0 and 0 <= r["ensemble_accuracy"] <= 1 for r in rounds)
    assert [r["distil_examples"] for r in rounds] == sorted(r["distil_examples"] for r in rounds)  # cumulative
    assert summary["compute"]["search"]["tokens_trained"] > 0 and "ensemble" in stdout
    assert_reloads_like_reference(tiny_path, run_dir / "adapters" / "distilled")
