"""The quality-diversity archive (MAP-Elites) of the ecology.

A cell is (the family an organelle serves best, its cost-per-episode bin); each cell keeps
its elite, the organelle with the best mean ROI that ever held it, with its adapter.
Coverage is filled cells / all cells. An empty cell's nearest filled cell (grid distance,
ties: the first in cell order) gives it an offspring.
"""

from __future__ import annotations

import bisect
from typing import Any

from evora.strategies.ecology.economy import Organelle
from evora.strategies.protocol import clone_tensors


def cell_of(organelle: Organelle, families: list[str], cost_bins: list[float]) -> str | None:
    """ "<family>|<bin>", or None before its first episode."""
    if not organelle.families:
        return None
    best = max(families, key=lambda f: (organelle.mean_roi(f), -families.index(f)))
    return f"{best}|{bisect.bisect_right(cost_bins, organelle.cost_per_episode())}"


def all_cells(families: list[str], cost_bins: list[float]) -> list[str]:
    return [f"{f}|{b}" for f in families for b in range(len(cost_bins) + 1)]


def update(
    archive: dict[str, dict[str, Any]], organelles: list[Organelle], families: list[str], bins: list[float]
) -> list[str]:
    """Place each organelle in its cell if it beats the cell's elite; returns the cells it changed."""
    changed = []
    for organelle in organelles:
        cell = cell_of(organelle, families, bins)
        if cell is None:
            continue
        roi = organelle.mean_roi(cell.split("|")[0])
        if cell not in archive or roi > archive[cell]["roi"]:
            archive[cell] = {"id": organelle.id, "roi": roi, "adapter": clone_tensors(organelle.adapter)}
            changed.append(cell)
    return changed


def coverage(archive: dict[str, Any], families: list[str], bins: list[float]) -> float:
    cells = all_cells(families, bins)
    return sum(c in archive for c in cells) / len(cells)


def nearest_filled(archive: dict[str, Any], cell: str, families: list[str], bins: list[float]) -> str | None:
    def position(name: str) -> tuple[int, int]:
        family, bin_ = name.split("|")
        return families.index(family), int(bin_)

    here = position(cell)
    filled = [c for c in all_cells(families, bins) if c in archive]
    if not filled:
        return None
    return min(filled, key=lambda c: abs(position(c)[0] - here[0]) + abs(position(c)[1] - here[1]))
