"""strategy=randopt end to end through the CLI, Ray and vLLM (+experiment=quickstart/randopt, 3
rounds): the distilled adapter lifts the held-out reward from the base model's after its first
round, every round reports its ensemble's vote and what it distilled, the SFT's tokens count as
training compute, and the exported adapter reloads in PEFT like its merged reference. Its
determinism (1 and N workers, killed workers, a restarted driver) is test_chaos.py's."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file
from test_model_families import assert_reloads_like_reference

from conftest import cli_run
from evora.tracking.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_the_randopt_quickstart_distils_an_ensemble_that_beats_the_base_model(tiny_path):
    run_dir, stdout = cli_run(
        "+experiment=quickstart/randopt", "generations=3", "strategy.population=16", "hardware.num_workers=1"
    )
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    records = read_metrics(run_dir)
    assert records[1]["heldout_reward"] > summary["base"]["reward"] + 0.2, (records[1], summary["base"])
    rounds = records[1:]
    assert all(r["distil_examples"] > 0 and r["distil_steps"] > 0 and 0 <= r["ensemble_accuracy"] <= 1 for r in rounds)
    assert [r["distil_examples"] for r in rounds] == sorted(r["distil_examples"] for r in rounds)  # cumulative
    assert summary["compute"]["search"]["tokens_trained"] > 0 and "ensemble" in stdout
    assert_reloads_like_reference(tiny_path, run_dir / "adapters" / "distilled")


def test_randopt_with_eggrolls_weight_perturbations_beats_the_base_model_and_exports_its_slot_zero():
    """perturbation=eggroll (engine=hf: the candidates are ordinary LoRAs on either engine): the
    first round lifts the held-out reward, and the exported adapter's last slot, which carried the
    perturbations, is zero."""
    run_dir, _ = cli_run(
        "+experiment=quickstart/randopt",
        "engine=hf",
        "hardware.num_workers=1",
        "generations=1",
        "strategy.population=16",
        "strategy.perturbation=eggroll",
        "strategy.sigma=0.015",
        "lora.rank=8",
        "lora.alpha=8",
    )
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert read_metrics(run_dir)[1]["heldout_reward"] > summary["base"]["reward"] + 0.2
    adapter = load_file(str(run_dir / "adapters" / "distilled" / "adapter_model.safetensors"))
    for name, tensor in adapter.items():
        last = tensor[-1:] if "lora_A" in name else tensor[:, -1:]
        assert not last.any() and tensor.any(), name
