"""`evora compare`, collecting: each run (or every job of a sweep) becomes a `RunRow`, from its
files only: eval/summary.json's headline numbers, its best adapter's held-out KL from the base
model, its held-out reward against search compute (metrics.jsonl), and the values its strategy's
compare hook adds (`RunRow.extra`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evora.analysis.compare.decoding import decoding_fields
from evora.analysis.hooks import hooks_of, read_config, strategy_name
from evora.errors import ConfigError
from evora.strategies.analysis_hooks import count, number
from evora.tracking.metrics import read_metrics
from evora.tracking.run_dir import CONFIG_FILE
from evora.tracking.summary import headline, read_summary

# evora.tracking.sweep names this file too, but importing it would pull in Hydra.
SWEEP_SUMMARY = "sweep_summary.json"
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
    best_kl: float | None = None  # mean per-token KL(best adapter || base), held-out; None in older runs
    final_kl: float | None = None
    # Every run: its best adapter's held-out accuracy and tokens per example.
    best_accuracy: float | None = None
    best_tokens: float | None = None
    # `evora eval benchmarks=[...]` of the best adapter: the mean of its lm-eval metrics' differences
    # from the base model (eval/best/benchmarks.json), and how many task-metrics that mean covers.
    kept_skills: float | None = None
    kept_skills_n: int = 0
    matched: str | None = None  # strategy.match (BudgetFields): the run a compute-matched baseline spent as much as
    matched_by: str | None = None  # strategy.match_by: flops | tokens | seconds
    # The search's compute in the two other measures a run can be matched by (strategy.match_by).
    tokens_search: int | None = None  # prompt + generated + scored + trained
    seconds_search: float | None = None  # wall-clock seconds of search (set-up and evaluation apart)
    search_decoding: str | None = None  # "greedy", or the sampling of search ("T=1 n=4 mean")
    eval_decoding: str | None = None  # "greedy", or the sampling of held-out evaluation
    kl_penalty: float | None = None  # task.kl_penalty
    best_pass: Mapping[str, float] = field(default_factory=dict)  # pass_at_1, pass_at_<k> of the best, held-out
    arm: str | None = None  # the strategy's variant (its compare hook's `arm`): runs of different arms are no spread
    extra: Mapping[str, Any] = field(default_factory=dict)  # its strategy's compare hook's values ({} without one)


# ---- run and sweep folders -------------------------------------------------------------


def is_run(folder: Path) -> bool:
    return folder.is_dir() and (folder / CONFIG_FILE).is_file()


def is_sweep(folder: Path) -> bool:
    return folder.is_dir() and (folder / SWEEP_SUMMARY).is_file()


def _job_key(folder: Path) -> tuple[int, int, str]:
    # Hydra numbers jobs 0, 1, ... 10: numeric order, not 0, 1, 10, 2.
    return (0, int(folder.name), "") if folder.name.isdigit() else (1, 0, folder.name)


def sweep_jobs(sweep: Path) -> list[Path]:
    """The sweep's job run folders (every subfolder with a config.yaml), in job order."""
    return sorted((p for p in sweep.iterdir() if is_run(p)), key=_job_key)


def _named_runs(folder: Path) -> list[tuple[str, Path]]:
    """(name, run folder) for one argument: a run, or every job of a sweep."""
    if is_run(folder):  # a run wins: a run folder is never also a sweep
        return [(folder.name, folder)]
    if is_sweep(folder):
        jobs = sweep_jobs(folder)
        if not jobs:
            raise ConfigError(f"{folder}: sweep folder with no job runs (no <job>/{CONFIG_FILE})")
        return [(f"{folder.name}/{job.name}", job) for job in jobs]
    if not folder.exists():
        raise ConfigError(f"{folder}: no such folder")
    raise ConfigError(f"{folder}: not a run folder (no {CONFIG_FILE}) nor a sweep folder (no {SWEEP_SUMMARY})")


# ---- one run -----------------------------------------------------------------------------


def _config_name(config: dict[str, Any], key: str) -> str | None:
    section = config.get(key)
    name = section.get("name") if isinstance(section, dict) else None
    return None if name is None else str(name)


def metrics_curve(metrics: list[dict[str, Any]]) -> list[Point]:
    """(cumulative_flops, heldout_reward) of every record that has both, one per generation."""
    by_generation: dict[Any, Point] = {}
    for record in metrics:
        flops, reward = number(record.get("cumulative_flops")), number(record.get("heldout_reward"))
        if flops is not None and reward is not None:
            by_generation[record.get("generation")] = (flops, reward)  # a repeated generation: the last wins
    return sorted(by_generation.values(), key=lambda point: point[0])


def _curve(
    metrics: list[dict[str, Any]], base: float | None, best: float | None, flops: float | None
) -> tuple[Point, ...]:
    points = metrics_curve(metrics)
    # A run that evaluates held-out only at the end: base at zero compute, best at the search's total.
    if len(points) < 2 and base is not None and best is not None and flops is not None:
        return ((0.0, base), (flops, best))
    return tuple(points)


def _best_flops(metrics: list[dict[str, Any]], generation: int | None, flops_search: float | None) -> float | None:
    """Search FLOPs spent up to the best's generation; the search's total when metrics do not say."""
    at = [
        number(r.get("cumulative_flops"))
        for r in metrics
        if generation is not None and r.get("generation") == generation
    ]
    found = [f for f in at if f is not None]
    return found[-1] if found else flops_search


def _tokens_search(search: dict[str, Any]) -> int | None:
    """Every token the search processed (the measure strategy.match_by=tokens spends), or None."""
    counts = [count(search.get(f"tokens_{kind}")) for kind in ("prompt", "generated", "scored", "trained")]
    return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


def _strategy_fields(config: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    """strategy.match / match_by of a compute-matched baseline, and the strategy's own compare values."""
    section = config.get("strategy")
    strategy: dict[str, Any] = section if isinstance(section, dict) else {}
    fields: dict[str, Any] = {}
    if strategy.get("match"):
        fields.update(matched=str(strategy["match"]), matched_by=str(strategy.get("match_by") or "flops"))
    compare = hooks_of(strategy_name(config, summary)).compare
    if compare is not None:
        extra = compare.fields(config, summary)
        arm = extra.get(compare.arm) if compare.arm else None
        fields.update(extra=extra, arm=None if arm is None else str(arm))
    return fields


def read_row(name: str, run: Path) -> RunRow:
    config, summary, metrics = read_config(run), read_summary(run), read_metrics(run)
    compute = (summary or {}).get("compute", {})
    search, evaluation = compute.get("search", {}), compute.get("evaluation", {})
    base, best = headline(summary, "base"), headline(summary, "best")
    flops_search = number(search.get("flops"))
    best_generation = count((summary or {}).get("best_generation"))
    return RunRow(
        name=name,
        path=run,
        # The config names it; a summary still does when the config lacks a name.
        strategy=strategy_name(config, summary),
        task=_config_name(config, "task"),
        model=_config_name(config, "model"),
        status="finished" if summary else "unfinished",
        base=base,
        final=headline(summary, "final"),
        best=best,
        best_generation=best_generation,
        flops_search=flops_search,
        flops_evaluation=number(evaluation.get("flops")),
        tokens_generated=count(search.get("tokens_generated")),
        tokens_trained=count(search.get("tokens_trained")),
        seconds_total=number(compute.get("seconds", {}).get("total")),
        tokens_search=_tokens_search(search),
        seconds_search=number(compute.get("seconds", {}).get("search")),
        curve=_curve(metrics, base, best, flops_search),
        best_flops=_best_flops(metrics, best_generation, flops_search) if summary else None,
        best_kl=headline(summary, "best", "kl"),
        final_kl=headline(summary, "final", "kl"),
        best_accuracy=headline(summary, "best", "accuracy"),
        best_tokens=headline(summary, "best", "tokens"),
        **kept_skills(run),
        **decoding_fields(config, summary),
        **_strategy_fields(config, summary),
    )


BENCHMARKS = (
    Path("eval") / "best" / "benchmarks.json"
)  # written by `evora eval adapter=<run>/adapters/best benchmarks=...`


def kept_skills(run: Path) -> dict[str, Any]:
    """RunRow's kept_skills fields from the best adapter's benchmark table, where there is one."""
    path = run / BENCHMARKS
    rows = json.loads(path.read_text())["rows"] if path.is_file() else []
    differences = [r["difference"] for r in rows]
    return {"kept_skills": sum(differences) / len(differences), "kept_skills_n": len(differences)} if rows else {}


def collect(folders: list[Path]) -> list[RunRow]:
    """One row per run, in argument order; a sweep contributes its jobs. Raises ConfigError."""
    if not folders:
        raise ConfigError("evora compare: give at least one run or sweep folder")
    named: dict[Path, str] = {}
    for folder in folders:
        for name, run in _named_runs(Path(folder)):
            named.setdefault(run.resolve(), name)  # a run given twice (alone and in its sweep) is one row
    return [read_row(name, run) for run, name in named.items()]


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
