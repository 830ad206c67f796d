"""What a strategy adds to `evora analyze`, `evora compare` and the run report: its own figures,
report sections, findings and compare table (docs/architecture.md, "The strategy contract").

`evora.analysis` names no strategy. It reads a run folder's common files (config.yaml,
eval/summary.json, metrics.jsonl, lineage.jsonl), hands them to the hooks of the run's registry
entry as a `RunData`, and renders what the hooks return. A hook that needs a file of its own
strategy (trials.jsonl, routing.json, ...) reads it from `RunData.path` with `read_jsonl` /
`read_json`. Hooks live in the strategy's folder and sit below the analysis layer: they import
no evora.analysis, evora.tracking, evora.distributed or evora.engines (matplotlib, numpy and json
are fine), so registering a strategy never pulls in the analysis or Ray.

    register_strategy("mine", ..., analysis=Analysis(figures=my_figures, titles={"mine_x": "My x"}))
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

Record = dict[str, Any]
FigureMaker = Callable[[], Any]  # draws a matplotlib Figure when called


@dataclass(frozen=True)
class RunData:
    """A run folder's common files, read once by the analysis layer."""

    path: Path
    config: Mapping[str, Any]  # config.yaml ({} when absent)
    summary: Mapping[str, Any]  # eval/summary.json ({} when the run did not finish)
    metrics: list[Record]  # metrics.jsonl
    lineage: list[Record]  # lineage.jsonl


class CompareRow(Protocol):
    """What a compare table hook may read of a compared run (evora.analysis.compare's RunRow)."""

    @property
    def name(self) -> str: ...
    @property
    def strategy(self) -> str | None: ...
    @property
    def best_accuracy(self) -> float | None: ...  # the best adapter's held-out accuracy and tokens per example
    @property
    def best_tokens(self) -> float | None: ...
    @property
    def matched(self) -> str | None: ...  # strategy.match of a compute-matched baseline
    @property
    def extra(self) -> Mapping[str, Any]: ...  # its own strategy's `Compare.fields` values ({} for others)


@dataclass(frozen=True)
class CompareTable:
    """A table `evora compare` adds (markdown, rich, compare.json) when a run of the strategy is
    compared. It has a row for every compared run, so baselines stand beside the strategy's runs:
    `cells(row, mine)` / `record(row, mine)` get `mine=False` for another strategy's run. The
    analysis puts the run's name first, and lists compute-matched baselines under the table."""

    heading: str  # markdown heading, e.g. "## My conditions"
    intro: str  # the paragraph under it
    title: str  # the rich table's title
    json_key: str  # compare.json key holding the records
    columns: tuple[str, ...]  # labels after "run"
    cells: Callable[[CompareRow, bool], list[str]]  # one text per column
    record: Callable[[CompareRow, bool], dict[str, Any]]  # compare.json's entry (after "run")
    left: tuple[str, ...] = ()  # text columns, left-justified in the rich table


@dataclass(frozen=True)
class Compare:
    """Extra per-run values of the strategy's runs, and what `evora compare` shows of them."""

    fields: Callable[[Mapping[str, Any], Mapping[str, Any] | None], dict[str, Any]]  # (config, summary | None)
    keys: tuple[str, ...]  # the keys `fields` returns: every run's compare.json entry carries them (None if absent)
    arm: str | None = None  # a key whose value makes runs different arms, not repeats, in the consistency groups
    table: CompareTable | None = None


@dataclass(frozen=True)
class Analysis:
    """A strategy's analysis hooks; every field is optional."""

    figures: Callable[[RunData], dict[str, FigureMaker]] | None = None  # plot name -> maker, the run has data for
    omit_figures: tuple[str, ...] = ()  # generic figures that do not fit the strategy's files (e.g. "lineage")
    titles: Mapping[str, str] = field(default_factory=dict)  # plot name -> the report's heading
    report: Callable[[RunData], list[str]] | None = None  # markdown lines after the final metrics
    findings: Callable[[RunData], list[str]] | None = None  # sentences added to the report's findings
    compare: Compare | None = None


NO_ANALYSIS = Analysis()


def read_jsonl(path: Path) -> list[Record]:
    """A JSONL file's records; [] when it does not exist."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_json(path: Path) -> Any:
    """A JSON file's document; None when it does not exist."""
    return json.loads(path.read_text()) if path.exists() else None


def number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def count(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def decimals(value: float | None, digits: int = 4) -> str:
    """A table cell: "-" for a missing value."""
    return "-" if value is None else f"{value:.{digits}f}"
