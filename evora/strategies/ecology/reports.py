"""What the ecology reports (`strategy.py`): a generation's stats, family tree and JSONL
records (episodes, organelles, the MAP-Elites archive), and the run's totals."""

from __future__ import annotations

from typing import Any

import numpy as np

import evora.strategies.ecology.archive as qd
from evora.strategies.ecology.config import EcologyConfig
from evora.strategies.ecology.economy import Organelle
from evora.strategies.ecology.state import EcologyState, total_energy, training_families


def generation_stats(
    cfg: EcologyConfig, full: bool, state: EcologyState, episodes: list[dict[str, Any]], steps: dict[str, float]
) -> dict[str, float]:
    families, bins = training_families(state), list(cfg.cost_bins)
    return {
        "population": float(len(state.organelles)),
        "total_energy": total_energy(state) / 1e6,
        "episodes_total": float(state.episodes),
        "roi_mean": float(np.mean([e["roi"] for e in episodes])) if episodes else 0.0,
        "births_total": float(state.births),
        "merges_total": float(state.merges),
        "retirements_total": float(state.retirements),
        "qd_coverage": qd.coverage(state.archive, families, bins) if full else 0.0,
        "plasticity_step_norm": float(np.mean(list(steps.values()))) if steps else 0.0,
    }


def lineage(events: list[dict[str, Any]], generation: int) -> list[dict[str, Any]]:
    """The family tree (lineage.jsonl): every birth with its parents and how it was made."""
    return [
        {"generation": generation + 1, "id": e["id"], "parents": e["parents"], "op": e["origin"]}
        for e in events
        if e["event"] == "birth"
    ]


def archive_record(cfg: EcologyConfig, state: EcologyState, generation: int) -> dict[str, Any]:
    """archive.jsonl: the MAP-Elites grid after the generation, each filled cell's elite and ROI."""
    return {
        "generation": generation + 1,
        "families": training_families(state),
        "cost_bins": list(cfg.cost_bins),
        "cells": {cell: {"id": elite["id"], "roi": elite["roi"]} for cell, elite in sorted(state.archive.items())},
    }


def generation_records(
    organelles: list[Organelle],
    episodes: list[dict[str, Any]],
    events: list[dict[str, Any]],
    generation: int,
) -> dict[str, list[dict[str, Any]]]:
    """episodes.jsonl: one line per episode; organelles.jsonl: births, retirements, and every
    living organelle's energy after the generation."""
    done = generation + 1
    snapshot = [
        {"event": "alive", "id": o.id, "energy": o.energy / 1e6, "episodes": o.episodes, "born": o.born}
        for o in organelles
    ]
    return {
        "episodes.jsonl": [{"generation": done, **e} for e in episodes],
        "organelles.jsonl": [{"generation": done, **e} for e in [*events, *snapshot]],
    }


def run_details(cfg: EcologyConfig, full: bool, state: EcologyState) -> dict[str, Any]:
    """The ecology's run totals, as the ecology work's conditions table reports them."""
    episode_roi = state.earned - (state.spent - state.upkeep_paid)
    return {
        "condition": cfg.condition,
        "episodes": state.episodes,
        "mean_roi": episode_roi / 1e6 / state.episodes if state.episodes else 0.0,
        "births": state.births,
        "merges": state.merges,
        "retirements": state.retirements,
        "population": len(state.organelles),
        "qd_coverage": qd.coverage(state.archive, training_families(state), list(cfg.cost_bins)) if full else 0.0,
        "energy": {
            "start": state.initial_energy / 1e6,
            "end": total_energy(state) / 1e6,
            "earned": state.earned / 1e6,
            "spent": state.spent / 1e6,
            "retired": state.retired_energy / 1e6,
        },
    }
