"""`evora compare`, figures: held-out reward against search compute (compare.png), the reward-KL
plane and its front (reward_kl.png), and the best reward's spread per strategy (consistency.png).
No Ray, vLLM or W&B here: this runs on a laptop over copied run folders."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window; also works without a display
# Figure() objects are used directly (not pyplot), so nothing is kept in a global registry.

from matplotlib.figure import Figure  # noqa: E402

from evora.analysis.compare.collect import Point, RunRow  # noqa: E402
from evora.analysis.compare.spread import Group, front_flags, groups, plane_point  # noqa: E402

LOG_SPAN = 100.0  # positive FLOPs spanning more than this factor get a log x axis
LABEL_MAX = 8  # the reward-KL plane names its points only up to this many; more would be unreadable
MARKERS = "osD^vPX*"


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


def _base_lines(ax: Any, rows: list[RunRow], colors: dict[str, Any]) -> None:
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
    colors: dict[str, Any] = {}  # a colour: a name or an RGB(A) tuple
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
    """Each front (task, held-out decoding) as a step line (the best reward reachable within a KL
    budget), points ringed."""
    by_task: dict[tuple[str, str], list[Point]] = {}
    for row, flag in zip(rows, front_flags(rows)):
        point = plane_point(row)
        if flag and point is not None:
            by_task.setdefault((row.task or "-", row.eval_decoding or "greedy"), []).append(point)
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
    found = groups(rows)
    styles = strategy_styles(rows)
    fig = Figure(figsize=(max(5.0, 1.2 * len(found) + 2), 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, (key, runs) in enumerate(found.items(), start=1):
        rewards = [row.best for row in runs if row.best is not None]
        color, marker = styles[runs[0].strategy or "-"]  # an arm keeps its strategy's style
        if len(rewards) >= 2:  # the dots show every run, so the box draws no outliers of its own
            ax.boxplot([rewards], positions=[i], widths=0.5, showfliers=False, manage_ticks=False)
        ax.scatter([i + x for x in _offsets(len(rewards))], rewards, color=color, marker=marker, zorder=3)
    ax.set_xticks(range(1, len(found) + 1), labels=_group_labels(list(found)))
    ax.set_xlim(0.5, len(found) + 0.5)
    ax.set(title="Consistency across runs", ylabel="best held-out reward")
    ax.grid(alpha=0.3, axis="y")
    return fig
