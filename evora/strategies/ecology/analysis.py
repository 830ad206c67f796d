"""The ecology's analysis hooks (analysis_hooks.Analysis): its figures (`plots.py`), the run
report's "Ecology" section, and `evora compare`'s conditions table (frozen / single / full, with
baselines beside them: episodes, mean ROI, merges, QD coverage, held-out accuracy and tokens per
episode). Plain data in, markdown and numbers out: no evora.analysis or evora.tracking here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evora.strategies.analysis_hooks import (
    Analysis,
    Compare,
    CompareRow,
    CompareTable,
    FigureMaker,
    RunData,
    count,
    decimals,
    number,
)
from evora.strategies.ecology.plots import TITLES, ecology_figures

KEYS = (
    "condition",  # frozen | single | full (from config.yaml while the run is unfinished)
    "episodes",
    "mean_roi",
    "births",
    "merges",
    "retirements",
    "qd_coverage",
    "portfolio_accuracy",  # the routed portfolio, held-out
    "portfolio_tokens",
    "single_best_accuracy",  # the best single organelle, held-out
)
CONDITION_COLUMNS = (
    "condition",
    "episodes",
    "mean ROI",
    "merges",
    "QD coverage",
    "held-out accuracy",
    "held-out cost (tokens/episode)",
)


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


# ---- the run report ----------------------------------------------------------------------


def report_section(run: RunData) -> list[str]:
    """The run's totals, its routed portfolio against the single best organelle and the base model
    on held-out, and the routing map; [] before the run has a summary."""
    details = run.summary.get("details") or {}
    if "condition" not in details:
        return []
    energy = details.get("energy") or {}
    return [
        "## Ecology",
        "",
        f"Condition `{details['condition']}`: {_fmt(details.get('episodes'))} episodes, mean ROI "
        f"{_fmt(details.get('mean_roi'))} per episode; births {_fmt(details.get('births'))} "
        f"(merges {_fmt(details.get('merges'))}), retirements {_fmt(details.get('retirements'))}, "
        f"{_fmt(details.get('population'))} organelles alive at the end; "
        f"QD coverage {_fmt(details.get('qd_coverage'))}.",
        f"Energy: {_fmt(energy.get('start'))} at the start, {_fmt(energy.get('end'))} at the end "
        f"({_fmt(energy.get('earned'))} earned, {_fmt(energy.get('spent'))} spent, "
        f"{_fmt(energy.get('retired'))} left with the retired).",
        "",
        *_heldout(run.summary, details),
        "",
        _routing_line(details.get("routing") or {}),
        "",
    ]


def _heldout(summary: Mapping[str, Any], details: Mapping[str, Any]) -> list[str]:
    single = details.get("single_best") or {}
    rows = (
        ("routed portfolio", details.get("portfolio") or {}),
        (f"single best organelle (`{single.get('id', '-')}`)", single),
        ("base model", summary.get("base") or {}),
    )
    lines = ["| held-out | reward | accuracy | tokens per episode |", "| --- | --- | --- | --- |"]
    return lines + [
        f"| {name} | {_fmt(m.get('reward'))} | {_fmt(m.get('accuracy'))} | {_fmt(m.get('tokens'))} |"
        for name, m in rows
    ]


def _routing_line(routing: Mapping[str, Any]) -> str:
    if not routing:
        return "No routing map in the summary."
    pairs = ", ".join(f"`{family}` -> `{member}`" for family, member in routing.items())
    # "default" serves families the selection split never showed (e.g. held-out-only families).
    return f"Routing map (family -> organelle, `routing.json`; `default` serves unseen families): {pairs}."


def figures(run: RunData) -> dict[str, FigureMaker]:
    return ecology_figures(run.path, run.metrics)


# ---- evora compare: the conditions table --------------------------------------------------


def compare_fields(config: Mapping[str, Any], summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """An ecology run's values for the conditions table, from its summary's details."""
    section = config.get("strategy")
    strategy: Mapping[str, Any] = section if isinstance(section, dict) else {}
    details = (summary or {}).get("details") or {}
    portfolio, single = details.get("portfolio") or {}, details.get("single_best") or {}
    condition = details.get("condition", strategy.get("condition"))
    return {
        "condition": None if condition is None else str(condition),
        "episodes": count(details.get("episodes")),
        "mean_roi": number(details.get("mean_roi")),
        "births": count(details.get("births")),
        "merges": count(details.get("merges")),
        "retirements": count(details.get("retirements")),
        "qd_coverage": number(details.get("qd_coverage")),
        "portfolio_accuracy": number(portfolio.get("accuracy")),
        "portfolio_tokens": number(portfolio.get("tokens")),
        "single_best_accuracy": number(single.get("accuracy")),
    }


def condition_label(row: CompareRow, mine: bool) -> str:
    """An ecology's condition; any other run's strategy, marked when it is compute-matched."""
    if mine:
        return row.extra.get("condition") or "-"
    name = row.strategy or "-"
    return f"{name} (matched)" if row.matched else name


def heldout_accuracy(row: CompareRow, mine: bool) -> float | None:
    # What an ecology answers with is its routed portfolio; any other run's is its best adapter.
    return row.extra.get("portfolio_accuracy") if mine else row.best_accuracy


def heldout_tokens(row: CompareRow, mine: bool) -> float | None:
    """Held-out cost: mean tokens generated per example (an ecology's episode), as accuracy picks it."""
    return row.extra.get("portfolio_tokens") if mine else row.best_tokens


def condition_record(row: CompareRow, mine: bool) -> dict[str, Any]:
    """One conditions-table row as compare.json stores it; None where the run has no such value."""
    return {
        "condition": condition_label(row, mine),
        "ecology": mine,
        "episodes": row.extra.get("episodes"),
        "mean_roi": row.extra.get("mean_roi"),
        "merges": row.extra.get("merges"),
        "qd_coverage": row.extra.get("qd_coverage"),
        "heldout_accuracy": heldout_accuracy(row, mine),
        "heldout_tokens": heldout_tokens(row, mine),
    }


def condition_cells(row: CompareRow, mine: bool) -> list[str]:
    """The row in CONDITION_COLUMNS order; another strategy's run has "-" in the ecology's own columns."""
    extra = row.extra
    return [
        condition_label(row, mine),
        decimals(extra.get("episodes"), 0),
        decimals(extra.get("mean_roi")),
        decimals(extra.get("merges"), 0),
        decimals(extra.get("qd_coverage")),
        decimals(heldout_accuracy(row, mine)),
        decimals(heldout_tokens(row, mine), 2),
    ]


CONDITIONS = CompareTable(
    heading="## Ecology conditions",
    intro=(
        "The ecology work's conditions: `frozen` (the base model only), `single` (one adapter, no ecology), "
        "`full`; baselines beside them. Held-out accuracy and cost (mean tokens generated per episode) are the "
        "routed portfolio's for an ecology run and the best adapter's for any other run; episodes, mean ROI "
        '(per episode), merges and QD coverage are the ecology\'s own ("-" for other runs).'
    ),
    title="ecology conditions (held-out: the routed portfolio)",
    json_key="conditions",
    columns=CONDITION_COLUMNS,
    cells=condition_cells,
    record=condition_record,
    left=("condition",),
)

ANALYSIS = Analysis(
    figures=figures,
    # Its lineage.jsonl holds only births (no fitness): the ancestry figure draws them instead.
    omit_figures=("lineage", "mutations"),
    titles=TITLES,
    report=report_section,
    # An ecology's conditions are different arms, not repeats of one: a sweep over them is no spread.
    compare=Compare(fields=compare_fields, keys=KEYS, arm="condition", table=CONDITIONS),
)
