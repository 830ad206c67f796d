"""strategy=randopt off the cluster: the top K, the ensemble's majority vote and the completions a
round distils against hand-worked cases; candidates as the round's adapter plus sigma times the
member's seeded noise; and a round on the bundled tiny model and the CPU: `tell` keeps the
ensemble's completions, `refine` votes with the task's canonical answers and distils them with the
SFT baseline's trainer, seeded, its tokens counted as spend."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_ecology_sft import TINY, training_context

from evora.errors import ConfigError
from evora.lora.noise import member_noise
from evora.strategies.protocol import GenerationResults, StrategyContext, state_fields
from evora.strategies.randopt import RandOpt, RandOptConfig
from evora.strategies.randopt.ensemble import targets, top_k, vote
from evora.strategies.randopt.strategy import RandOptState, unique
from evora.tasks import build_task, task_config


def test_top_k_takes_the_fittest_first_and_the_lower_row_on_ties():
    assert top_k(np.array([0.5, 0.9, 0.5, 0.1, 0.9]), 3) == [1, 4, 0]


def test_the_vote_is_the_commonest_answer_and_ties_go_to_the_fitter_members():
    assert vote(["4", "5", "5", None]) == vote(["4", "5", "5"]) and vote(["4", "5", "5"]).answer == "5"
    assert vote(["4", "5", "5"]).member == 1
    assert vote(["7", "3", "3", "7"]).answer == "7"  # 2 against 2: the fittest member's
    assert vote([None, None]).member is None


def test_correct_targets_put_the_majoritys_first_then_the_shorter_and_keep_distinct_ones():
    completions = [" 12 and more", " 12", " 13", " 12", " 13!", ""]
    answers = ["12", "12", "13", "12", "13", None]
    correct = [True, True, False, True, True, True]
    assert targets(completions, answers, correct, "correct", 8) == [" 12", " 12 and more", " 13!"]
    assert targets(completions, answers, correct, "correct", 1) == [" 12"]


def test_vote_targets_are_the_fittest_majority_completion_right_or_wrong():
    completions, answers = [" 9", " 8 x", " 8"], ["9", "8", "8"]
    assert targets(completions, answers, [True, False, False], "vote", 8) == [" 8 x"]
    assert targets(["", ""], [None, None], [False, False], "vote", 8) == []


def test_unique_keeps_the_first_of_each_prompt_and_completion():
    rows = [{"example": 1, "completion": "a"}, {"example": 2, "completion": "a"}, {"example": 1, "completion": "a"}]
    assert unique(rows) == rows[:2]


def start(cfg: RandOptConfig):
    ctx = training_context()
    strategy = RandOpt(cfg, 0)
    return ctx, strategy, strategy.initial_state(StrategyContext(0, ctx.layout, TINY))


def test_a_candidate_is_the_rounds_adapter_plus_sigma_times_its_members_noise():
    _, strategy, state = start(RandOptConfig(population=4, top_k=2, sigma=0.25))
    specs, payload = strategy.ask(state, 3)
    assert [s.member for s in specs] == [0, 1, 2, 3]
    candidate = strategy.materialise(payload, specs[2])
    for name, value in state.center.items():
        noise = member_noise(0, 3, 2, name, tuple(value.shape))
        assert torch.equal(candidate[name], value + 0.25 * noise)


def round_results(ctx, population: int, wrong_rows: set[int]) -> GenerationResults:
    """Four prompts; every candidate answers right (reward 1) except `wrong_rows`, which answer
    "0" (reward 0)."""
    prompts = (0, 1, 2, 3)
    texts = [[" 0" if row in wrong_rows else f" {ctx.train[p].answer}" for p in prompts] for row in range(population)]
    rewards = np.array([[0.0 if row in wrong_rows else 1.0] * 4 for row in range(population)])
    tokens = np.ones_like(rewards, dtype=np.int64)
    return GenerationResults(0, prompts, rewards, rewards > 0, tokens, None, rewards.mean(axis=1), texts=texts)


def test_a_round_distils_the_ensembles_answers_into_the_adapter():
    ctx, strategy, state = start(RandOptConfig(population=6, top_k=3, sft_epochs=1.0, sft_learning_rate=1e-2))
    task = build_task(task_config("addition", train_size=32, eval_size=8), seed=0)
    ctx = replace(ctx, answer=lambda completion, i: task.answer(completion, ctx.train[i]))
    specs, _ = strategy.ask(state, 0)
    told = strategy.tell(state, specs, round_results(ctx, 6, wrong_rows={0, 1, 2}))
    kept = told.state.ensemble
    assert [e["example"] for e in kept] == [0, 1, 2, 3] and all(e["correct"] == [True] * 3 for e in kept)
    again = RandOptState(**state_fields(told.state))  # plain data: a checkpoint between tell and refine keeps it
    refined = strategy.refine(again, 0, ctx)
    assert refined.stats["ensemble_accuracy"] == 1.0 and refined.stats["distil_examples"] == 4.0
    assert refined.stats["distil_steps"] == 1.0 and refined.spend.tokens_trained > 0
    moved = refined.state.center
    assert any(not torch.equal(moved[k], state.center[k]) for k in moved) and refined.state.ensemble == []
    assert [e["completion"] for e in refined.state.examples] == [f" {ctx.train[p].answer}" for p in range(4)]
    repeat = strategy.refine(RandOptState(**state_fields(told.state)), 0, ctx)
    assert all(torch.equal(repeat.state.center[k], moved[k]) for k in moved)  # seeded: the same round twice


def test_voting_needs_canonical_answers():
    ctx, strategy, state = start(RandOptConfig(population=4, top_k=2, targets="vote"))
    specs, _ = strategy.ask(state, 0)
    told = strategy.tell(state, specs, round_results(ctx, 4, wrong_rows=set()))
    with pytest.raises(ConfigError, match="strategy.targets=vote: the task gives no canonical answers"):
        strategy.refine(told.state, 0, ctx)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"top_k": 40}, "strategy.top_k=40: must be in 1..strategy.population (30)"),
        ({"targets": "best"}, "strategy.targets"),
        ({"distil_from": "base"}, "strategy.distil_from"),
        ({"sft_epochs": 0}, "strategy.sft_epochs=0: must be > 0"),
    ],
)
def test_bad_randopt_configs_fail_in_one_line(overrides, message):
    from evora.strategies.randopt.config import check_randopt

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_randopt(RandOptConfig(**overrides))
