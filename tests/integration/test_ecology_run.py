"""strategy=ecology end to end through the CLI on the tiny model (task=mix: addition and arithmetic):
births, merges and retirements happen; the routed portfolio beats the base model and
scores at least the single best organelle; energy adds up; 1 and 2 workers and a resumed
run give the same ecology bit for bit."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import cli_run, only_run_dir, run_evora
from evora.tracking.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ecology-run")]

ECOLOGY = ["task=mix", "strategy=ecology", "engine=hf", "generations=6", "eval_every=3"]


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "eval" / "summary.json").read_text())


def organelles(run_dir: Path) -> dict:
    folder = run_dir / "adapters" / "organelles"
    return {p.name: load_file(p / "adapter_model.safetensors") for p in sorted(folder.iterdir())}


def test_the_ecology_lives_reproduces_and_its_portfolio_beats_the_base_model():
    run_dir, stdout = cli_run(*ECOLOGY, "hardware.num_workers=2")
    details = summary_of(run_dir)["details"]
    assert details["births"] >= 1 and details["merges"] >= 1 and details["retirements"] >= 1, details
    energy = details["energy"]
    assert energy["end"] - energy["start"] == pytest.approx(energy["earned"] - energy["spent"] - energy["retired"])
    base = summary_of(run_dir)["base"]
    assert details["portfolio"]["reward"] >= details["single_best"]["reward"], details
    assert details["portfolio"]["reward"] > base["reward"], (details["portfolio"], base)
    routing = json.loads((run_dir / "routing.json").read_text())
    assert routing["routing"] == details["routing"] and set(routing["adapters"]) == set(organelles(run_dir))
    assert routing["routing"]["default"] in routing["adapters"]
    episodes = read_metrics(run_dir, "episodes.jsonl")
    assert len(episodes) == details["episodes"] and {e["family"] for e in episodes} == {"addition", "arithmetic"}
    lineage = read_metrics(run_dir, "lineage.jsonl")
    assert {r["op"] for r in lineage} >= {"merge"} and len(lineage) == details["births"]
    assert "routing" in stdout


def test_one_and_two_workers_and_a_resumed_run_give_the_same_ecology():
    two, _ = cli_run(*ECOLOGY, "hardware.num_workers=2")
    one, _ = cli_run(*ECOLOGY, "hardware.num_workers=1")
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    first = run_evora([f"tracking.out_dir={out}", *ECOLOGY[:-2], "generations=3", "eval_every=3"], cwd=out)
    assert first.returncode == 0, first.stderr[-4000:]
    part = only_run_dir(out)
    second = run_evora([f"resume={part}", "generations=6"], cwd=out)
    assert second.returncode == 0, second.stderr[-4000:]
    reference = organelles(two)
    for other in (one, part):
        assert read_metrics(other, "episodes.jsonl") == read_metrics(two, "episodes.jsonl")
        assert read_metrics(other, "organelles.jsonl") == read_metrics(two, "organelles.jsonl")
        adapters = organelles(other)
        assert list(adapters) == list(reference)
        for name, tensors in adapters.items():
            for key, value in tensors.items():
                assert value.equal(reference[name][key]), (other, name, key)
        assert summary_of(other)["details"]["routing"] == summary_of(two)["details"]["routing"]
