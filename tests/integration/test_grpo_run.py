"""GRPO with its groups sampled on the engine workers, through the real CLI, Ray and both
engines: one worker resumed on two trains bitwise the adapter of two workers throughout (the
rollouts' units and seeds do not depend on the pool), and vLLM samples the tokens transformers
samples, with log-probabilities the trainer's own (importance-sampling ratios of 1). The same for
full weights (strategy=grpo_full), whose engines must hold the trainer's weights at every step for
those ratios to be 1. (TRL's loss on these rollouts against its own: tests/unit/test_grpo_trainer.py
and test_grpo_full.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import cli_run, fresh_run, resume_run
from evora.tracking.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("grpo-run")]

GRPO = (
    "+experiment=quickstart/grpo",
    "task.eval_size=16",
    "generations=2",
    "strategy.num_generations=4",
    "strategy.prompts_per_step=2",
    "strategy.steps_per_generation=2",
    "strategy.rows_per_unit=3",  # 8 rows a step in units of 3, 3 and 2
)
HF = (*GRPO, "engine=hf")
FULL = (
    "+experiment=quickstart/grpo_full",
    *GRPO[1:],
    "strategy.learning_rate=0.01",  # weights the engines missed would show in the ratios
    "strategy.importance_sampling=token_truncate",
)
RATIOS = ("min", "mean", "max")


def trained(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "adapters" / "trained" / "adapter_model.safetensors"))


def test_one_worker_resumed_on_two_trains_the_adapter_of_two_workers_throughout():
    two, _ = cli_run(*HF, "hardware.num_workers=2")
    records = read_metrics(two)[1:]
    assert all(r["tokens_generated"] > 0 and r["seconds_rollout"] > 0 for r in records)
    part, _ = fresh_run(*HF, "hardware.num_workers=1", "generations=1")
    assert "resumed at generation 1" in resume_run(part, "generations=2", "hardware.num_workers=2")
    a, b = trained(part), trained(two)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in read_metrics(part)[1:]] == [r["loss"] for r in records]


def test_vllm_samples_transformers_tokens_with_the_trainers_logprobs():
    vllm, _ = fresh_run(*GRPO, "hardware.num_workers=1", "strategy.importance_sampling=token_truncate")
    hf, _ = cli_run(*HF, "hardware.num_workers=2")
    ours, theirs = read_metrics(vllm)[1:], read_metrics(hf)[1:]
    for record, reference in zip(ours, theirs):
        assert record["tokens_generated"] == reference["tokens_generated"]  # the same completions
        assert record["reward"] == reference["reward"]
        assert record["loss"] == pytest.approx(reference["loss"], rel=1e-4)
        # the engine's log-probabilities of its own samples are the policy's: ratios of 1
        ratio = record["sampling/importance_sampling_ratio/mean"]
        assert ratio == pytest.approx(1.0, abs=1e-3)
        # the engines' scoring pass and TRL's old-policy pass, each over prompt and completion
        assert record["tokens_scored"] == 2 * (record["tokens_prompt"] + record["tokens_generated"])


def sampled_from_the_trainers_weights(record: dict) -> bool:
    """The engines' log-probabilities of their samples are the trainer's (every step's ratios 1):
    they held its weights, those each step's rollouts carried and those each generation set."""
    ratios = [record[f"sampling/importance_sampling_ratio/{s}"] for s in RATIOS]
    return all(abs(r - 1) < 1e-3 for r in ratios) and record["update_norm"] > 0


def test_full_weights_one_worker_resumed_on_two_train_the_weights_of_two_from_the_engines_samples():
    two, _ = cli_run(*FULL, "engine=hf", "hardware.num_workers=2")
    records = read_metrics(two)[1:]
    assert len(records) == 2 and all(sampled_from_the_trainers_weights(r) for r in records)
    part, _ = fresh_run(*FULL, "engine=hf", "hardware.num_workers=1", "generations=1")
    assert "resumed at generation 1" in resume_run(part, "generations=2", "hardware.num_workers=2")
    a, b = (load_file(str(run / "model" / "model.safetensors")) for run in (part, two))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in read_metrics(part)[1:]] == [r["loss"] for r in records]


def test_full_weights_on_vllm_sample_from_the_trainers_weights_at_every_step():
    vllm, _ = fresh_run(*FULL, "hardware.num_workers=1", "generations=1")
    [record] = read_metrics(vllm)[1:]
    assert sampled_from_the_trainers_weights(record) and record["steps"] == 2
