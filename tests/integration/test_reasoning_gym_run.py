"""reasoning-gym through the real CLI: a task=mix of three of its datasets and a hostile one of our
own (tests/hostile_gym.py, a task.plugins module whose score_answer hangs, segfaults, exits its
process or raises on 4 problems in 10). The run finishes; every failure is counted, and only
the hostile family's; the three datasets' completions are scored by their own score_answer."""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT, only_run_dir, run_evora
from evora.tracking.metrics import read_metrics

pytestmark = pytest.mark.slow

DATASETS = ("chain_sum", "spell_backward", "gcd")  # short questions: the tiny model's context is 512 tokens
HOSTILE = "reasoning_gym_hostile_sums"
# The question each dataset's held-out problems start with, and the hostile one's ("3+1=").
QUESTIONS = {
    "chain_sum": "State the final answer to the following arithmetic problem",
    "spell_backward": "Spell this word backward",
    "gcd": "Find the Greatest Common Divisor",
}


def test_three_datasets_and_a_hostile_scorer_run_to_the_end_with_every_failure_counted():
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    families = [f"+task.families.reasoning_gym_{name}=1" for name in DATASETS]
    args = [
        "task=mix",
        "task.families.addition=0",
        "task.families.arithmetic=0",
        *families,
        f"+task.families.{HOSTILE}=1",
        f"+task.family_options.{HOSTILE}.plugins=[hostile_gym]",
        "task.train_size=64",
        "task.selection_size=0",
        "task.eval_size=40",  # 10 a family: its hostile draws 3 misbehaving (two hang, one raises) and 7 fair
        "task.prompts_per_generation=16",
        "task.max_tokens=12",
        "task.reward_timeout_s=1",
        "strategy.population=2",
        "engine=hf",
        "generations=1",
        "eval_every=1",
        "hardware.num_workers=1",
        f"tracking.out_dir={out}",
    ]
    # A Ray of its own: the reward processes import the plugin from tests/ (the shared head's do not).
    result = run_evora(args, cwd=out, env={"PYTHONPATH": str(ROOT / "tests")})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    run_dir = only_run_dir(out)
    records = read_metrics(run_dir)
    searched = [r for r in records if "reward_timeouts" in r]
    # A hang ends as a timeout, a crash as an error; under load a crash may break the whole pool,
    # whose calls (a hang's too) are made again and, past the rebuilds, counted as errors.
    failures = sum(r["reward_timeouts"] + r["reward_errors"] for r in searched)
    assert failures > 0 and sum(r["reward_failed"] for r in searched) == failures
    assert sum(r.get("workers_lost", 0) for r in records) == 0
    assert all(math.isfinite(r["reward_mean"]) for r in records if "reward_mean" in r)
    assert records[-1]["heldout_reward_failed"] > 0

    comparison = json.loads((run_dir / "eval" / "best_vs_base.json").read_text())
    scored = [e for group in ("improvements", "regressions", "both_wrong", "both_right") for e in comparison[group]]
    failed = comparison["failed"]
    hostile = [e for e in (*scored, *failed) if re.match(r"\d+\+\d+=", e["prompt"])]
    misbehaving = [e for e in hostile if 1 <= int(e["answer"]) % 10 <= 4]  # its score_answer hangs, crashes or raises
    assert misbehaving and all(e in failed for e in misbehaving)
    assert any(e in scored for e in hostile)  # and scores the rest
    for name, question in QUESTIONS.items():
        assert any(e["prompt"].startswith(question) for e in scored), name
    assert comparison["examples"] == len(scored) + len(failed) == 40
