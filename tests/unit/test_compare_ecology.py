"""The ecology's conditions table (issue 13): `evora compare` and `evora analyze` over hand-built
frozen / single / full ecology runs (summaries shaped like a real run's eval/summary.json) and a
compute-matched SFT run: the conditions rows, the "-" cells of a baseline, compare.md, compare.json,
the rich table, a sweep's report.md and a single ecology run's "Ecology" section. The ecology adds
them through its analysis hooks (evora.strategies.ecology.analysis), found through the registry."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from conftest import make_summary
from evora.analysis import compare as cmp
from evora.analysis import report
from evora.analysis.compare import tables
from evora.strategies.ecology import analysis as eco

BASE = 0.25  # the base model's held-out reward/accuracy in every run here


def _heldout(accuracy: float, tokens: float) -> dict[str, float]:
    return {"reward": accuracy, "accuracy": accuracy, "tokens": tokens}


def _details(condition: str, roi: float, births: int, merges: int, qd: float, portfolio: dict[str, float]) -> dict:
    """summary.details as Ecology.details + the portfolio evaluation write them."""
    return {
        "condition": condition,
        "episodes": 128,
        "mean_roi": roi,
        "births": births,
        "merges": merges,
        "retirements": births // 2,
        "population": 1 if condition != "full" else 4,
        "qd_coverage": qd,
        "energy": {"start": 2.0, "end": 3.5, "earned": 20.0, "spent": 18.0, "retired": -0.5},
        "routing": {"addition": "o0", "arithmetic": "o1" if condition == "full" else "o0", "default": "o0"},
        "portfolio": portfolio,
        "single_best": {"id": "o0", **_heldout(portfolio["accuracy"] - (0.0625 if condition == "full" else 0.0), 9.0)},
        "members": 1 if condition != "full" else 4,
    }


def _write(folder: Path, strategy: dict[str, Any], summary: dict[str, Any] | None) -> Path:
    """A run folder with what compare.read_row reads: config.yaml, metrics.jsonl, eval/summary.json."""
    (folder / "eval").mkdir(parents=True)
    config = {"seed": 0, "generations": 4, "task": {"name": "mix"}, "model": {"name": "tiny"}, "strategy": strategy}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    metrics = [{"generation": 0, "heldout_reward": BASE, "cumulative_flops": 0.0}]
    if summary is not None:
        metrics.append({"generation": 4, "heldout_reward": summary["best"]["reward"], "cumulative_flops": 1e9})
        (folder / "eval" / "summary.json").write_text(json.dumps(summary))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return folder


def _ecology_run(folder: Path, condition: str, **kw: Any) -> Path:
    details = _details(condition, **kw)
    best = details["single_best"]["accuracy"]
    summary = make_summary(BASE, best, best, strategy="ecology", generations=4, best_generation=4, details=details)
    return _write(folder, {"name": "ecology", "condition": condition}, summary)


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """A multirun folder over strategy.condition=frozen,single,full, as Hydra lays it out."""
    folder = tmp_path / "2026-11-23_10-00-00_quickstart_sweep"
    _ecology_run(folder / "0", "frozen", roi=0.1, births=0, merges=0, qd=0.0, portfolio=_heldout(BASE, 12.0))
    _ecology_run(folder / "1", "single", roi=0.15, births=0, merges=0, qd=0.0, portfolio=_heldout(0.375, 10.5))
    _ecology_run(folder / "2", "full", roi=0.2, births=6, merges=2, qd=1 / 6, portfolio=_heldout(0.5, 8.25))
    rows = [
        {"job": i, "overrides": f"strategy=ecology strategy.condition={c}", "final_heldout": f}
        for i, (c, f) in enumerate((("frozen", BASE), ("single", 0.375), ("full", 0.4375)))
    ]
    (folder / "sweep_summary.json").write_text(json.dumps(rows))
    return folder


@pytest.fixture
def sft(tmp_path: Path, sweep: Path) -> Path:
    """strategy=sft strategy.match=<the full run>: the compute-matched baseline."""
    summary = make_summary(BASE, 0.45, 0.4, strategy="sft", generations=2, best_generation=2)
    return _write(tmp_path / "sft", {"name": "sft", "match": str(sweep / "2"), "match_by": "flops"}, summary)


def _md_section(text: str, heading: str) -> dict[str, list[str]]:
    """The markdown table under `heading`, by its first cell (the run)."""
    block = text.split(heading, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| run ")]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip().strip("|").split("|")] for line in lines)}


def test_rows_read_the_ecology_details(sweep: Path, sft: Path):
    rows = {row.name.split("/")[-1]: row for row in cmp.collect([sweep, sft])}
    full = rows["2"].extra
    assert (full["condition"], full["episodes"], full["mean_roi"], full["births"], full["merges"]) == (
        "full",
        128,
        0.2,
        6,
        2,
    )
    assert full["retirements"] == 3 and rows["2"].arm == "full"
    assert (full["qd_coverage"], full["portfolio_accuracy"], full["portfolio_tokens"]) == (
        pytest.approx(1 / 6),
        0.5,
        8.25,
    )
    assert full["single_best_accuracy"] == 0.4375 and rows["2"].matched is None
    baseline = rows["sft"]
    assert baseline.extra == {} and baseline.arm is None
    assert (baseline.matched, baseline.matched_by, baseline.best_accuracy, baseline.best_tokens) == (
        str(sweep / "2"),
        "flops",
        0.45,
        4.0,
    )
    assert [eco.condition_label(rows[k], rows[k].strategy == "ecology") for k in ("0", "1", "2", "sft")] == [
        "frozen",
        "single",
        "full",
        "sft (matched)",
    ]


def test_unfinished_ecology_takes_its_condition_from_the_config(tmp_path: Path):
    row = cmp.read_row("running", _write(tmp_path / "running", {"name": "ecology", "condition": "single"}, None))
    assert row.arm == "single" and row.extra["condition"] == "single" and row.extra["episodes"] is None
    cells = tables.table_cells(eco.CONDITIONS, "ecology", row)
    assert cells == ["running", "single", "-", "-", "-", "-", "-", "-"]


def test_conditions_markdown(sweep: Path, sft: Path, tmp_path: Path):
    rows = cmp.collect([sweep, sft])
    text = cmp.write_compare(rows, tmp_path / "out")[0].read_text()
    table = _md_section(text, "## Ecology conditions")
    name = sweep.name
    assert table[f"{name}/0"] == [f"{name}/0", "frozen", "128", "0.1000", "0", "0.0000", "0.2500", "12.00"]
    assert table[f"{name}/1"] == [f"{name}/1", "single", "128", "0.1500", "0", "0.0000", "0.3750", "10.50"]
    assert table[f"{name}/2"] == [f"{name}/2", "full", "128", "0.2000", "2", "0.1667", "0.5000", "8.25"]
    # A baseline: "-" in the ecology's own columns, its best adapter's held-out accuracy and tokens.
    assert table["sft"] == ["sft", "sft (matched)", "-", "-", "-", "-", "0.4500", "4.00"]
    assert "| run | condition | episodes | mean ROI | merges | QD coverage | held-out accuracy |" in text
    # matched by one measure, shown in all three
    spent = "1.0e+09 FLOPs, 150 tokens, 2.0 s of search"
    assert f"- `sft` is compute-matched to `{name}/2` by flops: {spent}; `{name}/2` spent {spent}." in text
    # The runs table is unchanged, and three conditions are three arms, not a spread over seeds.
    assert text.startswith("# Held-out reward, KL and search compute\n\n| run | strategy | base |")
    assert "## Consistency across runs" not in text


def test_conditions_json(sweep: Path, sft: Path, tmp_path: Path):
    data = json.loads(cmp.write_compare(cmp.collect([sweep, sft]), tmp_path / "out")[1].read_text())
    conditions = {c["run"].split("/")[-1]: c for c in data["conditions"]}
    assert conditions["0"] == {
        "run": f"{sweep.name}/0",
        "condition": "frozen",
        "ecology": True,
        "episodes": 128,
        "mean_roi": 0.1,
        "merges": 0,
        "qd_coverage": 0.0,
        "heldout_accuracy": BASE,
        "heldout_tokens": 12.0,
        "matched": None,
        "matched_by": None,
    }
    assert conditions["2"]["heldout_accuracy"] == 0.5 and conditions["2"]["merges"] == 2
    baseline = conditions["sft"]
    assert (baseline["condition"], baseline["ecology"], baseline["episodes"], baseline["mean_roi"]) == (
        "sft (matched)",
        False,
        None,
        None,
    )
    assert (baseline["heldout_accuracy"], baseline["heldout_tokens"], baseline["matched"]) == (
        0.45,
        4.0,
        f"{sweep.name}/2",
    )
    runs = {run["name"].split("/")[-1]: run for run in data["runs"]}
    assert runs["2"]["portfolio_tokens"] == 8.25 and runs["sft"]["qd_coverage"] is None


def test_no_conditions_without_an_ecology(sft: Path, tmp_path: Path):
    rows = cmp.collect([sft])  # its matched run is not compared: named as configured
    data = cmp.compare_json(rows)
    assert "conditions" not in data and "Ecology conditions" not in cmp.markdown(rows)
    assert cmp.strategy_table_lines(rows) == []


def test_matched_run_not_compared_is_named_by_its_path(sweep: Path, sft: Path):
    rows = cmp.collect([sweep / "0", sft])
    assert f"is compute-matched to `{sweep / '2'}` (not compared here) by flops" in cmp.markdown(rows)


def test_rich_table_has_the_conditions(sweep: Path, sft: Path):
    buffer = io.StringIO()
    cmp.print_table(cmp.collect([sweep, sft]), Console(file=buffer, width=250))
    out = buffer.getvalue()
    assert "ecology conditions" in out and "sft (matched)" in out and "QD coverage" in out
    line = next(line for line in out.splitlines() if "sft (matched)" in line)
    assert [cell.strip() for cell in line.strip("│ ").split("│")][2:] == ["-", "-", "-", "-", "0.4500", "4.00"]


def test_sweep_report_has_the_conditions_table(sweep: Path):
    report.analyze(sweep)
    text = (sweep / "report.md").read_text()
    assert "# Sweep report" in text and "| `strategy=ecology strategy.condition=full` | 1 | 0.4375 |" in text
    table = _md_section(text, "## Ecology conditions")
    assert table["0"] == ["0", "frozen", "128", "0.1000", "0", "0.0000", "0.2500", "12.00"]
    assert table["2"][1:5] == ["full", "128", "0.2000", "2"]


def test_run_report_has_an_ecology_section(sweep: Path, sft: Path):
    text = report.write_report(sweep / "2", plots=[]).read_text()
    section = text.split("## Ecology\n", 1)[1].split("\n## ", 1)[0]
    assert "Condition `full`: 128 episodes, mean ROI 0.2000 per episode; births 6 (merges 2), retirements 3" in section
    assert "QD coverage 0.1667" in section and "Energy: 2.0000 at the start, 3.5000 at the end" in section
    assert "| routed portfolio | 0.5000 | 0.5000 | 8.2500 |" in section
    assert "| single best organelle (`o0`) | 0.4375 | 0.4375 | 9.0000 |" in section
    assert "| base model | 0.2500 | 0.2500 | 4.0000 |" in section
    assert "`addition` -> `o0`, `arithmetic` -> `o1`, `default` -> `o0`" in section
    assert "## Ecology" not in report.write_report(sft, plots=[]).read_text()  # other strategies: no section
