"""`evora compare <run or sweep folder> ...`: runs side by side, from their files only.

Each run becomes a `RunRow` (its eval/summary.json headline numbers and its held-out reward
against search compute, from metrics.jsonl); `write_compare` writes compare.md and
plots/compare.png, `print_table` prints the same table. No Ray, vLLM or W&B here: this runs
on a laptop over copied run folders.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
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
PLOT = Path("plots") / "compare.png"
COLUMNS = (
    "run",
    "strategy",
    "base",
    "final",
    "best held-out reward",
    "search FLOPs",
    "tokens generated",
    "tokens trained",
    "wall-clock s",
)
LOG_SPAN = 100.0  # positive FLOPs spanning more than this factor get a log x axis
Point = tuple[float, float]


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
        strategy=_config_name(config, "strategy"),
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


# ---- table --------------------------------------------------------------------------


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _flops(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _plain(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cells(row: RunRow) -> list[str]:
    """The row as text, in COLUMNS order; "-" where a value is missing (an unfinished run)."""
    return [
        row.name,
        row.strategy or "-",
        _reward(row.base),
        _reward(row.final),
        _reward(row.best),
        _flops(row.flops_search),
        _plain(row.tokens_generated),
        _plain(row.tokens_trained),
        _plain(row.seconds_total, 1),
    ]


def print_table(rows: list[RunRow], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="held-out reward against search compute")
    table.add_column(COLUMNS[0], no_wrap=True)  # a run name is what one copies; never split it
    for column in COLUMNS[1:]:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in rows:
        table.add_row(*cells(row))
    if console is None:
        # Piped or in a log, rich would assume 80 columns and cut every cell short.
        console = Console()
        console = Console(width=None if console.is_terminal else 200)
    console.print(table)


# ---- markdown -----------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _run_line(row: RunRow) -> str:
    about = ", ".join(v for v in (row.strategy, row.task, row.model) if v) or "-"
    if row.best is None:
        return f"- `{row.name}` ({about}): {row.status}, no best held-out reward yet"
    when = "" if row.best_generation is None else f" at generation {row.best_generation}"
    return (
        f"- `{row.name}` ({about}): best held-out reward {_reward(row.best)}{when}, "
        f"after {_flops(row.best_flops)} search FLOPs"
    )


def _leader_line(rows: list[RunRow]) -> str:
    done = [row for row in rows if row.best is not None]
    if not done:
        return "No run has a best held-out reward yet."
    top = max(row.best for row in done if row.best is not None)
    leaders = [row for row in done if row.best == top]  # ties: every run that reached it
    names = ", ".join(f"`{row.name}` ({_flops(row.best_flops)} search FLOPs)" for row in leaders)
    return f"Highest best held-out reward: {_reward(top)}, reached by {names}."


def markdown(rows: list[RunRow]) -> str:
    lines = [
        "# Held-out reward against search compute",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + " --- |" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(_md_cell(c) for c in cells(row)) + " |" for row in rows]
    lines += ["", _leader_line(rows), "", *(_run_line(row) for row in rows)]
    return "\n".join(lines) + "\n"


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


# ---- writing ------------------------------------------------------------------------


def write_compare(rows: list[RunRow], out_dir: Path) -> list[Path]:
    """out_dir/compare.md and out_dir/plots/compare.png; returns their paths."""
    out_dir = Path(out_dir)
    (out_dir / PLOT).parent.mkdir(parents=True, exist_ok=True)
    md = out_dir / MARKDOWN
    md.write_text(markdown(rows))
    png = out_dir / PLOT
    figure(rows).savefig(png, dpi=120)
    return [md, png]


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
