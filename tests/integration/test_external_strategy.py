"""A strategy from outside evora, registered from its own package and run end to end through
the CLI: Ray, vLLM workers, checkpoint, resume, summary, model cards, `evora compare`. Its
source is the worked example of docs/architecture.md (examples/mypkg/strategies.py), copied
into a temporary package that evora has never heard of, with the user's own task class
(examples/mypkg/tasks.py) and a name of their own for the model."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, SMALL, only_run_dir, run_evora
from evora.tracking.checkpoint import load
from evora.tracking.metrics import read_metrics
from evora.tracking.summary import validate_summary

STRATEGY = "userpkg.strategies:RandomSearch"


@pytest.fixture(scope="module")
def user_package(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user")
    (root / "userpkg").mkdir()
    (root / "userpkg" / "__init__.py").write_text("")
    for module in ("strategies.py", "tasks.py"):
        shutil.copy(ROOT / "examples" / "mypkg" / module, root / "userpkg" / module)
    return root


def test_no_evora_file_knows_the_example_strategy():
    found = subprocess.run(
        ["grep", "-rlE", "RandomSearch|random_search|userpkg", str(ROOT / "evora"), str(ROOT / "conf")],
        capture_output=True,
        text=True,
    )
    assert found.stdout == "", found.stdout


@pytest.mark.slow
def test_a_user_strategy_runs_checkpoints_resumes_and_compares(user_package, tmp_path):
    env = {"PYTHONPATH": str(user_package)}
    args = [
        f"strategy.name={STRATEGY}",
        "strategy.population=4",
        "task.name=userpkg.tasks:ReverseTask",
        "task.max_letters=4",  # the user's task's own key (its registered config)
        "model.name=my_model",
        *SMALL[1:],
        "engine=hf",  # the plugin is the point, not the engine
        "hardware.num_workers=1",
        f"tracking.out_dir={tmp_path}",
    ]
    first = run_evora([*args, "generations=2"], cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-4000:]
    run_dir = only_run_dir(tmp_path)
    assert "strategy random_search" in first.stdout and "best" in first.stdout
    assert load(run_dir / "checkpoints" / "latest.pt")["strategy"] == STRATEGY
    assert "max_letters: 4" in (run_dir / "config.yaml").read_text()  # resumed below: typed by the task's name

    resumed = run_evora([f"resume={run_dir}", "generations=3"], cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-4000:]
    assert "resumed at generation 2" in resumed.stdout
    assert [r["generation"] for r in read_metrics(run_dir)] == [0, 1, 2, 3]
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    validate_summary(summary)
    assert summary["strategy"] == STRATEGY and summary["generations"] == 3 and summary["center"] == "incumbent"
    assert (run_dir / "adapters" / "incumbent" / "adapter_model.safetensors").is_file()
    assert all(r["winner_solved"] >= 0 for r in read_metrics(run_dir)[1:])  # tell saw the per-prompt matrix
    # The finish's cards, with a command that names the user's model and task as keys.
    card = (run_dir / "adapters" / "incumbent" / "README.md").read_text()
    assert "model.name=my_model" in card and "model=" not in card
    assert "task=userpkg.tasks:ReverseTask" in card and "task.max_letters=4" in card  # a registered task composes

    compared = run_evora(["compare", str(run_dir), "--out", str(tmp_path / "cmp")], cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr[-3000:]
    assert STRATEGY in (tmp_path / "cmp" / "compare.md").read_text()


def test_an_unimportable_strategy_fails_in_one_line_before_ray(tmp_path):
    result = run_evora(["strategy.name=nopkg.nothere:Nothing", f"tracking.out_dir={tmp_path}"], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert 'strategy.name="nopkg.nothere:Nothing": cannot import it' in result.stderr
