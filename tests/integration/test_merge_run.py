"""strategy=merge end to end through the CLI and Ray (+experiment=quickstart/merge, 5 generations;
engine=hf, as the combined adapter is a LoRA like any other to an engine): CMA-ES finds weights
for the three bundled adapters that lift the held-out reward from the base model's, the exported
adapter is the combination of the last mean weights (merge_weights.jsonl) and reloads in PEFT
like its merged reference; once its candidates tie, CMA-ES's stop() ends the run there. Its
determinism (1 and N workers, killed workers, a restarted driver, strategy.on_cma_stop=restart)
is test_chaos.py's."""

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


def test_the_merge_quickstart_improves_exports_its_weights_combination_and_ends_where_cma_says(tiny_path):
    """Once CMA-ES has found the merge its candidates tie, and its stop() ends the run there
    (tolflatfitness, before the 5 planned generations): the run evaluates, exports and summarises
    at that generation, and a resume of it runs no more. The restart option's replay is
    test_merge.py's and, under kills, test_chaos.py's."""
    run_dir, stdout = cli_run(
        "+experiment=quickstart/merge", "generations=5", "eval_every=5", "engine=hf", "hardware.num_workers=1"
    )
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["best"]["reward"] > summary["base"]["reward"] + 0.2, summary
    weights, records = read_metrics(run_dir, "merge_weights.jsonl"), read_metrics(run_dir)
    done = summary["generations"]
    assert done < 5 and [w["generation"] for w in weights] == list(range(1, done + 1)) and "cma sigma" in stdout
    why = records[-1]["stop"]
    assert why.startswith("CMA-ES's stop() says ") and weights[-1]["cma_stop"] in why and summary["stopped"] == why
    assert stdout.count(f"the strategy ends the run after generation {done}: {why}") == 1
    assert "heldout_reward" in records[-1]  # its last generation is evaluated
    exported = run_dir / "adapters" / "merged"
    layout = layout_of_adapter(exported, adaptable_modules(tiny_path))
    expected = combine(
        load_sources(ADAPTERS, layout), np.array(weights[-1]["mean"]).reshape(3, 1), layout.rank, "concat"
    )
    tensors = load_file(str(exported / "adapter_model.safetensors"))
    assert tensors.keys() == expected.keys() and all(torch.equal(tensors[k], expected[k]) for k in expected)
    assert_reloads_like_reference(tiny_path, exported)
    resumed = resume_run(run_dir)
    assert f"resumed at generation {done}" in resumed and f"gen    {done + 1}" not in resumed, resumed
    assert [r["generation"] for r in read_metrics(run_dir)] == list(range(done + 1))
