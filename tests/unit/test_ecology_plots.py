"""evora.strategies.ecology.plots over an ecology run folder built by hand: the data each figure
draws (grids, series, the ancestry tree), which figures a folder gets, and the pngs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evora.analysis import plots
from evora.strategies.ecology import plots as eco

PNG = b"\x89PNG\r\n\x1a\n"
NAMES = {"ecology_population", "ecology_roi", "ecology_ancestry", "ecology_archive", "ecology_routing"}

METRICS = [
    {"generation": 0, "base_heldout_reward": 0.2, "heldout_reward": 0.2},
    {"generation": 1, "reward_mean": 0.3, "reward_max": 0.5, "population": 4.0, "total_energy": 5.0},
    {"generation": 2, "reward_mean": 0.4, "reward_max": 0.6, "population": 3.0, "total_energy": 5.0},
]
# Founders o0, o1; generation 1: o2 mutated from o0 and o3 merged from o0 and o1; generation 2: o1 retires.
EVENTS = [
    {"generation": 1, "event": "birth", "id": "o2", "parents": ["o0"], "origin": "mutate", "energy": 1.0},
    {"generation": 1, "event": "birth", "id": "o3", "parents": ["o0", "o1"], "origin": "merge", "energy": 1.0},
    {"generation": 1, "event": "alive", "id": "o0", "energy": 2.0, "episodes": 4, "born": 0},
    {"generation": 1, "event": "alive", "id": "o1", "energy": 1.0, "episodes": 4, "born": 0},
    {"generation": 1, "event": "alive", "id": "o2", "energy": 1.0, "episodes": 0, "born": 1},
    {"generation": 1, "event": "alive", "id": "o3", "energy": 1.0, "episodes": 0, "born": 1},
    {"generation": 2, "event": "retire", "id": "o1", "energy": -0.5},
    {"generation": 2, "event": "alive", "id": "o0", "energy": 3.0, "episodes": 6, "born": 0},
    {"generation": 2, "event": "alive", "id": "o2", "energy": 0.5, "episodes": 2, "born": 1},
    {"generation": 2, "event": "alive", "id": "o3", "energy": 1.5, "episodes": 2, "born": 1},
]
LINEAGE = [
    {"generation": 1, "id": "o2", "parents": ["o0"], "op": "mutate"},
    {"generation": 1, "id": "o3", "parents": ["o0", "o1"], "op": "merge"},
]
EPISODES = [
    {"generation": g, "organelle": "o0", "family": f, "example": i, "reward": 1.0, "cost": 0.1, "roi": roi}
    for i, (g, f, roi) in enumerate(
        [(1, "add", 0.5), (1, "add", 0.3), (1, "mul", -0.1), (2, "add", 0.1), (2, "mul", -0.2), (2, "mul", -0.4)]
    )
]
ARCHIVE = [
    {
        "generation": 1,
        "families": ["add", "mul"],
        "cost_bins": [0.1, 0.2],
        "cells": {"add|0": {"id": "o0", "roi": 0.5}},
    },
    {
        "generation": 2,
        "families": ["add", "mul"],
        "cost_bins": [0.1, 0.2],
        "cells": {"add|0": {"id": "o0", "roi": 0.5}, "mul|2": {"id": "o3", "roi": -0.1}},
    },
]
ROUTING = {
    "routing": {"add": "o0", "mul": "o3", "default": "o0"},
    "adapters": {"o0": "adapters/organelles/o0", "o2": "adapters/organelles/o2", "o3": "adapters/organelles/o3"},
    "selection_scores": {"add": {"o0": 0.9, "o2": 0.4, "o3": 0.5}, "mul": {"o0": 0.1, "o2": 0.0, "o3": 0.3}},
}


def _write(run: Path, name: str, records: list[dict] | dict) -> None:
    text = json.dumps(records) if isinstance(records, dict) else "".join(json.dumps(r) + "\n" for r in records)
    (run / name).write_text(text)


@pytest.fixture
def eco_run(tmp_path: Path) -> Path:
    run = tmp_path / "eco"
    run.mkdir()
    _write(run, "config.yaml", {"strategy": {"name": "ecology"}})  # analysis finds the ecology's hooks by name
    _write(run, "metrics.jsonl", METRICS)
    _write(run, "organelles.jsonl", EVENTS)
    _write(run, "lineage.jsonl", LINEAGE)
    _write(run, "episodes.jsonl", EPISODES)
    _write(run, "archive.jsonl", ARCHIVE)
    _write(run, "routing.json", ROUTING)
    return run


# ---- which figures a folder gets -------------------------------------------------------------


def test_every_ecology_figure_when_every_file_is_there(eco_run: Path):
    assert set(eco.ecology_figures(eco_run)) == NAMES


def test_each_figure_needs_its_own_file(tmp_path: Path):
    _write(tmp_path, "metrics.jsonl", METRICS)
    assert set(eco.ecology_figures(tmp_path)) == {"ecology_population"}
    _write(tmp_path, "archive.jsonl", ARCHIVE)
    _write(tmp_path, "routing.json", ROUTING)
    assert set(eco.ecology_figures(tmp_path)) == {"ecology_population", "ecology_archive", "ecology_routing"}


def test_no_ecology_figure_for_a_ga_run(tmp_path: Path):
    _write(tmp_path, "metrics.jsonl", [{"generation": 1, "reward_mean": 0.3, "reward_max": 0.5}])
    _write(tmp_path, "lineage.jsonl", [{"generation": 0, "id": "m0", "fitness": 0.1}])
    assert eco.ecology_figures(tmp_path) == {}
    assert "lineage" in plots.figures(tmp_path)


def test_an_ecology_run_has_one_ancestry_figure_not_the_generic_lineage(eco_run: Path):
    names = set(plots.figures(eco_run))
    assert NAMES <= names and "reward" in names
    assert "lineage" not in names and "mutations" not in names


def test_write_plots_writes_the_ecology_pngs(eco_run: Path):
    paths = plots.write_plots(eco_run)
    assert {p.stem for p in paths} >= NAMES
    assert all(p.parent == eco_run / "plots" and p.read_bytes().startswith(PNG) for p in paths)


# ---- population and energy ---------------------------------------------------------------------


def test_population_from_metrics_and_births_retirements_from_events():
    series = eco.population_series(METRICS, EVENTS)
    assert series == {"population": ([1, 2], [4.0, 3.0]), "total_energy": ([1, 2], [5.0, 5.0])}
    assert eco.event_counts(EVENTS, "birth") == ([1], [2.0])
    assert eco.event_counts(EVENTS, "retire") == ([2], [1.0])


def test_population_falls_back_to_the_alive_lines():
    # Without ecology metrics: count and sum the "alive" lines (retired o1 is not alive at 2).
    series = eco.population_series([{"generation": 1, "reward_mean": 0.3}], EVENTS)
    assert series["population"] == ([1, 2], [4.0, 3.0])
    assert series["total_energy"] == ([1, 2], [pytest.approx(5.0), pytest.approx(5.0)])


def test_population_figure_draws_both_axes():
    fig = eco.plot_population(METRICS, EVENTS)
    top, bottom = fig.axes
    assert list(top.lines[0].get_ydata()) == [4.0, 3.0]
    assert list(bottom.lines[0].get_ydata()) == [5.0, 5.0]
    assert len(top.patches) == 2  # one birth bar (generation 1), one retirement bar (generation 2)


# ---- ROI per family -------------------------------------------------------------------------------


def test_roi_by_family_is_the_mean_per_family_and_generation():
    series = eco.roi_by_family(EPISODES)
    assert list(series) == ["add", "mul"]
    assert series["add"][0] == [1, 2] and series["add"][1] == pytest.approx([0.4, 0.1])
    assert series["mul"][0] == [1, 2] and series["mul"][1] == pytest.approx([-0.1, -0.3])


def test_roi_figure_has_one_line_per_family():
    ax = eco.plot_roi(EPISODES).axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
    assert lines["add"] == pytest.approx([0.4, 0.1]) and lines["mul"] == pytest.approx([-0.1, -0.3])


# ---- ancestry tree ----------------------------------------------------------------------------------


def test_ancestry_has_every_organelle_and_a_merge_gives_two_edges():
    nodes, edges = eco.ancestry(EVENTS)
    assert [n["id"] for n in nodes] == ["o0", "o1", "o2", "o3"]  # founders first, then births
    assert [n["row"] for n in nodes] == [0, 1, 2, 3]
    by_id = {n["id"]: n for n in nodes}
    assert [by_id[i]["origin"] for i in ("o0", "o1", "o2", "o3")] == ["founder", "founder", "mutate", "merge"]
    assert (by_id["o1"]["end"], by_id["o1"]["retired"]) == (2, True)
    assert (by_id["o3"]["born"], by_id["o3"]["end"], by_id["o3"]["retired"]) == (1, 2, False)
    assert sorted(edges) == [("o0", "o2", "mutate"), ("o0", "o3", "merge"), ("o1", "o3", "merge")]


def test_ancestry_sorts_ids_by_number_and_names_parents_never_seen_alive():
    events = [
        {"generation": 1, "event": "birth", "id": "o10", "parents": ["o9"], "origin": "niche"},
        {"generation": 1, "event": "birth", "id": "o2", "parents": ["o9"], "origin": "niche"},
    ]
    nodes, edges = eco.ancestry(events)
    assert [n["id"] for n in nodes] == ["o9", "o2", "o10"]
    assert len(edges) == 2


def test_ancestry_figure_draws_one_segment_per_edge_by_operator():
    fig = eco.plot_ancestry(EVENTS)
    ax = fig.axes[0]
    segments = {c.get_label(): len(c.get_segments()) for c in ax.collections if "edge" in str(c.get_label())}
    assert segments == {"mutate edge": 1, "merge edge": 2}
    edges = eco._edge_segments(*eco.ancestry(EVENTS))
    # A merge's edges start on each parent's lifeline and meet at the child.
    assert sorted(edges["merge"]) == [((0, 0), (1, 3)), ((0, 1), (1, 3))]


# ---- QD archive ----------------------------------------------------------------------------------------


def test_bin_labels_follow_bisect_right():
    assert eco.bin_labels([0.1, 0.2]) == ["< 0.1", "0.1–0.2", "≥ 0.2"]
    assert eco.bin_labels([]) == ["all costs"]


def test_archive_grid_is_families_by_bins_with_nan_for_empty_cells():
    families, labels, values, ids = eco.archive_grid(ARCHIVE[-1])
    assert families == ["add", "mul"] and len(labels) == 3
    assert values.shape == (2, 3)
    assert values[0, 0] == 0.5 and values[1, 2] == -0.1
    assert np.isnan(values).sum() == 4
    assert ids == [["o0", None, None], [None, None, "o3"]]
    assert eco.coverage_series(ARCHIVE) == ([1, 2], [pytest.approx(1 / 6), pytest.approx(2 / 6)])


def test_archive_figure_shows_the_last_record():
    fig = eco.plot_archive(ARCHIVE)
    grid = fig.axes[0]
    image = grid.images[0].get_array()
    assert image.shape == (2, 3)
    assert image.mask.tolist() == [[False, True, True], [True, True, False]]  # empty cells masked (grey)
    assert "coverage 2/6" in grid.get_title()
    assert {t.get_text() for t in grid.texts} == {"o0\n0.50", "o3\n-0.10"}
    assert len(fig.axes) == 3  # grid, coverage over generations, colour bar


# ---- routing map -----------------------------------------------------------------------------------------


def test_routing_grid_holds_the_scores_and_the_routed_choice():
    rows, ids, values, chosen = eco.routing_grid(ROUTING)
    assert rows == ["add", "mul", "default"] and ids == ["o0", "o2", "o3"]
    assert values[:2].tolist() == [[0.9, 0.4, 0.5], [0.1, 0.0, 0.3]]
    assert np.isnan(values[2]).all()
    assert chosen == [(0, 0), (1, 2), (2, 0)]


def test_routing_without_scores_marks_only_the_choice():
    document = {"routing": ROUTING["routing"], "adapters": ROUTING["adapters"]}
    rows, ids, values, chosen = eco.routing_grid(document)
    assert rows == ["add", "mul", "default"] and np.isnan(values).all()
    assert chosen == [(0, 0), (1, 2), (2, 0)]
    fig = eco.plot_routing(document)
    assert len(fig.axes) == 1 and len(fig.axes[0].patches) == 3  # no colour bar, one frame per row


def test_routing_figure_frames_each_routed_cell():
    fig = eco.plot_routing(ROUTING)
    ax = fig.axes[0]
    frames = sorted((p.get_x() + 0.5, p.get_y() + 0.5) for p in ax.patches)
    assert frames == [(0, 0), (0, 2), (2, 1)]  # (column, row)
    assert len(fig.axes) == 2 and not math.isnan(ax.images[0].get_array()[0, 0])
