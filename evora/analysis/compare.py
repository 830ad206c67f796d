"""`evora compare <run or sweep folder> ...`: runs side by side, from their files only.

Each run becomes a `RunRow` (its eval/summary.json headline numbers, its best adapter's held-out
KL from the base model, and its held-out reward against search compute, from metrics.jsonl).
`write_compare` writes compare.md, compare.json and, under plots/, compare.png (reward against
compute), reward_kl.png (the reward-KL plane and its front) and, when a strategy has several runs
(a sweep over seeds), consistency.png; `print_table` prints the same tables. When an ecology run is
among them, the tables add the ecology's conditions (frozen / single / full, baselines beside them:
episodes, mean ROI, merges, QD coverage, held-out accuracy and tokens per episode). No Ray, vLLM or
W&B here: this runs on a laptop over copied run folders.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib
import yaml

matplotlib.use("Agg")  # files only, never a window; also works without a display
# Figure() objects are used directly (not pyplot), so nothing is kept in a global registry.

from matplotlib.figure import Figure

from evora.errors import ConfigError
from evora.tracking.metrics import read_metrics
from evora.tracking.run_dir import CONFIG_FILE
from evora.tracking.summary import headline, read_summary

# evora.tracking.sweep names this file too, but importing it would pull in Hydra.
SWEEP_SUMMARY = "sweep_summary.json"
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
    "front",
    "search FLOPs",
    "tokens generated",
    "tokens trained",
    "wall-clock s",
)
CONSISTENCY_COLUMNS = ("strategy", "task", "model", "n", "mean", "std", "min", "max")
# The ecology work's conditions table (frozen / single / full, and baselines beside them).
CONDITION_COLUMNS = (
    "run",
    "condition",
    "episodes",
    "mean ROI",
    "merges",
    "QD coverage",
    "held-out accuracy",
    "held-out cost (tokens/episode)",
)
ECOLOGY = "ecology"
LOG_SPAN = 100.0  # positive FLOPs spanning more than this factor get a log x axis
LABEL_MAX = 8  # the reward-KL plane names its points only up to this many; more would be unreadable
MARKERS = "osD^vPX*"
Point = tuple[float, float]
Group = tuple[str, str, str]  # (strategy, task, model): runs whose rewards can be compared as a spread


@dataclass(frozen=True)
class RunRow:
    """One run: what its summary says (None where it did not finish) and its held-out curve."""

    name: str
    path: Path
    strategy: str | None
    task: str | None
    model: str | None
    status: str  # finished | unfinished
    base: float | None
    final: float | None
    best: float | None
    best_generation: int | None
    flops_search: float | None
    flops_evaluation: float | None
    tokens_generated: int | None
    tokens_trained: int | None
    seconds_total: float | None
    curve: tuple[Point, ...]  # (cumulative search FLOPs, held-out reward)
    best_flops: float | None = None  # search FLOPs spent when the best adapter was found
    best_kl: float | None = None  # mean per-token KL(best adapter || base), held-out; None in older runs
    final_kl: float | None = None
    # The conditions table: an ecology run's summary details (None for other runs and unfinished ones).
    condition: str | None = None  # frozen | single | full (from config.yaml while the run is unfinished)
    episodes: int | None = None
    mean_roi: float | None = None
    births: int | None = None
    merges: int | None = None
    retirements: int | None = None
    qd_coverage: float | None = None
    portfolio_accuracy: float | None = None  # the routed portfolio, held-out
    portfolio_tokens: float | None = None
    single_best_accuracy: float | None = None  # the best single organelle, held-out
    # Every run: its best adapter's held-out accuracy and tokens per example (an ecology's episode).
    best_accuracy: float | None = None
    best_tokens: float | None = None
    matched: str | None = None  # strategy.match: the run a compute-matched baseline spent as much as
    matched_by: str | None = None  # strategy.match_by: flops | tokens | seconds


# ---- collecting ---------------------------------------------------------------------


def _is_run(folder: Path) -> bool:
    return folder.is_dir() and (folder / CONFIG_FILE).is_file()


def _is_sweep(folder: Path) -> bool:
    return folder.is_dir() and (folder / SWEEP_SUMMARY).is_file()


def _job_key(folder: Path) -> tuple[int, int, str]:
    # Hydra numbers jobs 0, 1, ... 10: numeric order, not 0, 1, 10, 2.
    return (0, int(folder.name), "") if folder.name.isdigit() else (1, 0, folder.name)


def sweep_jobs(sweep: Path) -> list[Path]:
    """The sweep's job run folders (every subfolder with a config.yaml), in job order."""
    return sorted((p for p in sweep.iterdir() if _is_run(p)), key=_job_key)


def _named_runs(folder: Path) -> list[tuple[str, Path]]:
    """(name, run folder) for one argument: a run, or every job of a sweep."""
    if _is_run(folder):  # a run wins: a run folder is never also a sweep
        return [(folder.name, folder)]
    if _is_sweep(folder):
        jobs = sweep_jobs(folder)
        if not jobs:
            raise ConfigError(f"{folder}: sweep folder with no job runs (no <job>/{CONFIG_FILE})")
        return [(f"{folder.name}/{job.name}", job) for job in jobs]
    if not folder.exists():
        raise ConfigError(f"{folder}: no such folder")
    raise ConfigError(f"{folder}: not a run folder (no {CONFIG_FILE}) nor a sweep folder (no {SWEEP_SUMMARY})")


def _config_name(config: dict[str, Any], key: str) -> str | None:
    section = config.get(key)
    name = section.get("name") if isinstance(section, dict) else None
    return None if name is None else str(name)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def metrics_curve(metrics: list[dict[str, Any]]) -> list[Point]:
    """(cumulative_flops, heldout_reward) of every record that has both, one per generation."""
    by_generation: dict[Any, Point] = {}
    for record in metrics:
        flops, reward = _number(record.get("cumulative_flops")), _number(record.get("heldout_reward"))
        if flops is not None and reward is not None:
            by_generation[record.get("generation")] = (flops, reward)  # a repeated generation: the last wins
    return sorted(by_generation.values(), key=lambda point: point[0])


def _curve(
    metrics: list[dict[str, Any]], base: float | None, best: float | None, flops: float | None
) -> tuple[Point, ...]:
    points = metrics_curve(metrics)
    # PBT evaluates held-out only at the end: base at zero compute, best at the search's total.
    if len(points) < 2 and base is not None and best is not None and flops is not None:
        return ((0.0, base), (flops, best))
    return tuple(points)


def _best_flops(metrics: list[dict[str, Any]], generation: int | None, flops_search: float | None) -> float | None:
    """Search FLOPs spent up to the best's generation; the search's total when metrics do not say."""
    at = [
        _number(r.get("cumulative_flops"))
        for r in metrics
        if generation is not None and r.get("generation") == generation
    ]
    found = [f for f in at if f is not None]
    return found[-1] if found else flops_search


def _ecology_fields(config: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    """RunRow's ecology fields from the summary's details; {} for a run that is not an ecology."""
    strategy = config.get("strategy") if isinstance(config.get("strategy"), dict) else {}
    details = (summary or {}).get("details") or {}
    if "condition" not in details and strategy.get("name") != ECOLOGY:
        return {}
    portfolio, single = details.get("portfolio") or {}, details.get("single_best") or {}
    condition = details.get("condition", strategy.get("condition"))
    return {
        "condition": None if condition is None else str(condition),
        "episodes": _count(details.get("episodes")),
        "mean_roi": _number(details.get("mean_roi")),
        "births": _count(details.get("births")),
        "merges": _count(details.get("merges")),
        "retirements": _count(details.get("retirements")),
        "qd_coverage": _number(details.get("qd_coverage")),
        "portfolio_accuracy": _number(portfolio.get("accuracy")),
        "portfolio_tokens": _number(portfolio.get("tokens")),
        "single_best_accuracy": _number(single.get("accuracy")),
    }


def _matched_fields(config: dict[str, Any]) -> dict[str, Any]:
    """strategy.match / match_by of a compute-matched baseline (SFT, GRPO); {} when it matches nothing."""
    strategy = config.get("strategy") if isinstance(config.get("strategy"), dict) else {}
    if not strategy.get("match"):
        return {}
    return {"matched": str(strategy["match"]), "matched_by": str(strategy.get("match_by") or "flops")}


def read_row(name: str, run: Path) -> RunRow:
    config = yaml.safe_load((run / CONFIG_FILE).read_text()) or {}
    summary = read_summary(run)
    metrics = read_metrics(run)
    compute = (summary or {}).get("compute", {})
    search, evaluation = compute.get("search", {}), compute.get("evaluation", {})
    base, best = headline(summary, "base"), headline(summary, "best")
    flops_search = _number(search.get("flops"))
    best_generation = _count((summary or {}).get("best_generation"))
    return RunRow(
        name=name,
        path=run,
        # The config names it; a summary (sft, grpo, es, ...) still does when the config lacks a name.
        strategy=_config_name(config, "strategy") or (summary or {}).get("strategy"),
        task=_config_name(config, "task"),
        model=_config_name(config, "model"),
        status="finished" if summary else "unfinished",
        base=base,
        final=headline(summary, "final"),
        best=best,
        best_generation=best_generation,
        flops_search=flops_search,
        flops_evaluation=_number(evaluation.get("flops")),
        tokens_generated=_count(search.get("tokens_generated")),
        tokens_trained=_count(search.get("tokens_trained")),
        seconds_total=_number(compute.get("seconds", {}).get("total")),
        curve=_curve(metrics, base, best, flops_search),
        best_flops=_best_flops(metrics, best_generation, flops_search) if summary else None,
        best_kl=headline(summary, "best", "kl"),
        final_kl=headline(summary, "final", "kl"),
        best_accuracy=headline(summary, "best", "accuracy"),
        best_tokens=headline(summary, "best", "tokens"),
        **_ecology_fields(config, summary),
        **_matched_fields(config),
    )


def collect(folders: list[Path]) -> list[RunRow]:
    """One row per run, in argument order; a sweep contributes its jobs. Raises ConfigError."""
    if not folders:
        raise ConfigError("evora compare: give at least one run or sweep folder")
    named: dict[Path, str] = {}
    for folder in folders:
        for name, run in _named_runs(Path(folder)):
            named.setdefault(run.resolve(), name)  # a run given twice (alone and in its sweep) is one row
    return [read_row(name, run) for run, name in named.items()]


# ---- reward-KL front and consistency across runs --------------------------------------


def plane_point(row: RunRow) -> Point | None:
    """(best adapter's held-out KL, best held-out reward); None when either is unknown."""
    if row.best is None or row.best_kl is None:
        return None
    return (row.best_kl, row.best)


def pareto(points: list[Point]) -> list[bool]:
    """Per (kl, reward): True when no other point has reward >= and KL <=, one of them strictly."""
    # q differs from p and is no worse on either axis, so it is strictly better on one.
    return [not any(q[1] >= p[1] and q[0] <= p[0] and q != p for q in points) for p in points]


def front_flags(rows: list[RunRow]) -> list[bool | None]:
    """Per row: on its task's reward-KL front or not; None where the run has no best reward or KL."""
    # Rewards of different tasks are not on one scale: each task has its own front.
    by_task: dict[str, list[tuple[int, Point]]] = {}
    for i, row in enumerate(rows):
        point = plane_point(row)
        if point is not None:
            by_task.setdefault(row.task or "-", []).append((i, point))
    flags: list[bool | None] = [None] * len(rows)
    for members in by_task.values():
        for (i, _), flag in zip(members, pareto([point for _, point in members])):
            flags[i] = flag
    return flags


def _arm(row: RunRow) -> str:
    # An ecology's conditions are different arms, not repeats of one: a sweep over them is no spread.
    if row.condition is not None:
        return f"{row.strategy or '-'} ({row.condition})"
    return row.strategy or "-"


def _groups(rows: list[RunRow]) -> dict[Group, list[RunRow]]:
    # The model is in the key too: a sweep over models is not a spread over seeds.
    groups: dict[Group, list[RunRow]] = {}
    for row in rows:
        if row.best is not None:
            groups.setdefault((_arm(row), row.task or "-", row.model or "-"), []).append(row)
    return groups


def consistency(rows: list[RunRow]) -> list[dict[str, Any]]:
    """Best held-out reward per (strategy, task, model): n, mean, std (sample, n - 1; None for one
    run), min, max and the runs, in order of first appearance."""
    out = []
    for (strategy, task, model), runs in _groups(rows).items():
        rewards = [row.best for row in runs if row.best is not None]
        out.append(
            {
                "strategy": strategy,
                "task": task,
                "model": model,
                "n": len(rewards),
                "mean": statistics.fmean(rewards),
                "std": statistics.stdev(rewards) if len(rewards) > 1 else None,
                "min": min(rewards),
                "max": max(rewards),
                "runs": [row.name for row in runs],
            }
        )
    return out


def has_spread(groups: list[dict[str, Any]]) -> bool:
    """Whether any strategy has several runs: only then is there a spread to show."""
    return any(group["n"] >= 2 for group in groups)


# ---- the ecology's conditions ----------------------------------------------------------


def is_ecology(row: RunRow) -> bool:
    return row.strategy == ECOLOGY or row.condition is not None


def has_ecology(rows: list[RunRow]) -> bool:
    """Whether the conditions table is shown: only when some compared run is an ecology."""
    return any(is_ecology(row) for row in rows)


def condition_label(row: RunRow) -> str:
    """An ecology's condition; any other run's strategy, marked when it is compute-matched."""
    if is_ecology(row):
        return row.condition or "-"
    name = row.strategy or "-"
    return f"{name} (matched)" if row.matched else name


def heldout_accuracy(row: RunRow) -> float | None:
    # What an ecology answers with is its routed portfolio; any other run's is its best adapter.
    return row.portfolio_accuracy if is_ecology(row) else row.best_accuracy


def heldout_tokens(row: RunRow) -> float | None:
    """Held-out cost: mean tokens generated per example (an ecology's episode), as accuracy picks it."""
    return row.portfolio_tokens if is_ecology(row) else row.best_tokens


def matched_run(row: RunRow, rows: list[RunRow]) -> RunRow | None:
    """The compared run that row's strategy.match names, if it is among rows."""
    if not row.matched:
        return None
    target = Path(row.matched).expanduser()
    for other in rows:
        if other.path.resolve() == target.resolve():
            return other
    # A relative match path was relative to where that run started: fall back to the last two
    # components (a sweep job is <sweep>/<n>; a lone run's folder name carries its timestamp).
    tail = target.parts[-2:]
    return next((other for other in rows if other is not row and other.path.parts[-len(tail) :] == tail), None)


def condition_row(row: RunRow, rows: list[RunRow]) -> dict[str, Any]:
    """One conditions-table row as compare.json stores it; None where the run has no such value."""
    matched = matched_run(row, rows)
    return {
        "run": row.name,
        "condition": condition_label(row),
        "ecology": is_ecology(row),
        "episodes": row.episodes,
        "mean_roi": row.mean_roi,
        "merges": row.merges,
        "qd_coverage": row.qd_coverage,
        "heldout_accuracy": heldout_accuracy(row),
        "heldout_tokens": heldout_tokens(row),
        "matched": matched.name if matched else row.matched,
        "matched_by": row.matched_by,
    }


def condition_cells(row: RunRow) -> list[str]:
    """The row in CONDITION_COLUMNS order; a non-ecology run has "-" in the ecology's own columns."""
    return [
        row.name,
        condition_label(row),
        _plain(row.episodes),
        _reward(row.mean_roi),
        _plain(row.merges),
        _reward(row.qd_coverage),
        _reward(heldout_accuracy(row)),
        _plain(heldout_tokens(row), 2),
    ]


# ---- table --------------------------------------------------------------------------


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _flops(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _plain(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _kl(value: float | None) -> str:
    # Significant digits, not decimals: KL runs from 1e-4 (a small step) to several nats.
    return "-" if value is None else f"{value:.4g}"


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
        _front(front),
        _flops(row.flops_search),
        _plain(row.tokens_generated),
        _plain(row.tokens_trained),
        _plain(row.seconds_total, 1),
    ]


def consistency_cells(group: dict[str, Any]) -> list[str]:
    """A consistency group as text, in CONSISTENCY_COLUMNS order."""
    stats = [_reward(group[key]) for key in ("mean", "std", "min", "max")]
    return [group["strategy"], group["task"], group["model"], str(group["n"]), *stats]


def _rich_table(title: str, columns: tuple[str, ...], body: list[list[str]]) -> Any:
    from rich.table import Table

    table = Table(title=title)
    table.add_column(columns[0], no_wrap=True)  # a run name is what one copies; never split it
    for column in columns[1:]:
        table.add_column(column, justify="left" if column in ("strategy", "task", "model", "condition") else "right")
    for line in body:
        table.add_row(*line)
    return table


def print_table(rows: list[RunRow], console: Any = None) -> None:
    """The runs table; then the consistency table when a strategy has several runs."""
    from rich.console import Console

    body = [cells(row, flag) for row, flag in zip(rows, front_flags(rows))]
    title = "held-out reward, KL from the base model and search compute"
    if console is None:
        # Piped or in a log, rich would assume 80 columns and cut every cell short.
        console = Console()
        console = Console(width=None if console.is_terminal else 200)
    console.print(_rich_table(title, COLUMNS, body))
    groups = consistency(rows)
    if has_spread(groups):
        spread = [consistency_cells(group) for group in groups]
        console.print(_rich_table("consistency across runs: best held-out reward", CONSISTENCY_COLUMNS, spread))
    if has_ecology(rows):
        conditions = [condition_cells(row) for row in rows]
        console.print(_rich_table("ecology conditions (held-out: the routed portfolio)", CONDITION_COLUMNS, conditions))


# ---- markdown -----------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


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


def _md_table(columns: tuple[str, ...], body: list[list[str]]) -> list[str]:
    head = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    return head + ["| " + " | ".join(_md_cell(c) for c in line) + " |" for line in body]


def _names(rows: list[RunRow]) -> str:
    return ", ".join(f"`{row.name}`" for row in rows)


def _plane_lines(rows: list[RunRow]) -> list[str]:
    """What the reward-KL figure shows, which runs are on the front and which it leaves out."""
    lines = [
        "## Reward-KL plane",
        "",
        f"`{REWARD_KL_PLOT.as_posix()}`: each run's best adapter, held-out reward against its mean per-token "
        "KL(adapter || base) on the held-out completions; the base model sits at KL 0. The front, per task, "
        "holds every run that no other run beats: none has reward >= and KL <=, one of them strictly "
        "(runs that tie are both on it). It is drawn as a step line, its points ringed.",
        "",
    ]
    on = [row for row, flag in zip(rows, front_flags(rows)) if flag]
    lines.append(f"On the front: {_names(on)}." if on else "No run reports a held-out KL: the plane shows no run.")
    left = [row for row in rows if plane_point(row) is None]
    if left:
        lines.append(f"Left out of the plane (no held-out KL: an older or unfinished run): {_names(left)}.")
    return lines


def _consistency_lines(groups: list[dict[str, Any]]) -> list[str]:
    """The spread of the best held-out reward per strategy, only when some strategy has several runs."""
    if not has_spread(groups):
        return []
    return [
        "## Consistency across runs",
        "",
        "Best held-out reward over the runs of each strategy, task and model (e.g. a sweep over seeds); "
        f"std is the sample standard deviation (n - 1). Figure: `{CONSISTENCY_PLOT.as_posix()}`.",
        "",
        *_md_table(CONSISTENCY_COLUMNS, [consistency_cells(group) for group in groups]),
    ]


def _matched_line(row: RunRow, rows: list[RunRow]) -> str:
    other = matched_run(row, rows)
    against = "" if other is None else f"; `{other.name}` spent {_flops(other.flops_search)}"
    named = f"`{other.name}`" if other else f"`{row.matched}` (not compared here)"
    return (
        f"- `{row.name}` is compute-matched to {named} by {row.matched_by}: "
        f"{_flops(row.flops_search)} search FLOPs{against}."
    )


def conditions_lines(rows: list[RunRow]) -> list[str]:
    """The ecology conditions section of compare.md (and of a sweep's report.md); [] without an ecology."""
    if not has_ecology(rows):
        return []
    return [
        "## Ecology conditions",
        "",
        "The ecology work's conditions: `frozen` (the base model only), `single` (one adapter, no ecology), "
        "`full`; baselines beside them. Held-out accuracy and cost (mean tokens generated per episode) are the "
        "routed portfolio's for an ecology run and the best adapter's for any other run; episodes, mean ROI "
        '(per episode), merges and QD coverage are the ecology\'s own ("-" for other runs).',
        "",
        *_md_table(CONDITION_COLUMNS, [condition_cells(row) for row in rows]),
        *([""] if any(row.matched for row in rows) else []),
        *(_matched_line(row, rows) for row in rows if row.matched),
    ]


def markdown(rows: list[RunRow]) -> str:
    body = [cells(row, flag) for row, flag in zip(rows, front_flags(rows))]
    lines = ["# Held-out reward, KL and search compute", "", *_md_table(COLUMNS, body)]
    lines += ["", _leader_line(rows), "", *(_run_line(row) for row in rows)]
    lines += ["", *_plane_lines(rows)]
    for section in (_consistency_lines(consistency(rows)), conditions_lines(rows)):
        if section:
            lines += ["", *section]
    return "\n".join(lines) + "\n"


def compare_json(rows: list[RunRow]) -> dict[str, Any]:
    """compare.json: every row's fields and its front flag, the runs left out of the plane, the spreads."""
    runs = [{**asdict(row), "path": str(row.path), "front": flag} for row, flag in zip(rows, front_flags(rows))]
    data = {
        "runs": runs,
        "reward_kl_left_out": [row.name for row in rows if plane_point(row) is None],
        "consistency": consistency(rows),
    }
    if has_ecology(rows):  # only beside an ecology: other comparisons keep their keys
        data["conditions"] = [condition_row(row, rows) for row in rows]
    return data


# ---- figure -------------------------------------------------------------------------


def _positive_x(rows: list[RunRow]) -> list[float]:
    return [x for row in rows for x, _ in row.curve if x > 0]


def x_scale(rows: list[RunRow]) -> str:
    """log when the positive FLOPs span more than a factor of LOG_SPAN, else linear."""
    positive = _positive_x(rows)
    return "log" if positive and max(positive) > LOG_SPAN * min(positive) else "linear"


def _placed(curve: tuple[Point, ...], floor: float | None) -> tuple[list[float], list[float]]:
    # On a log axis zero compute cannot be drawn: it goes at the smallest positive x.
    xs = [x if floor is None or x > 0 else floor for x, _ in curve]
    return xs, [y for _, y in curve]


def _bases_by_task(rows: list[RunRow]) -> dict[str, list[RunRow]]:
    by_task: dict[str, list[RunRow]] = {}
    for row in rows:
        if row.base is not None:
            by_task.setdefault(row.task or "-", []).append(row)
    return by_task


def _base_lines(ax: Any, rows: list[RunRow], colors: dict[str, str]) -> None:
    """Dotted base-model lines: one per task whose runs share one base value, else one per run."""
    for task, runs in _bases_by_task(rows).items():
        if len({row.base for row in runs}) == 1:
            ax.axhline(runs[0].base, linestyle=":", color="grey", label=f"base model ({task})")
            continue
        for row in runs:  # bases differ (another split size, seed, model): each run against its own
            ax.axhline(row.base, linestyle=":", color=colors.get(row.name, "grey"), label=f"base model ({row.name})")


def figure(rows: list[RunRow]) -> Figure:
    """Held-out reward against search FLOPs, one line per run with held-out points."""
    fig = Figure(figsize=(9, 5), layout="constrained")  # constrained: labels never overlap
    ax = fig.add_subplot()
    scale = x_scale(rows)
    floor = min(_positive_x(rows)) if scale == "log" else None
    colors: dict[str, str] = {}
    for row in rows:
        if row.curve:  # nothing measured yet: no line rather than an empty legend entry
            (line,) = ax.plot(*_placed(row.curve, floor), marker="o", label=f"{row.name} ({row.strategy or '-'})")
            colors[row.name] = line.get_color()
    _base_lines(ax, rows, colors)
    ax.set_xscale(scale)
    ax.set(title="Held-out reward against search compute", xlabel="search FLOPs", ylabel="held-out reward")
    if ax.get_lines():
        ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def strategy_styles(rows: list[RunRow]) -> dict[str, tuple[str, str]]:
    """A colour and a marker per strategy, by sorted name, so both figures draw a strategy alike."""
    names = sorted({row.strategy or "-" for row in rows})
    return {name: (f"C{i % 10}", MARKERS[i % len(MARKERS)]) for i, name in enumerate(names)}


def _plane_bases(ax: Any, rows: list[RunRow]) -> None:
    """The base model at (0, its reward): a star per distinct base value, one legend entry per task."""
    for task, runs in _bases_by_task(rows).items():
        values = sorted({row.base for row in runs if row.base is not None})
        label = f"base model ({task})" if len(values) == 1 else f"base model ({task}, {len(values)} values)"
        ax.scatter([0.0] * len(values), values, marker="*", s=180, color="grey", edgecolors="black", label=label)


def _plane_runs(ax: Any, rows: list[RunRow], styles: dict[str, tuple[str, str]]) -> None:
    """One scatter per strategy (one legend entry each); run names beside the points when few, one
    label per point (runs that land on the same point share it rather than overprint)."""
    placed = [(row, point) for row in rows if (point := plane_point(row)) is not None]
    for strategy, (color, marker) in styles.items():
        mine = [point for row, point in placed if (row.strategy or "-") == strategy]
        if mine:
            xs, ys = zip(*mine)
            ax.scatter(xs, ys, color=color, marker=marker, s=60, zorder=3, label=strategy)
    if len(placed) <= LABEL_MAX:
        names: dict[Point, list[str]] = {}
        for row, point in placed:
            names.setdefault(point, []).append(row.name)
        for point, at in names.items():
            ax.annotate(", ".join(at), point, xytext=(5, 5), textcoords="offset points", fontsize="small")


def _plane_front(ax: Any, rows: list[RunRow]) -> None:
    """Each task's front as a step line (the best reward reachable within a KL budget), points ringed."""
    by_task: dict[str, list[Point]] = {}
    for row, flag in zip(rows, front_flags(rows)):
        point = plane_point(row)
        if flag and point is not None:
            by_task.setdefault(row.task or "-", []).append(point)
    for i, points in enumerate(by_task.values()):
        xs, ys = zip(*sorted(points))
        label = "front" if i == 0 else "_front"  # one legend entry, however many tasks
        ax.plot(xs, ys, drawstyle="steps-post", color="black", linewidth=1, alpha=0.6, label=label)
        ax.scatter(xs, ys, s=240, facecolors="none", edgecolors="black", linewidths=1.5, zorder=4, label="_ring")


def reward_kl_figure(rows: list[RunRow]) -> Figure:
    """Held-out reward against held-out KL from the base model, the best adapter of every run with
    both; the base model at KL 0; the front marked. Runs without KL are left out."""
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.add_subplot()
    _plane_bases(ax, rows)
    _plane_runs(ax, rows, strategy_styles(rows))
    _plane_front(ax, rows)
    if all(plane_point(row) is None for row in rows):  # say why the plane is empty, not just leave it blank
        ax.text(0.5, 0.5, "no run reports a held-out KL", transform=ax.transAxes, ha="center", color="grey")
    ax.set(
        title="Held-out reward against KL from the base model",
        xlabel="held-out KL(adapter || base), mean per token",
        ylabel="best held-out reward",
    )
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def _group_labels(keys: list[Group]) -> list[str]:
    # Name the task and model only where they vary: a seed sweep's labels stay short.
    varies = [len({key[k] for key in keys}) > 1 for k in (1, 2)]
    return ["\n".join([key[0], *(key[k] for k in (1, 2) if varies[k - 1])]) for key in keys]


def _offsets(n: int) -> list[float]:
    # Evenly spread, not random, so the same runs always draw the same figure.
    return [0.0] if n == 1 else [-0.15 + 0.3 * k / (n - 1) for k in range(n)]


def consistency_figure(rows: list[RunRow]) -> Figure:
    """Best held-out reward per (strategy, task, model): every run a dot, a box where there are >= 2."""
    groups = _groups(rows)
    styles = strategy_styles(rows)
    fig = Figure(figsize=(max(5.0, 1.2 * len(groups) + 2), 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, (key, runs) in enumerate(groups.items(), start=1):
        rewards = [row.best for row in runs if row.best is not None]
        color, marker = styles[runs[0].strategy or "-"]  # an ecology arm keeps its strategy's style
        if len(rewards) >= 2:  # the dots show every run, so the box draws no outliers of its own
            ax.boxplot([rewards], positions=[i], widths=0.5, showfliers=False, manage_ticks=False)
        ax.scatter([i + x for x in _offsets(len(rewards))], rewards, color=color, marker=marker, zorder=3)
    ax.set_xticks(range(1, len(groups) + 1), labels=_group_labels(list(groups)))
    ax.set_xlim(0.5, len(groups) + 0.5)
    ax.set(title="Consistency across runs", ylabel="best held-out reward")
    ax.grid(alpha=0.3, axis="y")
    return fig


# ---- writing ------------------------------------------------------------------------


def write_compare(rows: list[RunRow], out_dir: Path) -> list[Path]:
    """Under out_dir: compare.md, compare.json, plots/compare.png, plots/reward_kl.png and, when a
    strategy has several runs, plots/consistency.png; returns their paths in that order."""
    out_dir = Path(out_dir)
    (out_dir / PLOT).parent.mkdir(parents=True, exist_ok=True)
    md, data = out_dir / MARKDOWN, out_dir / JSON
    md.write_text(markdown(rows))
    data.write_text(json.dumps(compare_json(rows), indent=2) + "\n")
    figures: list[tuple[Path, Callable[[list[RunRow]], Figure]]] = [(PLOT, figure), (REWARD_KL_PLOT, reward_kl_figure)]
    if has_spread(consistency(rows)):
        figures.append((CONSISTENCY_PLOT, consistency_figure))
    else:  # an earlier compare into this folder may have drawn one: it would contradict compare.md
        (out_dir / CONSISTENCY_PLOT).unlink(missing_ok=True)
    for relative, draw in figures:  # one figure at a time: each is drawn, saved and dropped
        draw(rows).savefig(out_dir / relative, dpi=120)
    return [md, data, *(out_dir / relative for relative, _ in figures)]


def out_folder(folders: list[Path], out: str | Path | None) -> Path:
    """--out; else a lone sweep folder itself; else ./compare-<timestamp>."""
    if out is not None:
        return Path(out)
    if len(folders) == 1 and not _is_run(folders[0]) and _is_sweep(folders[0]):
        return folders[0]
    return Path.cwd() / f"compare-{time.strftime('%Y-%m-%d_%H-%M-%S')}"


def compare(folders: list[str | Path], out: str | Path | None = None) -> tuple[list[RunRow], list[Path]]:
    paths = [Path(f) for f in folders]
    rows = collect(paths)
    return rows, write_compare(rows, out_folder(paths, out))
