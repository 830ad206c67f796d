"""Analysis through the registry (issue 26): a strategy evora has never heard of registers its own
figures, report section, findings and compare table, and `evora analyze` / `evora compare` show
them; evora.analysis and evora.tracking name no strategy."""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from matplotlib.figure import Figure
from rich.console import Console

from conftest import make_summary
from evora.analysis import compare as cmp
from evora.analysis import plots, report
from evora.strategies import registry
from evora.strategies.analysis_hooks import Analysis, Compare, CompareTable, RunData
from evora.strategies.registry import register_strategy

EVORA = Path(__file__).resolve().parents[2] / "evora"


@dataclass(frozen=True)
class DiceConfig:
    name: str = "dice"
    faces: int = 6
    population: int = 1  # a job's members (kinds.JOB)


def _figures(run: RunData) -> dict:
    def draw() -> Figure:
        fig = Figure()
        fig.add_subplot().plot([0, 1], [len(run.metrics), 0])
        return fig

    return {"dice_rolls": draw}


def _fields(config: dict, summary: dict | None) -> dict:
    details = (summary or {}).get("details") or {}
    return {"faces": config["strategy"]["faces"], "sixes": details.get("sixes")}


DICE_TABLE = CompareTable(
    heading="## Dice",
    intro="How many sixes each run threw.",
    title="dice rolls",
    json_key="dice",
    columns=("faces", "sixes"),
    cells=lambda row, mine: [str(row.extra["faces"]), str(row.extra["sixes"])] if mine else ["-", "-"],
    record=lambda row, mine: {"sixes": row.extra.get("sixes")},
)
DICE = Analysis(
    figures=_figures,
    omit_figures=("timing",),
    titles={"dice_rolls": "Dice: rolls"},
    report=lambda run: ["## Dice", "", f"{run.summary['details']['sixes']} sixes.", ""],
    findings=lambda run: ["The dice were fair."],
    compare=Compare(fields=_fields, keys=("faces", "sixes"), arm="faces", table=DICE_TABLE),
)


@pytest.fixture
def dice(monkeypatch):
    """`dice` registered for this test only."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_ALIASES", dict(registry._ALIASES))
    register_strategy("dice", config=DiceConfig, summary="dice", runner="dice:never_run", analysis=DICE)  # no run


def _run(folder: Path, strategy: dict, details: dict | None = None) -> Path:
    (folder / "eval").mkdir(parents=True)
    config = {"seed": 0, "generations": 2, "task": {"name": "addition"}, "model": {"name": "tiny"}}
    (folder / "config.yaml").write_text(yaml.safe_dump({**config, "strategy": strategy}))
    metrics = [
        {"generation": 1, "reward_mean": 0.4, "reward_max": 0.5, "seconds_generate": 1.0},
        {"generation": 2, "reward_mean": 0.5, "reward_max": 0.6, "seconds_generate": 1.0},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    summary = make_summary(0.25, 0.5, 0.5, strategy=strategy["name"], generations=2, details=details)
    (folder / "eval" / "summary.json").write_text(json.dumps(summary))
    return folder


def test_a_registered_strategy_adds_its_figures_report_and_findings(dice, tmp_path: Path):
    run = _run(tmp_path / "dice", {"name": "dice", "faces": 6}, {"sixes": 3})
    makers = plots.figures(run)
    assert list(makers) == ["reward", "dice_rolls"]  # its figure added, the generic timing left out
    assert makers["dice_rolls"]().axes[0].lines
    text = report.write_report(run, plots.write_plots(run)).read_text()
    assert "## Dice\n\n3 sixes." in text and "- The dice were fair." in text
    assert "### Dice: rolls\n\n![dice_rolls](plots/dice_rolls.png)" in text


def test_a_registered_compare_table_shows_in_every_output(dice, tmp_path: Path):
    rolled = _run(tmp_path / "rolled", {"name": "dice", "faces": 20}, {"sixes": 7})
    es = _run(tmp_path / "es", {"name": "es"})
    rows, paths = cmp.compare([rolled, es], tmp_path / "out")
    assert rows[0].extra == {"faces": 20, "sixes": 7} and rows[0].arm == "20" and rows[1].extra == {}
    text = paths[0].read_text()
    assert "## Dice\n\nHow many sixes each run threw.\n\n| run | faces | sixes |" in text
    assert "| rolled | 20 | 7 |" in text and "| es | - | - |" in text
    data = json.loads(paths[1].read_text())
    assert data["dice"] == [
        {"run": "rolled", "sixes": 7, "matched": None, "matched_by": None},
        {"run": "es", "sixes": None, "matched": None, "matched_by": None},
    ]
    assert data["runs"][0]["sixes"] == 7 and data["runs"][1]["faces"] is None
    assert data["consistency"][0]["strategy"] == "dice (20)"  # an arm, not a repeat
    buffer = io.StringIO()
    cmp.print_table(rows, Console(file=buffer, width=250))
    assert "dice rolls" in buffer.getvalue()


def test_without_the_strategy_there_is_no_table(dice, tmp_path: Path):
    rows, paths = cmp.compare([_run(tmp_path / "es", {"name": "es"})], tmp_path / "out")
    assert "## Dice" not in paths[0].read_text() and "dice" not in json.loads(paths[1].read_text())


def test_an_unknown_strategy_still_renders(tmp_path: Path):
    run = _run(tmp_path / "lost", {"name": "nowhere.to.be:Found"})
    assert "reward" in plots.figures(run)
    assert "# Run report: lost" in report.write_report(run, plots=[]).read_text()
    assert cmp.collect([run])[0].extra == {}


def test_analysis_and_tracking_name_no_strategy():
    names = "|".join(entry.name for entry in registry.entries())
    pattern = re.compile(rf"\b({names})\b|organelle", re.IGNORECASE)
    found = [
        f"{path.relative_to(EVORA)}:{number}: {line.strip()}"
        for folder in ("analysis", "tracking")
        for path in sorted((EVORA / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if pattern.search(line)
    ]
    assert {"es", "ga", "pbt", "ecology"} <= {entry.name for entry in registry.entries()}
    assert found == []


def test_every_registered_strategys_hooks_resolve():
    hooks = {entry.name: entry.analysis_hooks() for entry in registry.entries()}
    assert all(isinstance(h, Analysis) for h in hooks.values())
    assert hooks["ecology"].compare is not None and hooks["ecology"].report is not None
    assert hooks["pbt"].figures is not None and "lineage" in hooks["pbt"].omit_figures
