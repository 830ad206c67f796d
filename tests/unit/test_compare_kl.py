"""evora compare with held-out KL: the KL column ("-" for older runs), the reward-KL front on a
hand-made set, plots/reward_kl.png (runs without KL left out but listed), compare.json and the
consistency across runs of one strategy (a sweep over seeds) against a hand computation."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from rich.console import Console

from conftest import make_summary
from evora.analysis import compare as cmp
from evora.tracking.summary import validate_summary

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _summary(strategy: str, best: float, kl: float | None, base: float = 0.5, flops: float = 1e9) -> dict[str, Any]:
    """make_summary's summary, with the held-out KL every new run reports (none: an older run)."""
    summary = make_summary(base, best, best, strategy=strategy, flops=flops)
    if kl is not None:
        summary["base"]["kl"] = 0.0
        summary["best"]["kl"] = kl
        summary["final"]["kl"] = kl
    validate_summary(summary)
    return summary


def _run(
    folder: Path,
    strategy: str,
    best: float,
    kl: float | None,
    task: str = "addition",
    base: float = 0.5,
    config_strategy: bool = True,
) -> Path:
    (folder / "eval").mkdir(parents=True)
    config = {"task": {"name": task}, "model": {"name": "tiny"}, "seed": 0}
    if config_strategy:
        config["strategy"] = {"name": strategy}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / "metrics.jsonl").write_text(json.dumps({"generation": 1, "heldout_kl": kl}) + "\n")
    (folder / "eval" / "summary.json").write_text(json.dumps(_summary(strategy, best, kl, base)))
    return folder


def _md_table(text: str) -> dict[str, list[str]]:
    """The markdown runs table by run name (the first table only: the runs, not the spreads)."""
    lines = text.split("\n\n")[1].splitlines()
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip().strip("|").split("|")] for line in lines)}


def _legend(fig) -> list[str]:
    return [text.get_text() for text in fig.axes[0].get_legend().get_texts()]


@pytest.fixture
def plane(tmp_path: Path) -> list[cmp.RunRow]:
    """A hand-made reward-KL set on one task, plus an older run (no KL) and another task's run."""
    return cmp.collect(
        [
            _run(tmp_path / "a", "es", 0.6, 0.1),  # least KL: on the front
            _run(tmp_path / "b", "grpo", 0.8, 0.2),  # on the front
            _run(tmp_path / "c", "sft", 0.7, 0.3),  # dominated by b (less reward, more KL)
            _run(tmp_path / "d", "ga", 0.8, 0.2),  # ties b exactly: neither dominates, both on the front
            _run(tmp_path / "e", "pbt", 0.8, 0.25),  # b's reward with more KL: dominated
            _run(tmp_path / "old", "es", 0.95, None),  # an older run: no KL, not on the plane
            _run(tmp_path / "cd", "es", 0.1, 0.9, task="countdown", base=0.05),  # its own task's front
        ]
    )


def test_pareto_on_points():
    points = [(0.1, 0.6), (0.2, 0.8), (0.3, 0.7), (0.2, 0.8), (0.25, 0.8), (0.0, 0.5)]
    assert cmp.pareto(points) == [True, True, False, True, False, True]
    assert cmp.pareto([]) == [] and cmp.pareto([(1.0, 0.0)]) == [True]


def test_front_flags_per_task(plane):
    flags = dict(zip([row.name for row in plane], cmp.front_flags(plane)))
    assert flags == {"a": True, "b": True, "c": False, "d": True, "e": False, "old": None, "cd": True}


def test_kl_column_front_and_strategies_in_the_table(plane, tmp_path):
    md = cmp.write_compare(plane, tmp_path / "out")[0]
    table = _md_table(md.read_text())
    assert table["run"] == list(cmp.COLUMNS)
    kl, front, flops = (cmp.COLUMNS.index(c) for c in ("best held-out KL", "front", "search FLOPs"))
    assert [table[n][kl] for n in ("a", "b", "c", "old")] == ["0.1", "0.2", "0.3", "-"]
    assert [table[n][front] for n in ("a", "c", "e", "old")] == ["yes", "no", "no", "-"]
    assert [table[n][1] for n in "abcde"] == ["es", "grpo", "sft", "ga", "pbt"]
    assert table["b"][flops] == "1.0e+09" and table["b"][kl - 1] == "0.8000"
    buffer = io.StringIO()
    cmp.print_table(plane, Console(file=buffer, width=250))
    text = buffer.getvalue()
    assert "best held-out KL" in text and "grpo" in text and "sft" in text
    assert "0.25" in next(line for line in text.splitlines() if line.startswith("│ e "))


def test_markdown_names_the_front_and_the_runs_left_out(plane, tmp_path):
    text = cmp.write_compare(plane, tmp_path)[0].read_text()
    assert "## Reward-KL plane" in text and "plots/reward_kl.png" in text
    assert "On the front: `a`, `b`, `d`, `cd`." in text
    assert "Left out of the plane (no held-out KL: an older or unfinished run): `old`." in text
    assert "after 1.0e+09 search FLOPs, held-out KL 0.1" in text


def test_compare_json(plane, tmp_path):
    data = json.loads(cmp.write_compare(plane, tmp_path)[1].read_text())
    runs = {run["name"]: run for run in data["runs"]}
    assert (runs["b"]["best_kl"], runs["b"]["final_kl"], runs["b"]["front"]) == (0.2, 0.2, True)
    assert (runs["old"]["best_kl"], runs["old"]["front"], runs["old"]["best"]) == (None, None, 0.95)
    assert runs["c"]["front"] is False and runs["c"]["strategy"] == "sft" and runs["c"]["flops_search"] == 1e9
    assert data["reward_kl_left_out"] == ["old"]
    assert [(g["strategy"], g["task"], g["n"]) for g in data["consistency"]][:2] == [
        ("es", "addition", 2),
        ("grpo", "addition", 1),
    ]


def test_reward_kl_png_is_written(plane, tmp_path):
    paths = cmp.write_compare(plane, tmp_path)
    png = tmp_path / "plots" / "reward_kl.png"
    assert png in paths and png.stat().st_size > 0 and png.read_bytes()[:8] == PNG_MAGIC


def test_reward_kl_figure(plane):
    fig = cmp.reward_kl_figure(plane)
    ax = fig.axes[0]
    legend = _legend(fig)
    assert ["es", "ga", "grpo", "pbt", "sft"] == [s for s in legend if s in cmp.strategy_styles(plane)]
    assert "base model (addition)" in legend and "base model (countdown)" in legend and "front" in legend
    drawn = {tuple(p) for c in ax.collections if not c.get_label().startswith(("base", "_")) for p in c.get_offsets()}
    assert drawn == {(0.1, 0.6), (0.2, 0.8), (0.3, 0.7), (0.25, 0.8), (0.9, 0.1)}  # "old" (0.95, no KL) is not
    assert {text.get_text() for text in ax.texts} == {"a", "b, d", "c", "e", "cd"}  # b and d tie: one label
    bases = {tuple(p) for c in ax.collections if c.get_label().startswith("base") for p in c.get_offsets()}
    assert bases == {(0.0, 0.5), (0.0, 0.05)}
    steps = [line for line in ax.get_lines() if line.get_label() in ("front", "_front")]
    assert [list(zip(line.get_xdata(), line.get_ydata())) for line in steps] == [
        [(0.1, 0.6), (0.2, 0.8), (0.2, 0.8)],  # addition: by KL, the tie drawn twice
        [(0.9, 0.1)],  # countdown
    ]
    assert all(line.get_drawstyle() == "steps-post" for line in steps)


def test_reward_kl_figure_without_any_kl(tmp_path):
    fig = cmp.reward_kl_figure(cmp.collect([_run(tmp_path / "old", "es", 0.7, None)]))
    assert [text.get_text() for text in fig.axes[0].texts] == ["no run reports a held-out KL"]
    assert cmp.markdown(cmp.collect([tmp_path / "old"])).count("No run reports a held-out KL") == 1


def _seed_sweep(root: Path, rewards: list[float]) -> Path:
    folder = root / "sweep"
    for seed, reward in enumerate(rewards):
        _run(folder / str(seed), "es", reward, 0.01 * (seed + 1))
    (folder / "sweep_summary.json").write_text("[]\n")
    return folder


def test_consistency_of_a_seed_sweep(tmp_path):
    rewards = [0.6, 0.7, 0.9]
    rows = cmp.collect([_seed_sweep(tmp_path, rewards), _run(tmp_path / "g", "grpo", 0.8, 0.5)])
    mean = sum(rewards) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 2)  # sample std: n - 1
    es, grpo = cmp.consistency(rows)
    assert (es["strategy"], es["task"], es["model"], es["n"]) == ("es", "addition", "tiny", 3)
    assert es["mean"] == pytest.approx(0.733333333) == pytest.approx(mean)
    assert es["std"] == pytest.approx(0.152752523) == pytest.approx(std)
    assert (es["min"], es["max"], es["runs"]) == (0.6, 0.9, ["sweep/0", "sweep/1", "sweep/2"])
    assert (grpo["n"], grpo["mean"], grpo["std"]) == (1, 0.8, None)
    paths = cmp.write_compare(rows, tmp_path / "out")
    assert paths[-1] == tmp_path / "out" / "plots" / "consistency.png" and paths[-1].read_bytes()[:8] == PNG_MAGIC
    text = paths[0].read_text()
    assert "## Consistency across runs" in text
    assert "| es | addition | tiny | 3 | 0.7333 | 0.1528 | 0.6000 | 0.9000 |" in text
    assert "| grpo | addition | tiny | 1 | 0.8000 | - | 0.8000 | 0.8000 |" in text
    assert json.loads(paths[1].read_text())["consistency"][0]["std"] == pytest.approx(std)
    buffer = io.StringIO()
    cmp.print_table(rows, Console(file=buffer, width=200))
    assert "consistency across runs" in buffer.getvalue() and "0.1528" in buffer.getvalue()


def test_consistency_figure(tmp_path):
    rows = cmp.collect([_seed_sweep(tmp_path, [0.6, 0.7, 0.9]), _run(tmp_path / "g", "grpo", 0.8, 0.5)])
    ax = cmp.consistency_figure(rows).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["es", "grpo"]  # task and model do not vary
    assert [len(c.get_offsets()) for c in ax.collections] == [3, 1]  # every run a dot


def test_no_consistency_without_repeated_strategies(plane, tmp_path):
    cmp.write_compare(plane, tmp_path)  # es has two runs here: a consistency.png, stale for the next
    rows = [row for row in plane if row.name in ("a", "b", "c")]
    paths = cmp.write_compare(rows, tmp_path)
    assert [p.name for p in paths] == ["compare.md", "compare.json", "compare.png", "reward_kl.png"]
    assert "Consistency across runs" not in paths[0].read_text()
    assert not (tmp_path / "plots" / "consistency.png").exists()


def test_strategy_from_the_summary_when_the_config_has_no_name(tmp_path):
    rows = cmp.collect([_run(tmp_path / "s", "sft", 0.7, 0.02, config_strategy=False)])
    assert (rows[0].strategy, rows[0].best_kl) == ("sft", 0.02)


def test_schema_kl():
    validate_summary(_summary("grpo", 0.7, 0.0))  # the base model's own KL: 0
    summary = _summary("grpo", 0.7, 0.1)
    summary["best"]["kl"] = -0.1
    with pytest.raises(jsonschema.ValidationError):
        validate_summary(summary)
