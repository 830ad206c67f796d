"""Figures from a run folder's files (metrics.jsonl, lineage.jsonl, trials.jsonl) and from a
sweep folder's sweep_summary.json. Each plot function takes loaded records and returns a
Figure; `write_plots` saves the ones the run has data for under <run>/plots/.
No Ray, vLLM or W&B here: this runs on a laptop over a copied run folder."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")  # files only, never a window; also works without a display
# Figure() objects are used directly (not pyplot), so nothing is kept in a global registry.

from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from evora.analysis.ecology_plots import ecology_figures  # noqa: E402
from evora.strategies.pbt.space import KEYS as HYPERPARAMETERS  # noqa: E402 (Ray-free)
from evora.tracking.metrics import read_metrics, read_trials  # noqa: E402
from evora.tracking.run_dir import LINEAGE_FILE  # noqa: E402

SWEEP_SUMMARY = "sweep_summary.json"
PLOTS_DIR = "plots"
PHASES = ("seconds_materialise", "seconds_generate", "seconds_reward", "seconds_update")
Record = dict[str, Any]


def read_jsonl(path: Path) -> list[Record]:
    return read_metrics(path.parent, path.name)


def is_pbt(metrics: list[Record]) -> bool:
    return any("fitness_max" in r for r in metrics)


def _series(records: list[Record], key: str) -> tuple[list[int], list[float]]:
    rows = [r for r in records if r.get(key) is not None]
    return [r["generation"] for r in rows], [r[key] for r in rows]


def _figure(width: float = 8, height: float = 4.5) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), layout="constrained")  # constrained: labels never overlap
    return fig, fig.add_subplot()


# ---- reward / fitness curves -------------------------------------------------------


def plot_reward(metrics: list[Record]) -> Figure:
    fig, ax = _figure()
    if is_pbt(metrics):
        for key, label in (("fitness_max", "best"), ("fitness_median", "median"), ("fitness_min", "worst")):
            ax.plot(*_series(metrics, key), marker=".", label=label)
        ax.set(title="Population fitness over generations", xlabel="generation", ylabel="fitness")
    else:
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
    if any("reward_mean" in r for r in metrics):  # gradient strategies (sft, grpo) have no population
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
    fig, ax = _figure()
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


# ---- family tree ---------------------------------------------------------------------


def _positions(lineage: list[Record]) -> list[tuple[Record, float, float]]:
    """(record, x, y): x the generation, y the member's index (order of appearance if absent)."""
    seen: dict[int, int] = defaultdict(int)
    placed = []
    for record in lineage:
        generation = record["generation"]
        y = record.get("index", seen[generation])
        seen[generation] += 1
        placed.append((record, generation, y))
    return placed


def _edges(placed: list[tuple[Record, float, float]]) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Parent -> child segments. A parent is the latest earlier record with its id (same
    generation when the id first appears there: GA's generation 1 lists its own parents)."""
    latest: dict[str, tuple[float, float]] = {}
    edges = []
    for record, x, y in sorted(placed, key=lambda p: p[1]):
        parents = record.get("parents") or ([record["parent"]] if record.get("parent") else [])
        if not parents and record["id"] in latest:  # a GA elite carried over unchanged
            parents = [record["id"]]
        edges += [(latest[p], (x, y)) for p in parents if p in latest and latest[p] != (x, y)]
        latest[record["id"]] = (x, y)
    return edges


def pbt_tree(lineage: list[Record], trials: list[Record]) -> list[Record]:
    """PBT's lineage.jsonl holds only exploits; the tree's nodes are the trials' results
    (id trial@generation), each continuing its own trial unless an exploit copied another's."""
    order = {t: i for i, t in enumerate(sorted({r["trial"] for r in trials}))}
    copied = {(r["trial"], r["generation"]): r["from_trial"] for r in lineage if r.get("op") == "exploit"}
    last = max((r["generation"] for r in trials), default=0)
    nodes = []
    for r in trials:
        g, trial = r["generation"], r["trial"]
        source = copied.get((trial, g - 1), trial)
        nodes.append(
            {
                "id": f"{trial}@{g}",
                "generation": g,
                "index": order[trial],
                "fitness": r.get("fitness"),
                "parents": [f"{source}@{g - 1}"],
                "survived": g == last,
            }
        )
    return nodes


def plot_lineage(lineage: list[Record], trials: list[Record] | None = None) -> Figure:
    if trials and any(r.get("op") == "exploit" for r in lineage):
        lineage = pbt_tree(lineage, trials)
    fig, ax = _figure(10, 5)
    placed = _positions(lineage)
    ax.add_collection(LineCollection(_edges(placed), colors="grey", linewidths=0.4, alpha=0.5))
    xs, ys = [p[1] for p in placed], [p[2] for p in placed]
    fitness = [p[0].get("fitness") for p in placed]
    survived = [bool(p[0].get("survived")) for p in placed]
    points = ax.scatter(
        xs,
        ys,
        c=[f if f is not None else float("nan") for f in fitness],
        cmap="viridis",
        s=18,
        edgecolors=["black" if s else "none" for s in survived],
        linewidths=0.8,
        zorder=3,
    )
    if any(survived):
        ax.scatter(
            [x for x, s in zip(xs, survived) if s],
            [y for y, s in zip(ys, survived) if s],
            marker="*",
            s=90,
            facecolors="none",
            edgecolors="red",
            linewidths=0.6,
            zorder=4,
            label="survived",
        )
        fig.legend(loc="outside lower center", fontsize="small")  # outside: the tree fills the axes
    fig.colorbar(points, ax=ax, label="fitness")
    ax.autoscale()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # generations and members are whole numbers
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title="Family tree (edges: parent → child)", xlabel="generation", ylabel="member")
    return fig


# ---- PBT hyperparameters ------------------------------------------------------------


def plot_hyperparameter_heatmap(trials: list[Record]) -> Figure:
    fig, ax = _figure(7, 4.5)
    cells: dict[tuple[Any, Any], list[float]] = defaultdict(list)
    for t in trials:
        if t.get("fitness") is not None:
            cells[(t.get("rank"), t.get("learning_rate"))].append(t["fitness"])
    ranks = sorted({k[0] for k in cells}, key=float)
    rates = sorted({k[1] for k in cells}, key=float)
    grid = [[mean(cells[(r, lr)]) if (r, lr) in cells else float("nan") for lr in rates] for r in ranks]
    image = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if value == value:  # not NaN
                # Dark text on the bright (yellow) end of viridis: white there was unreadable.
                light = image.norm(value) > 0.6
                ax.text(
                    j,
                    i,
                    f"{value:.3f}",
                    ha="center",
                    va="center",
                    color="black" if light else "white",
                    fontsize="small",
                )
    ax.set_xticks(range(len(rates)), [f"{lr:g}" for lr in rates], rotation=30, ha="right")
    ax.set_yticks(range(len(ranks)), [str(r) for r in ranks])
    ax.set(title="Mean fitness by rank and learning rate", xlabel="learning rate", ylabel="rank")
    fig.colorbar(image, ax=ax, label="mean fitness")
    return fig


def _natural(value: str) -> tuple[int, float, str]:
    """Numbers in numeric order (1, 8, 16, not 1, 16, 8), then the rest by name."""
    try:
        return 0, float(value), ""
    except ValueError:
        return 1, 0.0, value


def plot_hyperparameter_survival(trials: list[Record]) -> Figure:
    """How many members hold each value in the first and in the last generation."""
    keys = [k for k in HYPERPARAMETERS if any(k in t for t in trials)]
    fig = Figure(figsize=(3.2 * max(len(keys), 1), 3.8), layout="constrained")
    generations = sorted({t["generation"] for t in trials})
    for i, key in enumerate(keys):
        ax = fig.add_subplot(1, len(keys), i + 1)
        first = [str(t[key]) for t in trials if t["generation"] == generations[0]]
        last = [str(t[key]) for t in trials if t["generation"] == generations[-1]]
        values = sorted(set(first) | set(last), key=_natural)
        xs = range(len(values))
        ax.bar([x - 0.2 for x in xs], [first.count(v) for v in values], width=0.4, label="first generation")
        ax.bar([x + 0.2 for x in xs], [last.count(v) for v in values], width=0.4, label="last generation")
        ax.set_xticks(list(xs), values, rotation=30, ha="right", fontsize="small")
        ax.set(title=key.replace("_", " "), ylabel="members" if i == 0 else None)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # member counts, not 2.5 members
    if keys:
        fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2)
    fig.suptitle("Hyperparameter values: first vs last generation")
    return fig


# ---- mutation effectiveness -----------------------------------------------------------


def mutation_effects(lineage: list[Record], trials: list[Record] | None = None) -> dict[str, list[float]]:
    """Fitness change grouped by operator (GA) or by the hyperparameter an exploit changed (PBT)."""
    if any(r.get("op") == "exploit" for r in lineage):
        return _exploit_effects(lineage, trials or [])
    fitness: dict[str, float] = {}
    effects: dict[str, list[float]] = defaultdict(list)
    for record in sorted(lineage, key=lambda r: r["generation"]):
        parents = [fitness[p] for p in record.get("parents") or [] if p in fitness]
        if parents and record.get("fitness") is not None:
            effects[record.get("op", "?")].append(record["fitness"] - max(parents))
        if record.get("fitness") is not None:
            fitness[record["id"]] = record["fitness"]
    return dict(effects)


def _exploit_effects(lineage: list[Record], trials: list[Record]) -> dict[str, list[float]]:
    """An exploit copies a better member into `trial`; the change is that trial's next
    reported fitness minus the copied member's fitness at the exploit."""
    by_trial: dict[str, list[Record]] = defaultdict(list)
    for t in trials:
        by_trial[t["trial"]].append(t)
    effects: dict[str, list[float]] = defaultdict(list)
    for record in lineage:
        later = [t for t in by_trial.get(record["trial"], []) if t["generation"] > record["generation"]]
        if not later or record.get("fitness") is None:
            continue
        change = min(later, key=lambda t: t["generation"])["fitness"] - record["fitness"]
        for key in record.get("changes") or {"(copy only)": None}:
            effects[key].append(change)
    return dict(effects)


def plot_mutation_effects(effects: dict[str, list[float]], xlabel: str = "operator") -> Figure:
    fig, ax = _figure(7, 4.5)
    labels = sorted(effects)
    ax.boxplot([effects[k] for k in labels], tick_labels=[f"{k}\n(n={len(effects[k])})" for k in labels])
    for i, k in enumerate(labels, start=1):  # the points too: a box of 1-3 values is just a line
        ax.plot([i] * len(effects[k]), effects[k], "k.", alpha=0.3, zorder=3)
    ax.axhline(0, color="grey", linestyle="--", linewidth=0.8)
    ax.set(title="Mutation effectiveness", xlabel=xlabel, ylabel="fitness change")
    return fig


# ---- sweeps ------------------------------------------------------------------------------


def sweep_groups(rows: list[Record]) -> dict[str, list[float]]:
    """final_heldout per override set, seeds pooled (seed=... removed from the key)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        key = " ".join(o for o in str(row.get("overrides", "")).split() if not re.match(r"^\+*seed=", o))
        value = row.get("final_heldout") if row.get("final_heldout") is not None else row.get("best_heldout")
        if value is not None:  # PBT has no final center adapter: its best member stands for it
            groups[key].append(value)
    return dict(groups)


def _varying(keys: list[str]) -> list[str]:
    """Only the overrides that differ between groups make a readable label."""
    shared = set.intersection(*(set(k.split()) for k in keys)) if len(keys) > 1 else set()
    return [" ".join(o for o in k.split() if o not in shared) or "(defaults)" for k in keys]


def plot_sweep(rows: list[Record]) -> Figure:
    groups = sweep_groups(rows)
    keys = list(groups)
    fig, ax = _figure(8, 1.2 + 0.5 * max(len(keys), 1))
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


def figures(run_dir: str | Path) -> dict[str, Callable[[], Figure]]:
    """The figures this run has data for, by plot name, each drawn when called."""
    run = Path(run_dir)
    metrics, lineage, trials = read_metrics(run), read_jsonl(run / LINEAGE_FILE), read_trials(run)
    makers: dict[str, Callable[[], Figure]] = {}
    if metrics:
        makers["reward"] = lambda: plot_reward(metrics)
        if not is_pbt(metrics) and any(k in r for r in metrics for k in PHASES):
            makers["timing"] = lambda: plot_timing(metrics)
    ecology = ecology_figures(run)
    # An ecology's lineage.jsonl holds only births (no fitness): its ancestry figure draws them instead.
    if lineage and "ecology_ancestry" not in ecology:
        makers["lineage"] = lambda: plot_lineage(lineage, trials)
        effects = mutation_effects(lineage, trials)
        if effects:
            # GA groups by operator; PBT (trials.jsonl) by the hyperparameter an exploit changed.
            label = "changed hyperparameter" if trials else "operator"
            makers["mutations"] = lambda: plot_mutation_effects(effects, label)
    if trials:
        makers["hyperparameters"] = lambda: plot_hyperparameter_heatmap(trials)
        makers["survival"] = lambda: plot_hyperparameter_survival(trials)
    return {**makers, **ecology}


def write_sweep_plot(sweep_dir: str | Path) -> Path:
    rows = json.loads((Path(sweep_dir) / SWEEP_SUMMARY).read_text())
    return _save(plot_sweep(rows), Path(sweep_dir) / PLOTS_DIR / "sweep.png")
