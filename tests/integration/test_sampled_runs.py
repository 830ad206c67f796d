"""Sampled decoding through the real CLI, Ray and vLLM: with four samples per (candidate,
prompt) at temperature 1, one and two workers give bitwise the same run (fixed units), a
resumed run samples what the uninterrupted one sampled, and the held-out report carries
pass@1 and pass@4, which `evora compare` shows. (vLLM against transformers on the same seeds:
tests/integration/test_sampling_engines.py; a cell's seeds: tests/unit/test_sampled_worker.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import SMALL, cli_run, fresh_run, resume_run, run_evora
from evora.tracking.metrics import read_metrics
from evora.tracking.summary import read_summary

pytestmark = pytest.mark.slow

SAMPLED = (
    "+experiment=quickstart/es",
    *SMALL,
    "task.temperature=1.0",
    "task.samples=4",
    "task.eval_temperature=1.0",
    "task.eval_samples=4",
    "task.eval_size=32",
    "generations=2",
)
SEARCH = ("reward_mean", "reward_std", "accuracy_mean", "tokens")
HELDOUT = ("heldout_reward", "heldout_pass_at_1", "heldout_pass_at_4")


def record_numbers(run_dir: Path) -> list[dict]:
    """Each generation's search numbers, and the held-out numbers of the last (a run stopped
    early evaluates held-out where it stopped; the uninterrupted one did not, there)."""
    records = read_metrics(run_dir)
    numbers = [{k: r.get(k) for k in SEARCH} for r in records]
    return [*numbers, {k: records[-1].get(k) for k in HELDOUT}]


def mean_adapter(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "adapters" / "mean" / "adapter_model.safetensors"))


def assert_same_run(ours: Path, theirs: Path) -> None:
    assert record_numbers(ours) == record_numbers(theirs)
    a, b = mean_adapter(ours), mean_adapter(theirs)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.xdist_group("sampled-run")
def test_held_out_reports_pass_at_1_and_pass_at_4_and_compare_shows_them(tmp_path):
    run_dir, _ = cli_run(*SAMPLED, "hardware.num_workers=2")
    summary = read_summary(run_dir)
    for which in ("base", "best"):
        metrics = summary[which]
        assert metrics["pass_at_1"] == pytest.approx(metrics["accuracy"])
        assert metrics["pass_at_1"] <= metrics["pass_at_4"] <= 1.0
    assert summary["base"]["pass_at_4"] > summary["base"]["pass_at_1"]  # four tries beat one on the tiny model
    result = run_evora(["compare", str(run_dir), "--out", str(tmp_path)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "compare.md").read_text()
    assert "## Decoding" in text and "| T=1 n=4 mean | T=1 n=4 |" in text
    assert f"{summary['best']['pass_at_4']:.4f} (k=4)" in text


@pytest.mark.xdist_group("sampled-run")
def test_one_worker_resumed_on_two_samples_bitwise_the_run_of_two_workers_throughout():
    """Worker counts and resume in one: one worker for generation 1, resumed on two workers for
    generation 2, samples what two workers sampled uninterrupted."""
    two, _ = cli_run(*SAMPLED, "hardware.num_workers=2")
    assert any(r["reward_std"] for r in read_metrics(two)[1:])  # candidates really differ
    part, _ = fresh_run(*SAMPLED, "hardware.num_workers=1", "generations=1")
    assert "resumed at generation 1" in resume_run(part, "generations=2", "hardware.num_workers=2")
    assert_same_run(part, two)
