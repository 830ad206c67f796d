import json
from dataclasses import dataclass

import numpy as np

from evora.analysis.comparison import build_report, markdown, write_reports
from evora.tasks.base import Example


@dataclass
class Outcome:
    rewards: np.ndarray
    correct: np.ndarray
    texts: list

    def metrics(self):
        return {"reward": float(self.rewards.mean()), "accuracy": float(self.correct.mean())}


def test_groups_and_reports(tmp_path):
    examples = [Example(f"{i}+1=", str(i + 1)) for i in range(4)]
    base = Outcome(np.array([1.0, 0.0, 1.0, 0.0]), np.array([True, False, True, False]), ["1", "x", "3", "y"])
    adapter = Outcome(np.array([1.0, 1.0, 0.0, 0.0]), np.array([True, True, False, False]), ["1", "2", "z|w", "q"])
    report = build_report(examples, adapter, base, task="addition", split="heldout", adapter_name="best")
    assert report["counts"] == {"improvements": 1, "regressions": 1, "both_wrong": 1, "both_right": 1}
    assert report["improvements"][0]["index"] == 1 and report["regressions"][0]["adapter"] == "z|w"
    md_path, json_path = write_reports(report, tmp_path)
    assert json.loads(json_path.read_text())["counts"]["improvements"] == 1
    text = md_path.read_text()
    assert "| accuracy | 0.5000 | 0.5000 | +0.0000 |" in text and "## Regressions (1)" in text
    assert "z\\|w" in text  # table cells escape pipes


def test_single_adapter_report_lists_every_row():
    examples = [Example("a", "b")]
    outcome = Outcome(np.array([1.0]), np.array([True]), ["b"])
    report = build_report(examples, outcome, None, task="t", split="heldout", adapter_name="x")
    assert len(report["rows"]) == 1 and "base_metrics" not in report
    assert "| accuracy | 1.0000 |" in markdown(report)
