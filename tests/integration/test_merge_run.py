"""strategy=merge end to end through the CLI, Ray and vLLM (+experiment=quickstart/merge, 5
generations): CMA-ES finds weights for the three bundled adapters that lift the held-out reward
from the base model's, the exported adapter is the combination of the last mean weights
(merge_weights.jsonl) and reloads in PEFT like its merged reference. Its determinism (1 and N
workers, killed workers, a restarted driver) is test_chaos.py's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_model_families import assert_reloads_like_reference

from conftest import cli_run
from evora.lora.modules import adaptable_modules
from evora.lora.peft_io import layout_of_adapter
from evora.strategies.merge.combine import combine
from evora.strategies.merge.sources import load_sources
from evora.tracking.metrics import read_metrics

pytestmark = pytest.mark.slow

ADAPTERS = ["evora:tiny_adapters/evolved", "evora:tiny_adapters/early", "evora:tiny_adapters/noise"]


def test_the_merge_quickstart_improves_and_exports_its_weights_combination(tiny_path):
    run_dir, stdout = cli_run("+experiment=quickstart/merge", "generations=5", "eval_every=5")
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["best"]["reward"] > summary["base"]["reward"] + 0.2, summary
    weights = read_metrics(run_dir, "merge_weights.jsonl")
    assert [w["generation"] for w in weights] == [1, 2, 3, 4, 5] and "cma sigma" in stdout
    exported = run_dir / "adapters" / "merged"
    layout = layout_of_adapter(exported, adaptable_modules(tiny_path))
    expected = combine(
        load_sources(ADAPTERS, layout), np.array(weights[-1]["mean"]).reshape(3, 1), layout.rank, "concat"
    )
    tensors = load_file(str(exported / "adapter_model.safetensors"))
    assert tensors.keys() == expected.keys() and all(torch.equal(tensors[k], expected[k]) for k in expected)
    assert_reloads_like_reference(tiny_path, exported)
