"""Drawing helpers shared by the analysis (evora.analysis.plots) and strategies' own figures
(their analysis hooks): a constrained figure, the family tree of lineage records and the
box plot of fitness changes. Matplotlib only: no Ray, no evora.analysis."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window; also works without a display
# Figure() objects are used directly (not pyplot), so nothing is kept in a global registry.

from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

Record = dict[str, Any]
Placed = tuple[Record, float, float]


def new_figure(width: float = 8, height: float = 4.5) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), layout="constrained")  # constrained: labels never overlap
    return fig, fig.add_subplot()


# ---- family tree ---------------------------------------------------------------------


def positions(lineage: list[Record]) -> list[Placed]:
    """(record, x, y): x the generation, y the member's index (order of appearance if absent)."""
    seen: dict[int, int] = defaultdict(int)
    placed = []
    for record in lineage:
        generation = record["generation"]
        y = record.get("index", seen[generation])
        seen[generation] += 1
        placed.append((record, generation, y))
    return placed


def edges(placed: list[Placed]) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Parent -> child segments. A parent is the latest earlier record with its id (same
    generation when the id first appears there: GA's generation 1 lists its own parents)."""
    latest: dict[str, tuple[float, float]] = {}
    found = []
    for record, x, y in sorted(placed, key=lambda p: p[1]):
        parents = record.get("parents") or ([record["parent"]] if record.get("parent") else [])
        if not parents and record["id"] in latest:  # a GA elite carried over unchanged
            parents = [record["id"]]
        found += [(latest[p], (x, y)) for p in parents if p in latest and latest[p] != (x, y)]
        latest[record["id"]] = (x, y)
    return found


def _survivors(fig: Figure, ax: Any, xs: list[float], ys: list[float], survived: list[bool]) -> None:
    if not any(survived):
        return
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


def plot_lineage(lineage: list[Record]) -> Figure:
    """Members by generation, coloured by fitness, with parent -> child edges and survivors starred."""
    fig, ax = new_figure(10, 5)
    placed = positions(lineage)
    ax.add_collection(LineCollection(edges(placed), colors="grey", linewidths=0.4, alpha=0.5))
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
    _survivors(fig, ax, xs, ys, survived)
    fig.colorbar(points, ax=ax, label="fitness")
    ax.autoscale()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # generations and members are whole numbers
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title="Family tree (edges: parent → child)", xlabel="generation", ylabel="member")
    return fig


# ---- fitness changes -------------------------------------------------------------------


def plot_mutation_effects(effects: dict[str, list[float]], xlabel: str = "operator") -> Figure:
    """One box (and its points) of fitness changes per group (operator, changed hyperparameter)."""
    fig, ax = new_figure(7, 4.5)
    labels = sorted(effects)
    ax.boxplot([effects[k] for k in labels], tick_labels=[f"{k}\n(n={len(effects[k])})" for k in labels])
    for i, k in enumerate(labels, start=1):  # the points too: a box of 1-3 values is just a line
        ax.plot([i] * len(effects[k]), effects[k], "k.", alpha=0.3, zorder=3)
    ax.axhline(0, color="grey", linestyle="--", linewidth=0.8)
    ax.set(title="Mutation effectiveness", xlabel=xlabel, ylabel="fitness change")
    return fig
