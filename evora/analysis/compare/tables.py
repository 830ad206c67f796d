"""`evora compare`, tables: the runs table, the consistency table and the tables strategies add
(their compare hook's `CompareTable`), as compare.md, compare.json and rich tables."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from evora.analysis.compare.collect import RunRow, matched_run
from evora.analysis.compare.decoding import (
    DECODING_COLUMNS,
    DECODING_TEXT,
    decoding_cells,
    decoding_lines,
    shows_decoding,
)
from evora.analysis.compare.spread import consistency, front_flags, has_spread, plane_point
from evora.analysis.hooks import entry_of
from evora.strategies.analysis_hooks import CompareTable
from evora.strategies.registry import entries

MARKDOWN = "compare.md"
JSON = "compare.json"
PLOT = Path("plots") / "compare.png"
REWARD_KL_PLOT = Path("plots") / "reward_kl.png"
CONSISTENCY_PLOT = Path("plots") / "consistency.png"
COLUMNS = (
    "run",
    "strategy",
    "base",
    "final",
    "best held-out reward",
    "best held-out KL",
    "kept skills",
    "front",
    "search FLOPs",
    "search tokens",
    "search s",
    "tokens generated",
    "wall-clock s",
)
CONSISTENCY_COLUMNS = ("strategy", "task", "model", "n", "mean", "std", "min", "max")
TEXT_COLUMNS = ("strategy", "task", "model")  # left-justified in the rich tables


# ---- cells -----------------------------------------------------------------------------


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _flops(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _plain(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _kl(value: float | None) -> str:
    # Significant digits, not decimals: KL runs from 1e-4 (a small step) to several nats.
    return "-" if value is None else f"{value:.4g}"


def _kept(row: RunRow) -> str:
    """The benchmarks' mean difference from the base model (`evora eval benchmarks=...`), or "-"."""
    if row.kept_skills is None:
        return "-"
    return f"{row.kept_skills:+.3f} ({row.kept_skills_n} metric{'s' * (row.kept_skills_n != 1)})"


def _front(flag: bool | None) -> str:
    return "-" if flag is None else ("yes" if flag else "no")


def cells(row: RunRow, front: bool | None = None) -> list[str]:
    """The row as text, in COLUMNS order; "-" where a value is missing (an unfinished run, no KL)."""
    return [
        row.name,
        row.strategy or "-",
        _reward(row.base),
        _reward(row.final),
        _reward(row.best),
        _kl(row.best_kl),
        _kept(row),
        _front(front),
        _flops(row.flops_search),
        _plain(row.tokens_search),
        _plain(row.seconds_search, 1),
        _plain(row.tokens_generated),
        _plain(row.seconds_total, 1),
    ]


def consistency_cells(group: dict[str, Any]) -> list[str]:
    """A consistency group as text, in CONSISTENCY_COLUMNS order."""
    stats = [_reward(group[key]) for key in ("mean", "std", "min", "max")]
    return [group["strategy"], group["task"], group["model"], str(group["n"]), *stats]


# ---- the strategies' tables --------------------------------------------------------------


def _strategy_of(row: RunRow) -> str | None:
    entry = entry_of(row.strategy)
    return None if entry is None else entry.name


def strategy_tables(rows: list[RunRow]) -> list[tuple[str, CompareTable]]:
    """(strategy, its table) for every compared strategy that adds one, in order of first appearance."""
    found: dict[str, CompareTable] = {}
    for row in rows:
        entry = entry_of(row.strategy)
        if entry is None:
            continue
        compare = entry.analysis_hooks().compare
        if compare is not None and compare.table is not None:
            found.setdefault(entry.name, compare.table)
    return list(found.items())


def table_cells(table: CompareTable, strategy: str, row: RunRow) -> list[str]:
    return [row.name, *table.cells(row, _strategy_of(row) == strategy)]


def table_record(table: CompareTable, strategy: str, row: RunRow, rows: list[RunRow]) -> dict[str, Any]:
    """One row of a strategy's table as compare.json stores it, with the run it is compute-matched to."""
    matched = matched_run(row, rows)
    return {
        "run": row.name,
        **table.record(row, _strategy_of(row) == strategy),
        "matched": matched.name if matched else row.matched,
        "matched_by": row.matched_by,
    }


# ---- markdown ----------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def md_table(columns: tuple[str, ...], body: list[list[str]]) -> list[str]:
    head = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    return head + ["| " + " | ".join(_md_cell(c) for c in line) + " |" for line in body]


def _run_line(row: RunRow) -> str:
    about = ", ".join(v for v in (row.strategy, row.task, row.model) if v) or "-"
    if row.best is None:
        return f"- `{row.name}` ({about}): {row.status}, no best held-out reward yet"
    when = "" if row.best_generation is None else f" at generation {row.best_generation}"
    kl = "" if row.best_kl is None else f", held-out KL {_kl(row.best_kl)}"
    return (
        f"- `{row.name}` ({about}): best held-out reward {_reward(row.best)}{when}, "
        f"after {_flops(row.best_flops)} search FLOPs{kl}"
    )


def _leader_line(rows: list[RunRow]) -> str:
    done = [row for row in rows if row.best is not None]
    if not done:
        return "No run has a best held-out reward yet."
    top = max(row.best for row in done if row.best is not None)
    leaders = [row for row in done if row.best == top]  # ties: every run that reached it
    names = ", ".join(f"`{row.name}` ({_flops(row.best_flops)} search FLOPs)" for row in leaders)
    return f"Highest best held-out reward: {_reward(top)}, reached by {names}."


def _names(rows: list[RunRow]) -> str:
    return ", ".join(f"`{row.name}`" for row in rows)


def _plane_lines(rows: list[RunRow]) -> list[str]:
    """What the reward-KL figure shows, which runs are on the front and which it leaves out."""
    lines = [
        "## Reward-KL plane",
        "",
        f"`{REWARD_KL_PLOT.as_posix()}`: each run's best adapter, held-out reward against its mean per-token "
        "KL(adapter || base) on the held-out completions; the base model sits at KL 0. The front, per task "
        "(and held-out decoding: greedy and sampled rewards are different measurements), holds every run "
        "that no other run beats: none has reward >= and KL <=, one of them strictly "
        "(runs that tie are both on it). It is drawn as a step line, its points ringed.",
        "",
    ]
    on = [row for row, flag in zip(rows, front_flags(rows)) if flag]
    lines.append(f"On the front: {_names(on)}." if on else "No run reports a held-out KL: the plane shows no run.")
    left = [row for row in rows if plane_point(row) is None]
    if left:
        lines.append(f"Left out of the plane (no held-out KL: an older or unfinished run): {_names(left)}.")
    return lines


def _consistency_lines(found: list[dict[str, Any]]) -> list[str]:
    """The spread of the best held-out reward per strategy, only when some strategy has several runs."""
    if not has_spread(found):
        return []
    return [
        "## Consistency across runs",
        "",
        "Best held-out reward over the runs of each strategy, task and model (e.g. a sweep over seeds); "
        f"std is the sample standard deviation (n - 1). Figure: `{CONSISTENCY_PLOT.as_posix()}`.",
        "",
        *md_table(CONSISTENCY_COLUMNS, [consistency_cells(group) for group in found]),
    ]


def _spent(row: RunRow) -> str:
    """A run's search compute in all three measures a run can be matched by."""
    return (
        f"{_flops(row.flops_search)} FLOPs, {_plain(row.tokens_search)} tokens, "
        f"{_plain(row.seconds_search, 1)} s of search"
    )


def _matched_line(row: RunRow, rows: list[RunRow]) -> str:
    other = matched_run(row, rows)
    against = "" if other is None else f"; `{other.name}` spent {_spent(other)}"
    named = f"`{other.name}`" if other else f"`{row.matched}` (not compared here)"
    return f"- `{row.name}` is compute-matched to {named} by {row.matched_by}: {_spent(row)}{against}."


def strategy_table_lines(rows: list[RunRow]) -> list[str]:
    """The sections the compared strategies add (compare.md, a sweep's report.md): each table, then
    the compute-matched baselines beside it; [] when no compared strategy adds a table."""
    lines: list[str] = []
    for strategy, table in strategy_tables(rows):
        body = [table_cells(table, strategy, row) for row in rows]
        lines += [*([""] if lines else []), table.heading, "", table.intro, ""]
        lines += md_table(("run", *table.columns), body)
        lines += [*([""] if any(row.matched for row in rows) else [])]
        lines += [_matched_line(row, rows) for row in rows if row.matched]
    return lines


def markdown(rows: list[RunRow]) -> str:
    body = [cells(row, flag) for row, flag in zip(rows, front_flags(rows))]
    lines = ["# Held-out reward, KL and search compute", "", *md_table(COLUMNS, body)]
    lines += ["", _leader_line(rows), "", *(_run_line(row) for row in rows)]
    lines += ["", *_plane_lines(rows)]
    sections = (_consistency_lines(consistency(rows)), decoding_lines(rows, md_table), strategy_table_lines(rows))
    for section in sections:
        if section:
            lines += ["", *section]
    return "\n".join(lines) + "\n"


# ---- compare.json ------------------------------------------------------------------------


def _compare_keys() -> list[str]:
    """Every registered strategy's compare values: each run's entry carries them all (None where absent)."""
    keys: list[str] = []
    for entry in entries():
        compare = entry.analysis_hooks().compare
        keys += [key for key in (compare.keys if compare else ()) if key not in keys]
    return keys


def _run_record(row: RunRow, keys: list[str], flag: bool | None) -> dict[str, Any]:
    record = {k: v for k, v in asdict(row).items() if k not in ("arm", "extra")}
    extra = {key: row.extra.get(key) for key in keys}
    return {**record, **extra, **{key: value for key, value in row.extra.items() if key not in extra}, "front": flag}


def compare_json(rows: list[RunRow]) -> dict[str, Any]:
    """compare.json: every row's fields and its front flag, the runs left out of the plane, the
    spreads, and each compared strategy's table (only beside such a run: other comparisons keep their keys)."""
    keys = _compare_keys()
    runs = [{**_run_record(row, keys, flag), "path": str(row.path)} for row, flag in zip(rows, front_flags(rows))]
    data: dict[str, Any] = {
        "runs": runs,
        "reward_kl_left_out": [row.name for row in rows if plane_point(row) is None],
        "consistency": consistency(rows),
    }
    if shows_decoding(rows):
        data["decoding"] = [dict(zip(DECODING_COLUMNS, decoding_cells(row))) for row in rows]
    for strategy, table in strategy_tables(rows):
        data[table.json_key] = [table_record(table, strategy, row, rows) for row in rows]
    return data


# ---- rich --------------------------------------------------------------------------------


def _rich_table(title: str, columns: tuple[str, ...], body: list[list[str]], left: tuple[str, ...] = ()) -> Any:
    from rich.table import Table

    table = Table(title=title)
    table.add_column(columns[0], no_wrap=True)  # a run name is what one copies; never split it
    for column in columns[1:]:
        table.add_column(column, justify="left" if column in TEXT_COLUMNS + left else "right")
    for line in body:
        table.add_row(*line)
    return table


def print_table(rows: list[RunRow], console: Any = None) -> None:
    """The runs table; then the consistency table when a strategy has several runs; then the
    compared strategies' own tables."""
    from rich.console import Console

    body = [cells(row, flag) for row, flag in zip(rows, front_flags(rows))]
    title = "held-out reward, KL from the base model and search compute"
    if console is None:
        # Piped or in a log, rich would assume 80 columns and cut every cell short.
        console = Console()
        console = Console(width=None if console.is_terminal else 200)
    console.print(_rich_table(title, COLUMNS, body))
    found = consistency(rows)
    if has_spread(found):
        spread = [consistency_cells(group) for group in found]
        console.print(_rich_table("consistency across runs: best held-out reward", CONSISTENCY_COLUMNS, spread))
    if shows_decoding(rows):
        decoded = [decoding_cells(row) for row in rows]
        console.print(_rich_table("decoding, KL penalty and held-out pass@k", DECODING_COLUMNS, decoded, DECODING_TEXT))
    for strategy, table in strategy_tables(rows):
        own = [table_cells(table, strategy, row) for row in rows]
        console.print(_rich_table(table.title, ("run", *table.columns), own, table.left))
