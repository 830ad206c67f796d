"""evora.analysis.compare: rows from hand-built run and sweep folders (schema-valid summaries),
the 2-point curve fallback for runs without per-generation held-out points, compare.md,
plots/compare.png and the table."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from evora.analysis import compare as cmp
from evora.analysis.compare import tables
from evora.errors import ConfigError
from evora.tracking.summary import validate_summary

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _heldout(reward: float) -> dict[str, Any]:
    return {"reward": reward, "accuracy": reward, "tokens": 12.0, "fitness": None}


def _spend(flops: float, generated: int, trained: int) -> dict[str, Any]:
    return {
        "tokens_prompt": 100,
        "tokens_generated": generated,
        "tokens_scored": 0,
        "tokens_trained": trained,
        "flops_inference": flops,
        "flops_training": 0.0,
        "flops": flops,
    }


def _summary(
    strategy: str,
    base: float,
    final: float | None,
    best: float,
    best_generation: int | None,
    search_flops: float,
    generated: int,
    trained: int,
    seconds: float,
) -> dict[str, Any]:
    summary = {
        "schema_version": 1,
        "strategy": strategy,
        "generations": 3,
        "center": "mean" if final is not None else None,
        "base": _heldout(base),
        "final": None if final is None else _heldout(final),
        "best": _heldout(best),
        "best_generation": best_generation,
        "best_member": None,
        "best_chosen_on": "heldout",
        "best_vs_base": {"improvements": 1, "regressions": 0, "both_wrong": 2, "both_right": 3},
        "adapters": {"best": "adapters/best"},
        "compute": {
            "parameters": 1000,
            "search": _spend(search_flops, generated, trained),
            "evaluation": _spend(5e9, 50, 0),
            "seconds": {"setup": 1.0, "search": seconds - 3.0, "evaluation": 2.0, "total": seconds},
        },
        "details": {},
    }
    validate_summary(summary)  # the fixtures are what a real run writes, or the test is moot
    return summary


def _run(
    folder: Path, strategy: str, metrics: list[dict[str, Any]], summary: dict[str, Any] | None, task: str = "addition"
) -> Path:
    (folder / "eval").mkdir(parents=True)
    (folder / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "strategy": {"name": strategy},
                "task": {"name": task},
                "model": {"name": "tiny"},
                "seed": 0,
                "generations": 3,
            }
        )
    )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    if summary is not None:
        (folder / "eval" / "summary.json").write_text(json.dumps(summary))
    return folder


def _es_metrics() -> list[dict[str, Any]]:
    return [
        {"generation": 0, "base_heldout_reward": 0.5, "heldout_reward": 0.5, "cumulative_flops": 0.0},
        {"generation": 1, "reward_mean": 0.55, "cumulative_flops": 1e10},
        {"generation": 2, "heldout_reward": 0.7, "cumulative_flops": 2e10, "wall_clock_s": 20.0},
        {"generation": 3, "heldout_reward": 0.65, "cumulative_flops": 3e12, "wall_clock_s": 30.0},
    ]


def es_run(root: Path, name: str = "es-run") -> Path:
    return _run(root / name, "es", _es_metrics(), _summary("es", 0.5, 0.65, 0.7, 2, 3e12, 4000, 0, 33.0))


def pbt_run(root: Path, name: str = "pbt-run") -> Path:
    metrics = [{"generation": g, "fitness_max": 0.5 + 0.1 * g, "cumulative_flops": 1e11 * g} for g in (1, 2, 3)]
    return _run(root / name, "pbt", metrics, _summary("pbt", 0.5, None, 0.8, 3, 3e11, 0, 9000, 60.0))


def unfinished_run(root: Path, name: str = "crashed-run") -> Path:
    return _run(root / name, "ga", _es_metrics()[:3], None)


def sweep(root: Path, name: str = "sweep") -> Path:
    folder = root / name
    es_run(folder, "0")
    _run(folder / "1", "es", _es_metrics(), _summary("es", 0.5, 0.6, 0.75, 3, 3e12, 4100, 0, 35.0))
    (folder / "multirun.yaml").write_text("{}\n")  # not a job: no config.yaml
    (folder / "sweep_summary.json").write_text("[]\n")
    return folder


@pytest.fixture
def rows(tmp_path: Path) -> list[cmp.RunRow]:
    return cmp.collect([es_run(tmp_path), pbt_run(tmp_path), unfinished_run(tmp_path)])


def _by_name(rows: list[cmp.RunRow]) -> dict[str, cmp.RunRow]:
    return {row.name: row for row in rows}


def test_rows_equal_the_summaries(rows):
    es, pbt, crashed = rows
    assert (es.name, es.strategy, es.task, es.model, es.status) == ("es-run", "es", "addition", "tiny", "finished")
    assert (es.base, es.final, es.best, es.best_generation) == (0.5, 0.65, 0.7, 2)
    assert (es.flops_search, es.flops_evaluation) == (3e12, 5e9)
    assert (es.tokens_generated, es.tokens_trained, es.seconds_total) == (4000, 0, 33.0)
    assert es.best_flops == 2e10  # cumulative FLOPs at the best's generation, not the total
    assert (pbt.final, pbt.best, pbt.tokens_trained, pbt.seconds_total) == (None, 0.8, 9000, 60.0)
    assert crashed.status == "unfinished"
    assert (
        crashed.base,
        crashed.final,
        crashed.best,
        crashed.flops_search,
        crashed.seconds_total,
        crashed.best_flops,
    ) == (None, None, None, None, None, None)


def test_curves(rows):
    es, pbt, crashed = rows
    assert es.curve == ((0.0, 0.5), (2e10, 0.7), (3e12, 0.65))
    assert pbt.curve == ((0.0, 0.5), (3e11, 0.8))  # no per-generation held-out: base and best from the summary
    assert crashed.curve == ((0.0, 0.5), (2e10, 0.7))  # an unfinished run still has its metrics


def test_one_curve_point_falls_back_to_the_summary(tmp_path):
    metrics = [{"generation": 3, "heldout_reward": 0.8, "cumulative_flops": 3e11}]
    run = _run(tmp_path / "one", "pbt", metrics, _summary("pbt", 0.4, None, 0.8, 3, 3e11, 0, 10, 5.0))
    assert cmp.collect([run])[0].curve == ((0.0, 0.4), (3e11, 0.8))


def test_sweep_jobs_are_rows(tmp_path):
    rows = cmp.collect([sweep(tmp_path), pbt_run(tmp_path)])
    assert [row.name for row in rows] == ["sweep/0", "sweep/1", "pbt-run"]
    assert _by_name(rows)["sweep/1"].best == 0.75


def test_sweep_jobs_in_numeric_order(tmp_path):
    folder = sweep(tmp_path)
    for job in ("2", "10"):
        es_run(folder, job)
    assert [row.name for row in cmp.collect([folder])] == ["sweep/0", "sweep/1", "sweep/2", "sweep/10"]


def test_a_run_given_twice_is_one_row(tmp_path):
    folder = sweep(tmp_path)
    assert [row.name for row in cmp.collect([folder, folder / "1"])] == ["sweep/0", "sweep/1"]


def test_bad_folders_raise_config_error_naming_them(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(ConfigError, match="x: not a run folder .*nor a sweep folder") as error:
        cmp.collect([es_run(tmp_path), tmp_path / "x"])
    assert str(tmp_path / "x") in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="missing: no such folder"):
        cmp.collect([tmp_path / "missing"])
    (tmp_path / "empty-sweep").mkdir()
    (tmp_path / "empty-sweep" / "sweep_summary.json").write_text("[]\n")
    with pytest.raises(ConfigError, match="empty-sweep: sweep folder with no job runs"):
        cmp.collect([tmp_path / "empty-sweep"])
    with pytest.raises(ConfigError):
        cmp.collect([])
    with pytest.raises(ConfigError):
        cmp.compare([])


def test_markdown(rows, tmp_path):
    md, data, png, plane = cmp.write_compare(rows, tmp_path / "out")  # one run per strategy: no consistency.png
    assert (md, data) == (tmp_path / "out" / "compare.md", tmp_path / "out" / "compare.json")
    assert (png, plane) == (tmp_path / "out" / "plots" / "compare.png", tmp_path / "out" / "plots" / "reward_kl.png")
    text = md.read_text()
    table = {
        line.split("|")[1].strip(): [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and "---" not in line
    }
    assert table["run"] == list(cmp.COLUMNS)
    # No kl in these summaries (older runs): "-" for the KL and for the front.
    # No benchmarks of the best adapter: "-" for kept skills.
    assert table["es-run"] == [
        "es-run",
        "es",
        "0.5000",
        "0.6500",
        "0.7000",
        "-",
        "-",
        "-",
        "3.0e+12",
        "4100",  # search tokens: prompt + generated + scored + trained
        "30.0",  # search seconds: the three measures a run is matched by
        "4000",
        "33.0",
    ]
    assert table["pbt-run"][3:9] == ["-", "0.8000", "-", "-", "-", "3.0e+11"]
    assert table["crashed-run"] == ["crashed-run", "ga"] + ["-"] * 11
    assert "Highest best held-out reward: 0.8000, reached by `pbt-run` (3.0e+11 search FLOPs)" in text
    assert "`es-run` (es, addition, tiny): best held-out reward 0.7000 at generation 2, after 2.0e+10" in text
    assert "`crashed-run` (ga, addition, tiny): unfinished" in text


def test_kept_skills_is_the_mean_benchmark_difference_of_the_best_adapter(tmp_path):
    run = es_run(tmp_path)
    table = run / "eval" / "best" / "benchmarks.json"
    table.parent.mkdir(parents=True)
    rows = [
        {"task": "a", "metric": "acc,none", "difference": 0.03},
        {"task": "b", "metric": "em,none", "difference": -0.01},
    ]
    table.write_text(json.dumps({"rows": rows}))
    [row] = cmp.collect([run])
    assert (row.kept_skills, row.kept_skills_n) == (pytest.approx(0.01), 2)
    assert tables.cells(row)[cmp.COLUMNS.index("kept skills")] == "+0.010 (2 metrics)"


def test_png_is_written(rows, tmp_path):
    for png in cmp.write_compare(rows, tmp_path)[2:]:
        assert png.read_bytes()[:8] == PNG_MAGIC


def _run_lines(fig) -> list[str]:
    return [line.get_label() for line in fig.axes[0].get_lines() if not line.get_label().startswith("base model")]


def test_figure_one_line_per_run_and_shared_base(rows):
    fig = cmp.figure(rows)
    ax = fig.axes[0]
    assert _run_lines(fig) == ["es-run (es)", "pbt-run (pbt)", "crashed-run (ga)"]
    assert ax.get_xscale() == "log"  # 2e10 .. 3e12: more than a factor of 100
    es_line = ax.get_lines()[0]
    assert list(es_line.get_xdata()) == [2e10, 2e10, 3e12]  # zero compute drawn at the smallest positive x
    bases = [line for line in ax.get_lines() if line.get_label().startswith("base")]
    assert [line.get_label() for line in bases] == ["base model (addition)"]
    assert bases[0].get_linestyle() == ":" and list(bases[0].get_ydata()) == [0.5, 0.5]


def test_figure_linear_keeps_zero_and_per_run_bases(tmp_path):
    metrics = [
        {"generation": 0, "heldout_reward": 0.5, "cumulative_flops": 0.0},
        {"generation": 1, "heldout_reward": 0.6, "cumulative_flops": 1e10},
    ]
    a = _run(tmp_path / "a", "es", metrics, _summary("es", 0.5, 0.6, 0.6, 1, 1e10, 1, 0, 5.0))
    b = _run(tmp_path / "b", "pbt", [], _summary("pbt", 0.45, None, 0.7, 2, 5e11, 0, 1, 5.0))
    fig = cmp.figure(cmp.collect([a, b]))
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear"  # 1e10 .. 5e11: a factor of 50
    assert list(ax.get_lines()[0].get_xdata()) == [0.0, 1e10]
    assert _run_lines(fig) == ["a (es)", "b (pbt)"]
    assert sorted(line.get_label() for line in ax.get_lines() if line.get_label().startswith("base")) == [
        "base model (a)",
        "base model (b)",
    ]  # bases differ: each run gets its own dotted line


def test_figure_base_line_per_task(tmp_path):
    a = es_run(tmp_path, "a")
    b = _run(tmp_path / "b", "pbt", [], _summary("pbt", 0.3, None, 0.7, 2, 5e11, 0, 1, 5.0), task="countdown")
    labels = [line.get_label() for line in cmp.figure(cmp.collect([a, b])).axes[0].get_lines()]
    assert "base model (addition)" in labels and "base model (countdown)" in labels


def test_print_table(rows):
    buffer = io.StringIO()
    cmp.print_table(rows, Console(file=buffer, width=200))
    text = buffer.getvalue()
    for expected in ("es-run", "pbt-run", "crashed-run", "3.0e+12", "0.7000", "best held-out reward"):
        assert expected in text
    crashed = next(line for line in text.splitlines() if "crashed-run" in line)
    assert crashed.count("-") >= 7


def test_print_table_not_a_terminal(rows, capsys):
    cmp.print_table(rows)  # captured: not a terminal, so 200 columns and nothing cut
    out = capsys.readouterr().out
    assert "crashed-run" in out and "wall-clock s" in out and "…" not in out


def test_compare_out_folders(tmp_path, monkeypatch):
    folder = sweep(tmp_path)
    rows, paths = cmp.compare([folder])
    plots = [folder / "plots" / name for name in ("compare.png", "reward_kl.png", "consistency.png")]
    assert len(rows) == 2 and paths == [folder / "compare.md", folder / "compare.json", *plots]  # 2 es jobs
    _, paths = cmp.compare([str(es_run(tmp_path))], out=tmp_path / "given")
    assert paths[0] == tmp_path / "given" / "compare.md" and all(path.exists() for path in paths)
    monkeypatch.chdir(tmp_path)
    _, paths = cmp.compare([tmp_path / "es-run", pbt_run(tmp_path)])
    assert paths[0].parent.parent == tmp_path / "runs" and paths[0].parent.name.startswith("compare-20")
    assert paths[0].exists() and os.path.getsize(paths[2]) > 0
