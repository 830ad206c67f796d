import json
import math

import numpy as np
import pytest

from evora.analysis.comparison import build_report, markdown, write_reports
from evora.distributed.evaluate import SplitOutcome
from evora.tasks.base import Example


def split_outcome(rewards, correct, texts, scored=None):
    return SplitOutcome(rewards, correct, np.ones(len(rewards)), None, texts, scored=scored)


def test_groups_and_reports(tmp_path):
    examples = [Example(f"{i}+1=", str(i + 1)) for i in range(4)]
    base = split_outcome(np.array([1.0, 0.0, 1.0, 0.0]), np.array([True, False, True, False]), ["1", "x", "3", "y"])
    adapter = split_outcome(
        np.array([1.0, 1.0, 0.0, 0.0]), np.array([True, True, False, False]), ["1", "2", "z|w", "q"]
    )
    report = build_report(examples, adapter, base, task="addition", split="heldout", adapter_name="best")
    assert report["counts"] == {"improvements": 1, "regressions": 1, "both_wrong": 1, "both_right": 1, "failed": 0}
    assert report["improvements"][0]["index"] == 1 and report["regressions"][0]["adapter"] == "z|w"
    md_path, json_path = write_reports(report, tmp_path)
    assert json.loads(json_path.read_text())["counts"]["improvements"] == 1
    text = md_path.read_text()
    assert "| accuracy | 0.5000 | 0.5000 | +0.0000 |" in text and "## Regressions (1)" in text
    assert "z\\|w" in text  # table cells escape pipes


def test_single_adapter_report_lists_every_row():
    examples = [Example("a", "b")]
    outcome = split_outcome(np.array([1.0]), np.array([True]), ["b"])
    report = build_report(examples, outcome, None, task="t", split="heldout", adapter_name="x")
    assert len(report["rows"]) == 1 and "base_metrics" not in report
    assert "| accuracy | 1.0000 |" in markdown(report)


def strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"bare {constant} in JSON")

    return json.loads(text, parse_constant=refuse)


def test_failed_rewards_are_compared_for_neither_side_and_never_regressions(tmp_path):
    """The base model's reward failed on example 0, the adapter's on 3 (a judge that did not answer):
    both are listed as failed, neither as a regression, and each side's means are over 1 and 2 alone,
    so identical weights score identically; the JSON has null where a reward failed."""
    examples = [Example(f"{i}+1=", str(i + 1)) for i in range(4)]
    nan = math.nan
    base = split_outcome(np.array([nan, 0.0, 1.0, 1.0]), np.array([0.0, 0, 1, 1]), ["a", "b", "c", "d"],
                   scored=np.array([False, True, True, True]))  # fmt: skip
    adapter = split_outcome(np.array([1.0, 1.0, 1.0, nan]), np.array([1.0, 1, 1, 0]), ["a", "b", "c", "d"],
                      scored=np.array([True, True, True, False]))  # fmt: skip
    report = build_report(examples, adapter, base, task="t", split="heldout", adapter_name="best")
    assert report["counts"] == {"improvements": 1, "regressions": 0, "both_wrong": 0, "both_right": 1, "failed": 2}
    assert [r["index"] for r in report["failed"]] == [0, 3]
    assert report["base_metrics"]["reward"] == 0.5 and report["adapter_metrics"]["reward"] == 1.0
    same = build_report(examples, base, base, task="t", split="heldout", adapter_name="base")
    assert same["base_metrics"] == same["adapter_metrics"] and same["counts"]["failed"] == 1
    _, json_path = write_reports(report, tmp_path)
    written = strict_json(json_path.read_text())
    assert written["failed"][0]["base_reward"] is None and written["failed"][1]["adapter_reward"] is None


def test_a_side_with_no_scored_example_writes_null_metrics(tmp_path):
    examples = [Example("a", "b")]
    failed = split_outcome(np.array([math.nan]), np.array([0.0]), ["x"], scored=np.array([False]))
    report = build_report(examples, failed, failed, task="t", split="heldout", adapter_name="x")
    assert math.isnan(report["adapter_metrics"]["reward"])
    _, json_path = write_reports(report, tmp_path)
    assert strict_json(json_path.read_text())["adapter_metrics"]["reward"] is None
    with pytest.raises(ValueError, match="bare NaN"):
        strict_json('{"reward": NaN}')
