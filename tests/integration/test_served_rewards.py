"""task.reward=reward_model (a tiny sequence classifier built from a transformers config) and a user's
batched reward (@evora.batch_reward): scored against transformers' own forward one text at a time,
and each through a run of the quickstart to its end, its held-out rewards checked row by row."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

from conftest import ROOT, SMALL, TINY, only_run_dir, run_evora
from evora.config.schema import RewardModelConfig, TaskConfig
from evora.tasks import build_task
from evora.tasks.reward_pool import reward_scorer

pytestmark = pytest.mark.slow

RUN = [
    "+experiment=quickstart/es",
    *SMALL,
    "engine=hf",
    "hardware.num_workers=1",
    "generations=1",
    "task.selection_size=0",
]


@pytest.fixture(scope="module")
def classifier() -> Path:
    """A random-weight one-logit classifier with the tiny model's tokenizer (no chat template)."""
    folder = Path(tempfile.mkdtemp(prefix="evora-reward-model-"))
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_labels=1, pad_token_id=0, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(TINY).save_pretrained(folder)
    return folder


def held_out_rows(run_dir: Path) -> list[dict]:
    report = json.loads((run_dir / "eval" / "best_vs_base.json").read_text())
    return [row for group in report["counts"] for row in report[group]]


def test_the_reward_model_scores_batches_as_transformers_scores_each_text_alone(classifier):
    cfg = TaskConfig(
        name="addition", reward="reward_model", reward_model=RewardModelConfig(str(classifier), batch_size=4)
    )
    task = build_task(cfg, 0)
    examples = task.splits().heldout[:10]
    completions = [e.answer + " and more" * (i % 3) for i, e in enumerate(examples)]  # padded rows of other lengths
    scorer = reward_scorer(task, cfg, 0, "cpu")
    scores = scorer.score(completions, examples)
    model = LlamaForSequenceClassification.from_pretrained(classifier).eval()
    tokenizer = AutoTokenizer.from_pretrained(classifier)
    with torch.inference_mode():
        alone = [
            float(model(**tokenizer(e.prompt + c, return_tensors="pt")).logits[0, 0])
            for c, e in zip(completions, examples)
        ]
    assert scores.rewards == pytest.approx(alone, abs=1e-5) and not any(scores.failed)
    assert scores.correct == [r >= 0.0 for r in scores.rewards]


def test_a_run_rewarded_by_a_reward_model_scores_its_held_out_rows_with_it(classifier):
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    args = [*RUN, "task.reward=reward_model", f"task.reward_model.path={classifier}", f"tracking.out_dir={out}"]
    result = run_evora(args, cwd=out)
    assert result.returncode == 0, result.stderr[-4000:]
    model = LlamaForSequenceClassification.from_pretrained(classifier).eval()
    tokenizer = AutoTokenizer.from_pretrained(classifier)
    rows = held_out_rows(only_run_dir(out))
    with torch.inference_mode():
        for row in rows:
            logit = float(model(**tokenizer(row["prompt"] + row["adapter"], return_tensors="pt")).logits[0, 0])
            assert row["adapter_reward"] == pytest.approx(logit, abs=1e-4)


def test_a_run_with_a_users_batched_reward_scores_every_held_out_row_with_it():
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    args = [*RUN, "task.reward=mypkg.rewards:batch_score", "task.reward_batch_size=16", f"tracking.out_dir={out}"]
    result = run_evora(args, cwd=out, env={"PYTHONPATH": str(ROOT / "examples")})
    assert result.returncode == 0, result.stderr[-4000:]
    for row in held_out_rows(only_run_dir(out)):
        assert row["adapter_reward"] == (1.0 if row["answer"] in row["adapter"] else 0.0)
