"""Figures of a `strategy=ecology` run from its own files: population and energy
(metrics.jsonl / organelles.jsonl), ROI per family (episodes.jsonl), the ancestry tree
(organelles.jsonl), the QD archive (archive.jsonl) and the routing map (routing.json).
Each figure has a pure helper computing its data (tested on its own) and a plot function
drawing it. The ecology's analysis hooks (`analysis.py`) hand `ecology_figures` to `evora analyze`;
nothing here imports evora.analysis or evora.tracking."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")  # files only, never a window; also works without a display

import numpy as np  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from evora.strategies.analysis_hooks import read_json, read_jsonl  # noqa: E402

EPISODES_FILE = "episodes.jsonl"
ORGANELLES_FILE = "organelles.jsonl"
ARCHIVE_FILE = "archive.jsonl"
ROUTING_FILE = "routing.json"  # as evora.distributed.portfolio writes it (that module imports Ray)
TITLES = {
    "ecology_population": "Ecology: population and total energy",
    "ecology_roi": "Ecology: mean ROI per family",
    "ecology_ancestry": "Ecology: ancestry tree",
    "ecology_archive": "Ecology: QD archive",
    "ecology_routing": "Ecology: routing map",
}
OP_STYLES = {  # edge style per birth operator: a merge's two edges share it
    "mutate": {"colors": "tab:blue", "linestyles": "solid"},
    "merge": {"colors": "tab:purple", "linestyles": "dashed"},
    "niche": {"colors": "tab:green", "linestyles": "dotted"},
}
Record = dict[str, Any]
Series = tuple[list[int], list[float]]


def _figure(width: float = 8, height: float = 4.5) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height), layout="constrained")  # constrained: labels never overlap
    return fig, fig.add_subplot()


def _natural(name: str) -> list[Any]:
    """o2 before o10: ids sort by their numbers, not character by character."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _annotate(ax: Any, image: Any, i: int, j: int, text: str, value: float) -> None:
    # Dark text on the bright (yellow) end of viridis, white on the dark end.
    light = value == value and image.norm(value) > 0.6
    ax.text(j, i, text, ha="center", va="center", color="black" if light else "white", fontsize="small")


# ---- population and energy -------------------------------------------------------------


def population_series(metrics: list[Record], events: list[Record]) -> dict[str, Series]:
    """population and total_energy per generation: metrics.jsonl's when it has them, else
    summed over organelles.jsonl's "alive" lines (one per living organelle per generation)."""
    rows = [r for r in metrics if r.get("population") is not None and r.get("total_energy") is not None]
    if rows:
        generations = [r["generation"] for r in rows]
        return {
            "population": (generations, [r["population"] for r in rows]),
            "total_energy": (generations, [r["total_energy"] for r in rows]),
        }
    alive: dict[int, list[float]] = defaultdict(list)
    for e in events:
        if e.get("event") == "alive":
            alive[e["generation"]].append(e.get("energy") or 0.0)
    generations = sorted(alive)
    return {
        "population": (generations, [float(len(alive[g])) for g in generations]),
        "total_energy": (generations, [sum(alive[g]) for g in generations]),
    }


def event_counts(events: list[Record], kind: str) -> Series:
    """How many `kind` events ("birth", "retire") each generation had, generations without any left out."""
    counts: dict[int, int] = defaultdict(int)
    for e in events:
        if e.get("event") == kind:
            counts[e["generation"]] += 1
    generations = sorted(counts)
    return generations, [float(counts[g]) for g in generations]


def plot_population(metrics: list[Record], events: list[Record]) -> Figure:
    series = population_series(metrics, events)
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(*series["population"], marker=".", color="black", label="population")
    # Births and retirements as bars beside the population line: the same unit (organelles).
    for kind, label, shift, colour in (
        ("birth", "births", -0.2, "tab:green"),
        ("retire", "retirements", 0.2, "tab:red"),
    ):
        generations, counts = event_counts(events, kind)
        top.bar([g + shift for g in generations], counts, width=0.4, color=colour, alpha=0.6, label=label)
    top.set(title="Population and total energy over generations", ylabel="organelles")
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    top.legend(loc="best", fontsize="small")
    bottom.plot(*series["total_energy"], marker=".", color="tab:orange")
    bottom.axhline(0, color="grey", linestyle="--", linewidth=0.8)
    bottom.set(xlabel="generation", ylabel="total energy")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig


# ---- ROI per family ----------------------------------------------------------------------


def roi_by_family(episodes: list[Record]) -> dict[str, Series]:
    """family -> (generations, mean ROI of that family's episodes in each generation)."""
    cells: dict[tuple[str, int], list[float]] = defaultdict(list)
    for e in episodes:
        if e.get("roi") is not None:
            cells[(e.get("family", "?"), e["generation"])].append(e["roi"])
    series: dict[str, Series] = {}
    for family in sorted({f for f, _ in cells}):
        generations = sorted(g for f, g in cells if f == family)
        series[family] = (generations, [mean(cells[(family, g)]) for g in generations])
    return series


def plot_roi(episodes: list[Record]) -> Figure:
    fig, ax = _figure()
    for family, (generations, values) in roi_by_family(episodes).items():
        ax.plot(generations, values, marker=".", label=family)
    ax.axhline(0, color="grey", linestyle="--", linewidth=0.8, label="break-even")
    ax.set(title="Mean ROI per episode, by family", xlabel="generation", ylabel="ROI (earned − cost)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    return fig


# ---- ancestry tree -----------------------------------------------------------------------


def ancestry(events: list[Record]) -> tuple[list[Record], list[tuple[str, str, str]]]:
    """Every organelle once (founders and births): id, born, end (retirement, else the last
    generation), retired, origin and its row; and the parent -> child edges with the birth's
    operator, a merge giving one edge from each parent."""
    last = max((e["generation"] for e in events), default=0)
    nodes: dict[str, Record] = {}

    def node(organelle: str, born: int = 0, origin: str = "founder") -> Record:
        return nodes.setdefault(organelle, {"id": organelle, "born": born, "origin": origin, "end": last})

    edges = []
    for e in sorted(events, key=lambda e: e["generation"]):  # stable: a birth's line comes before its alive line
        if e.get("event") == "birth":
            parents = e.get("parents") or []
            for parent in parents:
                node(parent)  # a founder may be first named as a parent
            node(e["id"], e["generation"], e.get("origin", "?"))
            edges += [(parent, e["id"], e.get("origin", "?")) for parent in parents]
        elif e.get("event") == "retire":
            node(e["id"]).update(end=e["generation"], retired=True)
        else:
            node(e["id"], e.get("born", 0))
    ordered = sorted(nodes.values(), key=lambda n: (n["born"], _natural(n["id"])))
    for row, n in enumerate(ordered):
        n["row"] = row
        n.setdefault("retired", False)
    return ordered, edges


def _edge_segments(nodes: list[Record], edges: list[tuple[str, str, str]]) -> dict[str, list[Any]]:
    """Segments per operator: from the parent's lifeline one generation before the birth (when
    it reproduced) to the child's birth, so a merge's two edges never lie on top of each other."""
    by_id = {n["id"]: n for n in nodes}
    segments: dict[str, list[Any]] = defaultdict(list)
    for parent, child, op in edges:
        p, c = by_id[parent], by_id[child]
        segments[op].append(((max(p["born"], c["born"] - 1), p["row"]), (c["born"], c["row"])))
    return segments


def plot_ancestry(events: list[Record]) -> Figure:
    nodes, edges = ancestry(events)
    fig, ax = _figure(10, min(max(4.0, 1.5 + 0.25 * len(nodes)), 20))
    lifelines = [((n["born"], n["row"]), (n["end"], n["row"])) for n in nodes]
    ax.add_collection(LineCollection(lifelines, colors="lightgrey", linewidths=3, zorder=1))
    for op, segments in _edge_segments(nodes, edges).items():
        style = OP_STYLES.get(op, {"colors": "grey", "linestyles": "solid"})
        ax.add_collection(LineCollection(segments, linewidths=1.2, zorder=2, label=f"{op} edge", **style))
    for origin in sorted({n["origin"] for n in nodes}):
        born = [n for n in nodes if n["origin"] == origin]
        colour = "black" if origin == "founder" else OP_STYLES.get(origin, {"colors": "grey"})["colors"]
        ax.scatter([n["born"] for n in born], [n["row"] for n in born], s=25, color=colour, zorder=3, label=origin)
    for retired, marker, colour, label in ((True, "x", "tab:red", "retired"), (False, ">", "tab:green", "alive")):
        ends = [n for n in nodes if n["retired"] is retired]
        ax.scatter(
            [n["end"] for n in ends], [n["row"] for n in ends], marker=marker, color=colour, zorder=4, label=label
        )
    ax.autoscale()
    if len(nodes) <= 40:  # ids readable as tick labels; beyond that, row numbers only
        ax.set_yticks([n["row"] for n in nodes], [n["id"] for n in nodes], fontsize="small")
    ax.invert_yaxis()  # founders on top, the newest births at the bottom
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title="Ancestry (grey: lifespan; edges: parent → child)", xlabel="generation", ylabel="organelle")
    fig.legend(loc="outside lower center", ncols=4, fontsize="small")  # outside: the tree fills the axes
    return fig


# ---- QD archive --------------------------------------------------------------------------


def bin_labels(cost_bins: list[float]) -> list[str]:
    """Cost-per-episode bins as archive.py numbers them (bisect_right): index i holds
    costs in [bins[i-1], bins[i])."""
    if not cost_bins:
        return ["all costs"]
    inner = [f"{a:g}–{b:g}" for a, b in zip(cost_bins, cost_bins[1:])]
    return [f"< {cost_bins[0]:g}", *inner, f"≥ {cost_bins[-1]:g}"]


def archive_grid(record: Record) -> tuple[list[str], list[str], np.ndarray, list[list[str | None]]]:
    """(families, bin labels, elite ROI per family x bin with NaN for empty cells, elite ids)."""
    cells = record.get("cells") or {}
    families = list(record.get("families") or [])
    families += sorted({c.rpartition("|")[0] for c in cells} - set(families))  # a cell outside the list
    labels = bin_labels(list(record.get("cost_bins") or []))
    values = np.full((len(families), len(labels)), np.nan)
    ids: list[list[str | None]] = [[None] * len(labels) for _ in families]
    for cell, elite in cells.items():
        family, _, index = cell.rpartition("|")
        i, j = families.index(family), int(index)
        if 0 <= j < len(labels):
            values[i, j], ids[i][j] = elite.get("roi", np.nan), elite.get("id")
    return families, labels, values, ids


def coverage_series(archive: list[Record]) -> Series:
    """Filled cells / all cells of each archive.jsonl record."""
    rows = [(r["generation"], archive_grid(r)[2]) for r in archive]
    return [g for g, _ in rows], [float(np.mean(~np.isnan(v))) if v.size else 0.0 for _, v in rows]


def plot_archive(archive: list[Record]) -> Figure:
    last = archive[-1]
    families, labels, values, ids = archive_grid(last)
    fig = Figure(figsize=(7, 2.5 + 0.5 * len(families)), layout="constrained")
    grid, line = fig.subplots(2, 1, height_ratios=[3, 1])
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")  # empty cells grey
    image = grid.imshow(np.ma.masked_invalid(values), cmap=cmap, aspect="auto")
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            if ids[i][j] is not None:
                _annotate(grid, image, i, j, f"{ids[i][j]}\n{value:.2f}", value)
    grid.set_xticks(range(len(labels)), labels)
    grid.set_yticks(range(len(families)), families)
    filled = int(np.sum(~np.isnan(values)))
    grid.set(
        title=f"QD archive at generation {last['generation']}: coverage {filled}/{values.size} cells",
        xlabel="cost per episode",
        ylabel="family",
    )
    if filled:
        fig.colorbar(image, ax=grid, label="elite ROI")
    line.plot(*coverage_series(archive), marker=".")
    line.set(xlabel="generation", ylabel="coverage", ylim=(0, 1.05))
    line.xaxis.set_major_locator(MaxNLocator(integer=True))
    line.grid(alpha=0.3)
    return fig


# ---- routing map -------------------------------------------------------------------------


def routing_grid(document: Record) -> tuple[list[str], list[str], np.ndarray, list[tuple[int, int]]]:
    """(rows: families then "default", organelle ids, selection score per row x id with NaN
    where none, the (row, column) of each row's routed organelle)."""
    routing = document.get("routing") or {}
    scores = document.get("selection_scores") or {}
    rows = list(scores) + [f for f in routing if f not in scores and f != "default"]
    rows += ["default"] if "default" in routing else []
    named = set(document.get("adapters") or {}) | set(routing.values())
    named |= {i for per_family in scores.values() for i in per_family}
    ids = sorted(named, key=_natural)
    values = np.full((len(rows), len(ids)), np.nan)
    for i, family in enumerate(rows):
        for organelle, score in (scores.get(family) or {}).items():
            values[i, ids.index(organelle)] = score
    chosen = [(i, ids.index(routing[row])) for i, row in enumerate(rows) if row in routing]
    return rows, ids, values, chosen


def plot_routing(document: Record) -> Figure:
    rows, ids, values, chosen = routing_grid(document)
    fig, ax = _figure(max(5.0, 2.5 + 0.6 * len(ids)), 2 + 0.5 * len(rows))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")  # no score: grey
    image = ax.imshow(
        np.ma.masked_invalid(values), cmap=cmap, aspect="auto", vmin=0, vmax=max(1.0, np.nanmax(values, initial=0))
    )
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            if value == value:
                _annotate(ax, image, i, j, f"{value:.2f}", value)
    for i, j in chosen:  # the routed organelle: a red frame (with no scores, the frame is all there is)
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    ax.set_xticks(range(len(ids)), ids)
    ax.set_yticks(range(len(rows)), rows)
    scored = bool(np.sum(~np.isnan(values)))
    ax.set(title="Routing map (red frame: the routed organelle)", xlabel="organelle", ylabel="family")
    ax.title.set_fontsize("medium")
    if scored:
        fig.colorbar(image, ax=ax, label="mean reward on selection")
    return fig


# ---- which figures a run has ---------------------------------------------------------------


def ecology_figures(run: Path, metrics: list[Record] | None = None) -> dict[str, Callable[[], Figure]]:
    """The ecology figures this run folder has data for, by plot name, each drawn when called
    (`metrics`: metrics.jsonl's records when already read)."""
    run = Path(run)
    metrics = read_jsonl(run / "metrics.jsonl") if metrics is None else metrics
    events = read_jsonl(run / ORGANELLES_FILE)
    episodes, archive = read_jsonl(run / EPISODES_FILE), read_jsonl(run / ARCHIVE_FILE)
    makers: dict[str, Callable[[], Figure]] = {}
    if population_series(metrics, events)["population"][0]:
        makers["ecology_population"] = lambda: plot_population(metrics, events)
    if roi_by_family(episodes):
        makers["ecology_roi"] = lambda: plot_roi(episodes)
    if events:
        makers["ecology_ancestry"] = lambda: plot_ancestry(events)
    if archive:
        makers["ecology_archive"] = lambda: plot_archive(archive)
    document = read_json(run / ROUTING_FILE) or {}
    if document.get("routing"):
        makers["ecology_routing"] = lambda: plot_routing(document)
    return makers
