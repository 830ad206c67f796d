"""`evora compare`, how each run decoded: greedy or sampled, in search and in evaluation, its
KL penalty, and its best adapter's held-out pass@1 and pass@k. The section appears when some
compared run sampled or penalised KL, so greedy and sampled runs (or a sweep over the KL
penalty) sit side by side."""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Protocol, Sequence

DECODING_COLUMNS = ("run", "strategy", "search decoding", "eval decoding", "KL penalty", "best pass@1", "best pass@k")
DECODING_TEXT = ("search decoding", "eval decoding")  # left-justified in the rich table
PASS_KEY = re.compile(r"^pass_at_(\d+)$")


class DecodedRow(Protocol):  # collect.RunRow (frozen), kept structural: collect reads its fields from here
    @property
    def name(self) -> str: ...
    @property
    def strategy(self) -> str | None: ...
    @property
    def search_decoding(self) -> str | None: ...
    @property
    def eval_decoding(self) -> str | None: ...
    @property
    def kl_penalty(self) -> float | None: ...
    @property
    def best_pass(self) -> Mapping[str, float]: ...


def decoding_text(task: Mapping[str, Any], prefix: str) -> str:
    """ "greedy", or e.g. "T=1 top_p=0.9 n=4 mean" from a run's task config (`prefix`: "" or "eval_")."""
    temperature = float(task.get(prefix + "temperature") or 0.0)
    if temperature == 0.0:
        return "greedy"
    parts = [f"T={temperature:g}"]
    top_p = float(task.get(prefix + "top_p") or 1.0)
    if top_p < 1.0:
        parts.append(f"top_p={top_p:g}")
    parts.append(f"n={int(task.get(prefix + 'samples') or 1)}")
    if not prefix:
        aggregate = str(task.get("aggregate") or "mean")
        parts.append(f"{aggregate}@{task.get('k')}" if aggregate == "pass_at_k" else aggregate)
    return " ".join(parts)


def decoding_fields(config: Mapping[str, Any], summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's decoding, its KL penalty and its best adapter's pass@k values (RunRow's fields)."""
    section = config.get("task")
    task: Mapping[str, Any] = section if isinstance(section, Mapping) else {}
    best = (summary or {}).get("best") or {}
    passes = {key: float(value) for key, value in best.items() if PASS_KEY.match(key) and value is not None}
    return {
        "search_decoding": decoding_text(task, ""),
        "eval_decoding": decoding_text(task, "eval_"),
        "kl_penalty": float(task.get("kl_penalty") or 0.0),
        "best_pass": passes,
    }


def decoding_arm(row: DecodedRow) -> str | None:
    """What sets a run's decoding apart from greedy without a KL penalty ("search T=1 n=2 mean,
    eval T=1 n=4, KL 1"); None for a greedy run without one."""
    parts = [
        f"{which} {text}"
        for which, text in (("search", row.search_decoding), ("eval", row.eval_decoding))
        if text not in (None, "greedy")
    ]
    if row.kl_penalty:
        parts.append(f"KL {row.kl_penalty:g}")
    return ", ".join(parts) or None


def shows_decoding(rows: Sequence[DecodedRow]) -> bool:
    return any(
        row.search_decoding not in (None, "greedy") or row.eval_decoding not in (None, "greedy") or row.kl_penalty
        for row in rows
    )


def _pass_at(row: DecodedRow, which: str) -> str:
    values = {int(key.rpartition("_")[2]): v for key, v in row.best_pass.items()}  # keys matched PASS_KEY
    if not values:
        return "-"
    k = min(values) if which == "1" else max(values)
    return f"{values[k]:.4f}" if which == "1" else f"{values[k]:.4f} (k={k})"


def decoding_cells(row: DecodedRow) -> list[str]:
    return [
        row.name,
        row.strategy or "-",
        row.search_decoding or "-",
        row.eval_decoding or "-",
        "-" if row.kl_penalty is None else f"{row.kl_penalty:g}",
        _pass_at(row, "1"),
        _pass_at(row, "k"),
    ]


def decoding_lines(
    rows: Sequence[DecodedRow], md_table: Callable[[tuple[str, ...], list[list[str]]], list[str]]
) -> list[str]:
    """The markdown section; [] when every run decoded greedily without a KL penalty."""
    if not shows_decoding(rows):
        return []
    return [
        "## Decoding",
        "",
        "How each run decoded in search and on held-out, its `task.kl_penalty`, and its best adapter's held-out "
        "pass@1 (the mean over samples) and pass@k (the unbiased estimator from `task.eval_samples` samples).",
        "",
        *md_table(DECODING_COLUMNS, [decoding_cells(row) for row in rows]),
    ]
