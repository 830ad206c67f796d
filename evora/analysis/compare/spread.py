"""`evora compare`, across runs: the reward-KL front of each task, and the spread of the best
held-out reward over the runs of one strategy (a sweep over seeds)."""

from __future__ import annotations

import statistics
from typing import Any

from evora.analysis.compare.collect import Point, RunRow
from evora.analysis.compare.decoding import decoding_arm

Group = tuple[str, str, str]  # (strategy, task, model): runs whose rewards can be compared as a spread


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
    # Rewards of different tasks are not on one scale, nor are greedy and sampled held-out
    # rewards one measurement: each (task, held-out decoding) has its own front.
    by_task: dict[tuple[str, str], list[tuple[int, Point]]] = {}
    for i, row in enumerate(rows):
        point = plane_point(row)
        if point is not None:
            by_task.setdefault((row.task or "-", row.eval_decoding or "greedy"), []).append((i, point))
    flags: list[bool | None] = [None] * len(rows)
    for members in by_task.values():
        for (i, _), flag in zip(members, pareto([point for _, point in members])):
            flags[i] = flag
    return flags


def _arm(row: RunRow) -> str:
    # A strategy's arms (its compare hook's `arm`, e.g. a condition) are not repeats of one run,
    # nor are runs that decode differently or penalise the KL differently.
    arms = [arm for arm in (row.arm, decoding_arm(row)) if arm]
    return f"{row.strategy or '-'} ({'; '.join(arms)})" if arms else row.strategy or "-"


def groups(rows: list[RunRow]) -> dict[Group, list[RunRow]]:
    """Rows with a best reward by (strategy or arm, task, model), in order of first appearance."""
    # The model is in the key too: a sweep over models is not a spread over seeds.
    found: dict[Group, list[RunRow]] = {}
    for row in rows:
        if row.best is not None:
            found.setdefault((_arm(row), row.task or "-", row.model or "-"), []).append(row)
    return found


def consistency(rows: list[RunRow]) -> list[dict[str, Any]]:
    """Best held-out reward per (strategy, task, model): n, mean, std (sample, n - 1; None for one
    run), min, max and the runs, in order of first appearance."""
    out = []
    for (strategy, task, model), runs in groups(rows).items():
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


def has_spread(found: list[dict[str, Any]]) -> bool:
    """Whether any strategy has several runs: only then is there a spread to show."""
    return any(group["n"] >= 2 for group in found)
