"""PBT's analysis hooks (analysis_hooks.Analysis): the population's fitness curves, the family
tree and the exploits' effects rebuilt from trials.jsonl, the hyperparameter heatmap and
survival figures, and the report's finding on the values that survived. Reads the run folder's
files with json; imports no Ray, no evora.analysis or evora.tracking."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from evora.strategies.analysis_hooks import Analysis, FigureMaker, Record, RunData
from evora.strategies.figures import new_figure, plot_lineage, plot_mutation_effects
from evora.strategies.pbt.space import KEYS as HYPERPARAMETERS
from evora.strategies.pbt.trials import read_trials

TITLES = {"hyperparameters": "Mean fitness by rank and learning rate", "survival": "Hyperparameter survival"}


def _series(records: list[Record], key: str) -> tuple[list[int], list[float]]:
    rows = [r for r in records if r.get(key) is not None]
    return [r["generation"] for r in rows], [r[key] for r in rows]


def plot_fitness(metrics: list[Record]) -> Figure:
    """The population's best, median and worst fitness per generation (metrics.jsonl)."""
    fig, ax = new_figure()
    for key, label in (("fitness_max", "best"), ("fitness_median", "median"), ("fitness_min", "worst")):
        ax.plot(*_series(metrics, key), marker=".", label=label)
    ax.set(title="Population fitness over generations", xlabel="generation", ylabel="fitness")
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    return fig


# ---- family tree and exploits ------------------------------------------------------------


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


def exploit_effects(lineage: list[Record], trials: list[Record]) -> dict[str, list[float]]:
    """An exploit copies a better member into `trial`; the change is that trial's next reported
    fitness minus the copied member's fitness at the exploit, grouped by the hyperparameter it changed."""
    by_trial: dict[str, list[Record]] = defaultdict(list)
    for t in trials:
        by_trial[t["trial"]].append(t)
    effects: dict[str, list[float]] = defaultdict(list)
    for record in lineage:
        later = [t for t in by_trial.get(record["trial"], []) if t["generation"] > record["generation"]]
        if record.get("op") != "exploit" or not later or record.get("fitness") is None:
            continue
        change = min(later, key=lambda t: t["generation"])["fitness"] - record["fitness"]
        for key in record.get("changes") or {"(copy only)": None}:
            effects[key].append(change)
    return dict(effects)


# ---- hyperparameters --------------------------------------------------------------------


def _heatmap_labels(ax: Any, image: Any, grid: list[list[float]]) -> None:
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if value == value:  # not NaN
                # Dark text on the bright (yellow) end of viridis: white there was unreadable.
                colour = "black" if image.norm(value) > 0.6 else "white"
                ax.text(j, i, f"{value:.3f}", ha="center", va="center", color=colour, fontsize="small")


def plot_hyperparameter_heatmap(trials: list[Record]) -> Figure:
    fig, ax = new_figure(7, 4.5)
    cells: dict[tuple[Any, Any], list[float]] = defaultdict(list)
    for t in trials:
        if t.get("fitness") is not None:
            cells[(t.get("rank"), t.get("learning_rate"))].append(t["fitness"])
    ranks = sorted({k[0] for k in cells}, key=float)
    rates = sorted({k[1] for k in cells}, key=float)
    grid = [[mean(cells[(r, lr)]) if (r, lr) in cells else float("nan") for lr in rates] for r in ranks]
    image = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    _heatmap_labels(ax, image, grid)
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


# ---- the hooks ---------------------------------------------------------------------------


def figures(run: RunData) -> dict[str, FigureMaker]:
    """PBT's figures: they replace the generic reward, lineage and mutations figures."""
    trials = read_trials(run.path)
    makers: dict[str, FigureMaker] = {}
    if run.metrics:
        makers["reward"] = lambda: plot_fitness(run.metrics)
    if run.lineage and trials:
        makers["lineage"] = lambda: plot_lineage(pbt_tree(run.lineage, trials))
        effects = exploit_effects(run.lineage, trials)
        if effects:
            makers["mutations"] = lambda: plot_mutation_effects(effects, "changed hyperparameter")
    if trials:
        makers["hyperparameters"] = lambda: plot_hyperparameter_heatmap(trials)
        makers["survival"] = lambda: plot_hyperparameter_survival(trials)
    return makers


def findings(run: RunData) -> list[str]:
    """The hyperparameter values the last generation still holds."""
    trials = read_trials(run.path)
    if not trials:
        return []
    last = max(t["generation"] for t in trials)
    held = {k: sorted({str(t[k]) for t in trials if t["generation"] == last and k in t}) for k in HYPERPARAMETERS}
    values = "; ".join(f"{k} {', '.join(v)}" for k, v in held.items() if v)
    return [f"Hyperparameter values in the last generation: {values}."]


ANALYSIS = Analysis(
    figures=figures,
    # Its members have no per-phase timing, and its lineage.jsonl holds exploits: PBT draws its own tree.
    omit_figures=("timing", "lineage", "mutations"),
    titles=TITLES,
    findings=findings,
)
