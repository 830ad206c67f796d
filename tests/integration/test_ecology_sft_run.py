"""strategy=ecology plasticity=sft end to end through the CLI on model=tiny_mix (task=mix):
the run finishes, organelles are trained each generation on their own successful
completions (the sft statistics of metrics.jsonl), their tokens are counted as search
compute, and the routed portfolio beats the base model on held-out (seed 0: 0.793 vs 0.512;
plasticity=none: 0.625)."""

from __future__ import annotations

import json

import pytest

from conftest import cli_run
from evora.tracking.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ecology-sft")]

ECOLOGY_SFT = [
    "+experiment=quickstart/ecology_mix",
    "strategy.plasticity=sft",
    "engine=hf",
    "generations=4",
    "eval_every=4",
    "hardware.num_workers=1",
]


def test_the_ecology_trains_its_organelles_on_their_own_successes():
    run_dir, _ = cli_run(*ECOLOGY_SFT)
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    generations = [r for r in read_metrics(run_dir) if "sft_organelles" in r]
    assert [r["generation"] for r in generations] == [1, 2, 3, 4]
    assert sum(r["sft_organelles"] for r in generations) > 0 and sum(r["sft_examples"] for r in generations) > 0
    trained = [r for r in generations if r["sft_organelles"] > 0]
    assert all(r["sft_step_norm"] > 0 and r["sft_loss"] > 0 and r["tokens_trained"] > 0 for r in trained), trained
    assert all("plasticity_step_norm" in r and r["plasticity_step_norm"] == 0 for r in generations)  # no ES probes
    details = summary["details"]
    assert details["episodes"] == 4 * 32, details  # quickstart/ecology_mix: 32 episodes a generation
    assert details["portfolio"]["reward"] > summary["base"]["reward"], (details["portfolio"], summary["base"])
