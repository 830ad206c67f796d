"""Base-vs-adapter comparison on one split (the LoRALab comparison report): accuracy of
each, improvements (base wrong, adapter right), regressions, both wrong, with the
examples listed (sampled several times, an example is right when at least half its samples
are; the completion shown is its first sample). Written as JSON and markdown.

Paired: an example whose reward failed for either side (a judge that did not answer) is
compared for neither. It is listed as failed, never as a regression, and both sides' metrics
are means over the examples both have. No bare NaN reaches the JSON (a failed reward is null)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from evora.tracking.metrics import json_safe

SHOWN_CHARS = 400  # completions are cut to this in the markdown (the JSON has them whole)


class Outcome(Protocol):  # evora.distributed.evaluate.SplitOutcome, kept structural here
    rewards: Any
    correct: Any
    texts: list[str] | None
    scored: Any  # per example: False where its reward failed; None: all scored

    def metrics(self, kept: Any = None) -> dict[str, float]: ...


def scored(outcome: Outcome) -> np.ndarray:
    return np.ones(len(outcome.rewards), dtype=bool) if outcome.scored is None else np.asarray(outcome.scored)


def _texts(outcome: Outcome) -> list[str]:
    if outcome.texts is None:  # evaluated without keeping its completions: nothing to list
        raise ValueError("a base-vs-adapter comparison needs the completions of both")
    return outcome.texts


def right(correct: Any) -> bool:
    """Whether an example counts as right: its correctness, or, sampled several times (a
    fraction of correct samples), right in at least half of them."""
    return float(correct) >= 0.5


def _row(i: int, example: Any, base: Outcome | None, adapter: Outcome) -> dict[str, Any]:
    row = {
        "index": i,
        "prompt": example.prompt,
        "answer": example.answer,
        "adapter": _texts(adapter)[i],
        "adapter_reward": float(adapter.rewards[i]),  # NaN where it failed: null in the JSON
        "adapter_correct": right(adapter.correct[i]),
    }
    if base is not None:
        row.update(base=_texts(base)[i], base_reward=float(base.rewards[i]), base_correct=right(base.correct[i]))
    return row


def build_report(
    examples: Sequence[Any], adapter: Outcome, base: Outcome | None, *, task: str, split: str, adapter_name: str
) -> dict[str, Any]:
    rows = [_row(i, e, base, adapter) for i, e in enumerate(examples)]
    report: dict[str, Any] = {
        "task": task,
        "split": split,
        "adapter": adapter_name,
        "examples": len(rows),
        "adapter_metrics": adapter.metrics(),
    }
    if base is None:
        report["rows"] = rows
        return report
    both = scored(base) & scored(adapter)
    compared = [r for r in rows if both[r["index"]]]
    groups = {
        "improvements": [r for r in compared if r["adapter_correct"] and not r["base_correct"]],
        "regressions": [r for r in compared if r["base_correct"] and not r["adapter_correct"]],
        "both_wrong": [r for r in compared if not r["base_correct"] and not r["adapter_correct"]],
        "both_right": [r for r in compared if r["base_correct"] and r["adapter_correct"]],
        "failed": [r for r in rows if not both[r["index"]]],  # a reward of either side failed
    }
    report["adapter_metrics"] = adapter.metrics(kept=both)
    report["base_metrics"] = base.metrics(kept=both)
    report["counts"] = {name: len(group) for name, group in groups.items()}
    report.update(groups)
    return report


LISTED = {"improvements": "Improvements", "regressions": "Regressions", "both_wrong": "Both wrong", "failed": "Failed"}


def _cut(text: str) -> str:
    text = text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + " [...]"
    return text.replace("|", "\\|").replace("\n", "⏎ ")


def markdown(report: dict[str, Any]) -> str:
    adapter = report["adapter_metrics"]
    lines = [
        f"# Evaluation: {report['adapter']} on {report['task']} ({report['split']}, {report['examples']} examples)",
        "",
    ]
    if "base_metrics" not in report:
        lines += ["| metric | adapter |", "| --- | --- |"]
        lines += [f"| {k} | {v:.4f} |" for k, v in adapter.items()]
        return "\n".join(lines) + "\n"
    base = report["base_metrics"]
    lines += ["| metric | base model | adapter | change |", "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {base[k]:.4f} | {adapter[k]:.4f} | {adapter[k] - base[k]:+.4f} |" for k in adapter if k in base]
    counts = report["counts"]
    lines += [
        "",
        f"Improvements (base wrong, adapter right): {counts['improvements']}  ",
        f"Regressions (base right, adapter wrong): {counts['regressions']}  ",
        f"Both wrong: {counts['both_wrong']}  ",
        f"Both right: {counts['both_right']}  ",
        f"Failed (a reward of either side failed; compared for neither): {counts['failed']}",
        "",
    ]
    for name, title in LISTED.items():
        lines += [f"## {title} ({counts[name]})", ""]
        if report[name]:
            lines += ["| # | prompt | answer | base model | adapter |", "| --- | --- | --- | --- | --- |"]
            lines += [
                f"| {r['index']} | {_cut(r['prompt'])} | {_cut(r['answer'])} | {_cut(r['base'])} | "
                f"{_cut(r['adapter'])} |"
                for r in report[name]
            ]
        lines.append("")
    return "\n".join(lines)


def write_reports(report: dict[str, Any], out_dir: str | Path, stem: str = "compare") -> tuple[Path, Path]:
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, md_path = folder / f"{stem}.json", folder / f"{stem}.md"
    json_path.write_text(json.dumps(json_safe(report), indent=2, allow_nan=False) + "\n")
    md_path.write_text(markdown(report))
    return md_path, json_path
