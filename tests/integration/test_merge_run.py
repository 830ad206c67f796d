"""strategy=merge end to end through the CLI, Ray and vLLM (+experiment=quickstart/merge, 5
generations): CMA-ES finds weights for the three bundled adapters that lift the held-out reward
from the base model's, the exported adapter is the combination of the last mean weights
(merge_weights.jsonl) and reloads in PEFT like its merged reference. When CMA-ES's stop() says so,
the run ends there (a fitness that ties every candidate), or restarts CMA-ES
(strategy.on_cma_stop=restart: the quickstart's candidates tie once it has found the merge). Its
determinism (1 and N workers, killed workers, a restarted driver) is test_chaos.py's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_model_families import assert_reloads_like_reference

from conftest import cli_run, resume_run
from evora.lora.modules import adaptable_modules
from evora.lora.peft_io import layout_of_adapter
from evora.strategies.merge.combine import combine
from evora.strategies.merge.sources import load_sources
from evora.tracking.metrics import read_metrics

pytestmark = pytest.mark.slow

ADAPTERS = ["evora:tiny_adapters/evolved", "evora:tiny_adapters/early", "evora:tiny_adapters/noise"]


def test_the_merge_quickstart_improves_and_exports_its_weights_combination(tiny_path):
    restart = "strategy.on_cma_stop=restart"  # its candidates tie once the merge is found (tolflatfitness)
    run_dir, stdout = cli_run("+experiment=quickstart/merge", "generations=5", "eval_every=5", restart)
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["best"]["reward"] > summary["base"]["reward"] + 0.2, summary
    weights = read_metrics(run_dir, "merge_weights.jsonl")
    assert [w["generation"] for w in weights] == [1, 2, 3, 4, 5] and "cma sigma" in stdout
    restarts = [w["generation"] for w in weights if w["cma_stop"] is not None]  # after each, a fresh CMA-ES
    assert restarts and read_metrics(run_dir)[-1]["cma_restarts"] == len(restarts), weights
    assert "ends the run" not in stdout and summary["stopped"] is None
    exported = run_dir / "adapters" / "merged"
    layout = layout_of_adapter(exported, adaptable_modules(tiny_path))
    expected = combine(
        load_sources(ADAPTERS, layout), np.array(weights[-1]["mean"]).reshape(3, 1), layout.rank, "concat"
    )
    tensors = load_file(str(exported / "adapter_model.safetensors"))
    assert tensors.keys() == expected.keys() and all(torch.equal(tensors[k], expected[k]) for k in expected)
    assert_reloads_like_reference(tiny_path, exported)


def test_a_fitness_that_ties_every_candidate_ends_the_run_where_cma_says_and_a_resume_runs_no_more():
    """task.fitness=0*reward: every candidate ties, so CMA-ES's stop() says tolfun after generation 1
    of 4; the run evaluates, exports and summarises there, and a resume of it runs no generation."""
    small = ("engine=hf", "task.prompts_per_generation=8", "task.eval_size=32", "task.selection_size=16")
    run_dir, stdout = cli_run(
        "+experiment=quickstart/merge", *small, "generations=4", "eval_every=0", "task.fitness=0*reward"
    )
    records = read_metrics(run_dir)
    assert [r["generation"] for r in records] == [0, 1] and "heldout_reward" in records[1]  # its last: evaluated
    why = records[1]["stop"]
    assert why.startswith("CMA-ES's stop() says tolfun=1e-11"), why
    assert stdout.count(f"the strategy ends the run after generation 1: {why}") == 1 and "gen    2" not in stdout
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["generations"] == 1 and summary["stopped"] == why and summary["final"] is not None
    assert (run_dir / "adapters" / "merged" / "adapter_model.safetensors").is_file()
    resumed = resume_run(run_dir)
    assert "resumed at generation 1" in resumed and "gen    2" not in resumed, resumed
    assert [r["generation"] for r in read_metrics(run_dir)] == [0, 1]
    assert json.loads((run_dir / "eval" / "summary.json").read_text())["generations"] == 1
