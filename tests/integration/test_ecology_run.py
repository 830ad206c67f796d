"""strategy=ecology end to end through the CLI on model=tiny_mix (task=mix: its four families,
+experiment=quickstart/ecology_mix): births, merges and retirements happen; the routed portfolio
beats the base model and scores at least the single best organelle; energy adds up; the
ecology's files and plots are written; 1 and 2 workers and a resumed run give the same
ecology bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import cli_run, fresh_run, resume_run, run_evora
from evora.tracking.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ecology-run")]

ECOLOGY = ["+experiment=quickstart/ecology_mix", "engine=hf", "generations=10", "eval_every=5"]
FAMILIES = {"addition", "difference", "reversal", "letter_count"}
PLOTS = ("ecology_population", "ecology_roi", "ecology_ancestry", "ecology_archive", "ecology_routing")


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "eval" / "summary.json").read_text())


def organelles(run_dir: Path) -> dict:
    folder = run_dir / "adapters" / "organelles"
    return {p.name: load_file(p / "adapter_model.safetensors") for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def two_workers() -> tuple[Path, str]:
    return cli_run(*ECOLOGY, "hardware.num_workers=2")


def test_the_ecology_lives_reproduces_and_its_portfolio_beats_the_base_model(two_workers):
    run_dir, stdout = two_workers
    details = summary_of(run_dir)["details"]
    assert details["births"] >= 1 and details["merges"] >= 1 and details["retirements"] >= 1, details
    energy = details["energy"]
    assert energy["end"] - energy["start"] == pytest.approx(energy["earned"] - energy["spent"] - energy["retired"])
    base = summary_of(run_dir)["base"]
    assert details["portfolio"]["reward"] >= details["single_best"]["reward"], details
    assert details["portfolio"]["reward"] > base["reward"], (details["portfolio"], base)
    best = load_file(run_dir / "adapters" / "best" / "adapter_model.safetensors")
    single = organelles(run_dir)[details["single_best"]["id"]]  # adapters/best: the single best on selection
    assert best.keys() == single.keys() and all(best[k].equal(single[k]) for k in single)
    assert summary_of(run_dir)["best"]["reward"] == details["single_best"]["reward"]
    routing = json.loads((run_dir / "routing.json").read_text())
    assert routing["routing"] == details["routing"] and set(routing["adapters"]) == set(organelles(run_dir))
    assert routing["routing"]["default"] in routing["adapters"]
    episodes = read_metrics(run_dir, "episodes.jsonl")
    assert len(episodes) == details["episodes"] and {e["family"] for e in episodes} == FAMILIES
    lineage = read_metrics(run_dir, "lineage.jsonl")
    assert {r["op"] for r in lineage} >= {"merge"} and len(lineage) == details["births"]
    assert "routing" in stdout
    archive = read_metrics(run_dir, "archive.jsonl")
    assert [a["generation"] for a in archive] == list(range(1, 11))
    assert len(archive[-1]["cells"]) / (len(FAMILIES) * 3) == pytest.approx(details["qd_coverage"])
    assert set(routing["selection_scores"]) == FAMILIES


def test_analyze_draws_the_ecology_and_reports_it(two_workers, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(two_workers[0], copy)
    result = run_evora(["analyze", str(copy)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert all((copy / "plots" / f"{name}.png").is_file() for name in PLOTS)
    report = (copy / "report.md").read_text()
    assert "## Ecology" in report and all(f"plots/{name}.png" in report for name in PLOTS)


def test_one_and_two_workers_and_a_resumed_run_give_the_same_ecology(two_workers):
    """Worker counts and resume in one: one worker for generations 1-5, resumed on two for 6-10,
    against two workers uninterrupted."""
    two = two_workers[0]
    part, _ = fresh_run(*ECOLOGY[:-2], "generations=5", "eval_every=5", "hardware.num_workers=1")
    assert "resumed at generation 5" in resume_run(part, "generations=10", "hardware.num_workers=2")
    assert read_metrics(part, "episodes.jsonl") == read_metrics(two, "episodes.jsonl")
    assert read_metrics(part, "organelles.jsonl") == read_metrics(two, "organelles.jsonl")
    reference, adapters = organelles(two), organelles(part)
    assert list(adapters) == list(reference)
    for name, tensors in adapters.items():
        for key, value in tensors.items():
            assert value.equal(reference[name][key]), (name, key)
    assert summary_of(part)["details"]["routing"] == summary_of(two)["details"]["routing"]
