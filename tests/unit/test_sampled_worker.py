"""A real worker on the transformers engine (no Ray) that samples: each cell's samples come
from the seeds `sample_seed` names (checked by generating them again directly on the
engine), every sample's tokens are counted, evaluations share one stream, the same unit,
whole or split, gives bitwise the same numbers, and so does a routed unit on its own prompts."""

from __future__ import annotations

import numpy as np
import pytest

from evora.distributed.evaluate import unit_columns, unit_prompts, widened
from evora.distributed.worker import EngineWorker, WorkUnit
from evora.distributed.worker_spec import worker_spec
from evora.engines import Sampling
from evora.lora.init import random_adapter
from evora.lora.layout import build_layout
from evora.plan.compose import compose_run
from evora.strategies.protocol import BASE, CENTER, CandidateSpec, EvalPayload
from evora.tasks.aggregate import pass_at_k
from evora.tasks.decoding import sample_seed

SAMPLES = 4
INDICES = (0, 1, 2, 3, 4, 5)


@pytest.fixture(scope="module")
def layout(tiny_shapes, tiny_path):
    return build_layout(
        tiny_shapes, rank=8, alpha=16, target_modules=["q_proj", "v_proj"], layers=None, base_model=tiny_path
    )


@pytest.fixture(scope="module")
def run():
    return compose_run(
        [
            "engine=hf",
            "task.eval_size=8",
            "task.max_tokens=6",
            "task.eval_temperature=1.0",
            f"task.eval_samples={SAMPLES}",
        ]
    )


@pytest.fixture(scope="module")
def worker(run, layout, tiny_path):
    worker = EngineWorker(worker_spec(run, tiny_path, layout, "pytest-sampled-worker", with_strategy=False), 0)
    yield worker
    worker.shutdown()


@pytest.fixture(scope="module")
def payload(layout):
    return EvalPayload(random_adapter(layout, seed=3, a_std=None, b_std=0.5), layout)


SPECS = (CandidateSpec(0, 0, op=BASE), CandidateSpec(0, 1, op=CENTER))


def test_a_cells_samples_are_the_seeded_completions_and_every_sample_counts(worker, run, payload):
    result = worker.evaluate(payload, WorkUnit(SPECS, "heldout", INDICES))
    prompts = [worker.prompt_ids("heldout", i) for i in INDICES]
    seeds = [sample_seed(run.seed, "heldout", "evaluation", i, s) for i in INDICES for s in range(SAMPLES)]
    requests = [p for p in prompts for _ in range(SAMPLES)]
    sampling = [Sampling(1.0, 1.0, seed) for seed in seeds]
    base = worker.engine.generate(requests, [None] * len(requests), 6, sampling)  # again, directly
    examples = [worker.splits.heldout[i] for i in INDICES for _ in range(SAMPLES)]
    rewards = np.array([worker.task.reward(c.text, e) for c, e in zip(base, examples)]).reshape(-1, SAMPLES)
    correct = np.array([worker.task.correct(c.text, e) for c, e in zip(base, examples)]).reshape(-1, SAMPLES)
    np.testing.assert_array_equal(result.rewards[0], rewards.mean(axis=1))
    np.testing.assert_array_equal(result.correct_counts[0], correct.sum(axis=1))
    assert result.samples == SAMPLES and result.correct.dtype == np.float64
    assert len({c.text for c in base}) > len(INDICES)  # the samples of a prompt differ
    # Compute counts every sample of both ops: prompts prefilled and tokens generated.
    assert result.tokens_prompt == 2 * SAMPLES * sum(len(p) for p in prompts)
    assert result.tokens_generated == pytest.approx(SAMPLES * result.tokens.sum())
    assert result.tokens_generated >= sum(c.num_tokens for c in base)
    per_example = [pass_at_k(SAMPLES, int(c), 2) for c in result.correct_counts[1]]
    assert 0.0 <= float(np.mean(per_example)) <= 1.0


def test_base_and_center_share_the_evaluation_stream(worker, layout):
    """Common random numbers: the center with a zero adapter is the base model, so it draws the
    same samples and scores the same, whichever row it is in."""
    zero = {k: v * 0 for k, v in random_adapter(layout, seed=3, a_std=None, b_std=0.5).items()}
    result = worker.evaluate(EvalPayload(zero, layout), WorkUnit(SPECS, "heldout", INDICES))
    np.testing.assert_array_equal(result.rewards[0], result.rewards[1])
    np.testing.assert_array_equal(result.correct_counts[0], result.correct_counts[1])


def test_the_same_unit_whole_split_or_again_gives_bitwise_the_same_numbers(worker, payload):
    whole = worker.evaluate(payload, WorkUnit(SPECS, "heldout", INDICES))
    again = worker.evaluate(payload, WorkUnit(SPECS, "heldout", INDICES))
    alone = [worker.evaluate(payload, WorkUnit((spec,), "heldout", INDICES)) for spec in SPECS]
    for other in (again, *alone):
        rows = [SPECS.index(s) for s in SPECS if s.index in other.indices]
        np.testing.assert_array_equal(whole.rewards[rows], other.rewards)
        np.testing.assert_array_equal(whole.correct_counts[rows], other.correct_counts)
        np.testing.assert_array_equal(whole.tokens[rows], other.tokens)


def test_a_routed_unit_on_its_own_prompts_widened_is_the_unit_on_every_prompt(worker, payload):
    """What the search does with routed specs (the ecology's): each unit evaluates only the
    prompts its specs name, and the driver widens the result to the generation's prompts."""
    routed = (CandidateSpec(0, 0, op=BASE, prompts=(1, 4)), CandidateSpec(0, 1, op=CENTER, prompts=(2, 4)))
    own = unit_prompts(list(routed), INDICES)
    whole = worker.evaluate(payload, WorkUnit(routed, "heldout", INDICES, keep_texts=True))
    narrow = worker.evaluate(payload, WorkUnit(routed, "heldout", own, keep_texts=True))
    assert own == (1, 2, 4) and narrow.rewards.shape == (2, 3)
    [columns] = unit_columns(INDICES, [WorkUnit(routed, "heldout", own)])
    wide = widened(narrow, columns, len(INDICES))
    for field in ("rewards", "correct", "tokens", "correct_counts", "evaluated"):
        expected, got = getattr(whole, field), getattr(wide, field)
        assert got.dtype == expected.dtype, field
        np.testing.assert_array_equal(got, expected, err_msg=field)
    assert wide.texts == whole.texts and wide.evaluated.sum() == 4
    assert (wide.tokens_prompt, wide.tokens_generated) == (whole.tokens_prompt, whole.tokens_generated)
