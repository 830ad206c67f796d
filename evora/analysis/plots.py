"""Figures from a run folder's files (metrics.jsonl, lineage.jsonl) and from a sweep folder's
sweep_summary.json. Each plot function takes loaded records and returns a Figure; `figures`
adds the ones the run's strategy draws itself (its analysis hooks, through the registry) and
`write_plots` saves them all under <run>/plots/.
No Ray, vLLM or W&B here: this runs on a laptop over a copied run folder."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window; also works without a display
# Figure() objects are used directly (not pyplot), so nothing is kept in a global registry.

from matplotlib.figure import Figure  # noqa: E402

from evora.analysis.hooks import run_data, run_hooks  # noqa: E402
from evora.strategies.analysis_hooks import FigureMaker, RunData  # noqa: E402
from evora.strategies.figures import new_figure, plot_lineage, plot_mutation_effects  # noqa: E402
from evora.tracking.metrics import read_metrics  # noqa: E402

SWEEP_SUMMARY = "sweep_summary.json"
PLOTS_DIR = "plots"
PHASES = ("seconds_materialise", "seconds_generate", "seconds_reward", "seconds_update")
Record = dict[str, Any]


def read_jsonl(path: Path) -> list[Record]:
    return read_metrics(path.parent, path.name)


def _series(records: list[Record], key: str) -> tuple[list[int], list[float]]:
    rows = [r for r in records if r.get(key) is not None]
    return [r["generation"] for r in rows], [r[key] for r in rows]


# ---- reward curves -------------------------------------------------------------------


def plot_reward(metrics: list[Record]) -> Figure:
    fig, ax = new_figure()
    _reward_lines(ax, metrics)
    ax.set(title="Reward over generations", xlabel="generation", ylabel="reward")
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def _reward_lines(ax: Any, metrics: list[Record]) -> None:
    band = [r for r in metrics if r.get("reward_p20") is not None and r.get("reward_p80") is not None]
    if band:
        ax.fill_between(
            [r["generation"] for r in band],
            [r["reward_p20"] for r in band],
            [r["reward_p80"] for r in band],
            alpha=0.2,
            label="population p20–p80",
        )
    if any("reward_mean" in r for r in metrics):  # gradient strategies have no population
        ax.plot(*_series(metrics, "reward_mean"), label="population mean")
        ax.plot(*_series(metrics, "reward_max"), linewidth=1, alpha=0.7, label="best member")
    # Held-out is measured every k generations: dotted between points, not a measured curve.
    ax.plot(*_series(metrics, "heldout_reward"), marker="o", linestyle=":", label="held-out")
    base = next((r.get("base_heldout_reward") for r in metrics if r.get("generation") == 0), None)
    if base is not None:
        ax.axhline(base, linestyle="--", color="grey", label="base model held-out")


# ---- time per generation -----------------------------------------------------------


def plot_timing(metrics: list[Record]) -> Figure:
    rows = [r for r in metrics if any(r.get(k) is not None for k in PHASES)]
    fig, ax = new_figure()
    generations = [r["generation"] for r in rows]
    bottom = [0.0] * len(rows)
    for key in PHASES:
        values = [r.get(key) or 0.0 for r in rows]
        ax.bar(generations, values, bottom=bottom, label=key.removeprefix("seconds_"))
        bottom = [b + v for b, v in zip(bottom, values)]
    # Phases are work summed over the workers' units (it can exceed the wall-clock with
    # several workers); the generation's wall-clock is drawn over them to compare.
    if any(r.get("seconds") is not None for r in rows):
        ax.plot(*_series(rows, "seconds"), color="grey", linestyle="--", label="wall-clock")
    ax.set(title="Time per generation", xlabel="generation", ylabel="seconds (summed over workers)")
    twin = ax.twinx()
    twin.plot(*_series(rows, "tokens_per_second"), color="black", marker=".", label="tokens/s")
    twin.set_ylabel("tokens/s")
    twin.set_ylim(bottom=0)
    # One legend for both axes, outside the bars so it never hides a generation.
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    fig.legend(
        handles, [h.get_label() for h in handles], loc="outside lower center", ncols=len(handles), fontsize="small"
    )
    return fig


# ---- mutation effectiveness -----------------------------------------------------------


def mutation_effects(lineage: list[Record]) -> dict[str, list[float]]:
    """Fitness change of each child over its best parent, grouped by the operator that made it."""
    fitness: dict[str, float] = {}
    effects: dict[str, list[float]] = defaultdict(list)
    for record in sorted(lineage, key=lambda r: r["generation"]):
        parents = [fitness[p] for p in record.get("parents") or [] if p in fitness]
        if parents and record.get("fitness") is not None:
            effects[record.get("op", "?")].append(record["fitness"] - max(parents))
        if record.get("fitness") is not None:
            fitness[record["id"]] = record["fitness"]
    return dict(effects)


# ---- sweeps ------------------------------------------------------------------------------


def sweep_groups(rows: list[Record]) -> dict[str, list[float]]:
    """final_heldout per override set, seeds pooled (seed=... removed from the key)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        key = " ".join(o for o in str(row.get("overrides", "")).split() if not re.match(r"^\+*seed=", o))
        value = row.get("final_heldout") if row.get("final_heldout") is not None else row.get("best_heldout")
        if value is not None:  # a strategy with no center adapter has no final: its best stands for it
            groups[key].append(value)
    return dict(groups)


def _varying(keys: list[str]) -> list[str]:
    """Only the overrides that differ between groups make a readable label."""
    shared = set.intersection(*(set(k.split()) for k in keys)) if len(keys) > 1 else set()
    return [" ".join(o for o in k.split() if o not in shared) or "(defaults)" for k in keys]


def plot_sweep(rows: list[Record]) -> Figure:
    groups = sweep_groups(rows)
    keys = list(groups)
    fig, ax = new_figure(8, 1.2 + 0.5 * max(len(keys), 1))
    means = [mean(groups[k]) for k in keys]
    low = [m - min(groups[k]) for m, k in zip(means, keys)]
    high = [max(groups[k]) - m for m, k in zip(means, keys)]
    ys = range(len(keys))
    ax.barh(list(ys), means, xerr=[low, high], capsize=4, color="tab:blue", alpha=0.8)
    for y, k in zip(ys, keys):
        ax.plot(groups[k], [y] * len(groups[k]), "k.", zorder=3)
    ax.set_yticks(list(ys), _varying(keys), fontsize="small")
    ax.invert_yaxis()  # the first override set on top, as in sweep_summary.md
    ax.set(
        title="Final held-out reward per override set (bar: mean, whiskers: min–max over seeds)",
        xlabel="final held-out reward",
        ylabel="overrides",
    )
    ax.title.set_fontsize("medium")
    return fig


# ---- writing -----------------------------------------------------------------------------


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def write_plots(run_dir: str | Path) -> list[Path]:
    """Every figure this run has data for, as <run>/plots/<name>.png."""
    out = Path(run_dir) / PLOTS_DIR
    return [_save(make(), out / f"{name}.png") for name, make in figures(run_dir).items()]


def generic_figures(run: RunData) -> dict[str, FigureMaker]:
    """The figures every strategy's files may have data for: reward, timing, family tree, mutations."""
    metrics, lineage = run.metrics, run.lineage
    makers: dict[str, FigureMaker] = {}
    if metrics:
        makers["reward"] = lambda: plot_reward(metrics)
        if any(k in r for r in metrics for k in PHASES):
            makers["timing"] = lambda: plot_timing(metrics)
    if lineage:
        makers["lineage"] = lambda: plot_lineage(lineage)
        effects = mutation_effects(lineage)
        if effects:
            makers["mutations"] = lambda: plot_mutation_effects(effects)
    return makers


def figures(run_dir: str | Path) -> dict[str, FigureMaker]:
    """The figures this run has data for, by plot name, each drawn when called: the generic ones
    its strategy keeps (its hooks' omit_figures), with the strategy's own over and after them."""
    run = run_data(run_dir)
    hooks = run_hooks(run)
    makers = {name: make for name, make in generic_figures(run).items() if name not in hooks.omit_figures}
    own = hooks.figures(run) if hooks.figures is not None else {}
    return {**makers, **own}


def write_sweep_plot(sweep_dir: str | Path) -> Path:
    rows = json.loads((Path(sweep_dir) / SWEEP_SUMMARY).read_text())
    return _save(plot_sweep(rows), Path(sweep_dir) / PLOTS_DIR / "sweep.png")
