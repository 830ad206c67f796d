"""strategy=randopt off the cluster: the top K, the ensemble's majority vote and the completions a
round distils against hand-worked cases; candidates as the round's adapter plus sigma times the
member's seeded noise; and a round on the bundled tiny model and the CPU: `tell` keeps the
ensemble's completions, `refine` votes with the task's canonical answers and distils them with the
SFT baseline's trainer, seeded, its tokens counted as spend; perturbation=eggroll's candidates
as the adapter plus EGGROLL's sigma E in its last slots, which distillation leaves zero."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_ecology_sft import TINY, training_context

from evora.errors import ConfigError
from evora.lora.noise import gaussian, member_noise, noise_key
from evora.lora.peft_io import save_adapter
from evora.plan.compose import compose_run
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


def start(cfg: RandOptConfig, rank: int = 1):
    ctx = training_context()
    ctx = replace(ctx, layout=replace(ctx.layout, rank=rank, alpha=2.0 * rank))  # scale 2
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


EGGROLL = {"perturbation": "eggroll", "perturbation_rank": 2, "sigma": 0.25}


def lora_product(adapter, slot) -> torch.Tensor:
    return 2.0 * adapter[slot.b_key].double() @ adapter[slot.a_key].double()


def test_an_eggroll_candidate_adds_sigma_e_to_each_matrix_in_the_adapters_last_slots():
    """s B' A' = s B_c A_c + sigma B_m A_m / sqrt(r), B_m and A_m the member's seeded Gaussians;
    the round's adapter keeps those r slots zero."""
    ctx, strategy, state = start(RandOptConfig(population=4, top_k=2, **EGGROLL), rank=3)
    slot = ctx.layout.modules[0]
    assert state.modules == [slot.name] and state.lora_scale == 2.0
    center = {k: v.clone() for k, v in state.center.items()}
    center[slot.b_key][:, 0] = 0.5  # a distilled slot: the perturbation adds to it
    specs, payload = strategy.ask(replace(state, center=center), 3)
    for member in (1, 2):
        candidate = strategy.materialise(payload, specs[member])
        key = (0, "randopt-eggroll", 3, member, slot.name)
        b = gaussian(noise_key(*key, "B"), (slot.out_features, 2)).double()
        a = gaussian(noise_key(*key, "A"), (2, slot.in_features)).double()
        expected = lora_product(center, slot) + 0.25 * b @ a / math.sqrt(2)
        assert torch.allclose(lora_product(candidate, slot), expected, atol=1e-6)
        assert torch.equal(candidate[slot.a_key][:1], center[slot.a_key][:1])
    assert not state.center[slot.a_key][1:].any() and not state.center[slot.b_key][:, 1:].any()


def test_an_eggroll_round_distils_into_the_first_slots_and_keeps_the_last_zero():
    ctx, strategy, state = start(
        RandOptConfig(population=6, top_k=3, sft_epochs=1.0, sft_learning_rate=1e-2, **EGGROLL), rank=3
    )
    specs, _ = strategy.ask(state, 0)
    refined = strategy.refine(strategy.tell(state, specs, round_results(ctx, 6, wrong_rows={0})).state, 0, ctx)
    slot = ctx.layout.modules[0]
    moved = refined.state.center
    assert not torch.equal(moved[slot.b_key][:, :1], state.center[slot.b_key][:, :1])
    assert not moved[slot.a_key][1:].any() and not moved[slot.b_key][:, 1:].any()


def test_an_adapter_from_init_path_must_leave_the_perturbations_slots_zero(tmp_path):
    ctx, _, state = start(RandOptConfig(**EGGROLL), rank=3)  # its last two slots cleared
    adapter = {k: v.clone() for k, v in state.center.items()}
    save_adapter(tmp_path / "zero", adapter, ctx.layout)
    slot = ctx.layout.modules[0]
    adapter[slot.b_key][:, 2] = 1.0
    save_adapter(tmp_path / "used", adapter, ctx.layout)
    cfg = RandOptConfig(init="path", init_path=str(tmp_path / "zero"), **EGGROLL)
    assert (
        RandOpt(cfg, 0)
        .initial_state(StrategyContext(0, ctx.layout, TINY))
        .start[slot.b_key]
        .equal(state.center[slot.b_key])
    )
    cfg = replace(cfg, init_path=str(tmp_path / "used"))
    with pytest.raises(ConfigError, match="uses the last 2 rank slots, which strategy.perturbation=eggroll keeps"):
        RandOpt(cfg, 0).initial_state(StrategyContext(0, ctx.layout, TINY))


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
        ({"perturbation": "dense"}, 'strategy.perturbation="dense": allowed: lora, eggroll'),
        ({**EGGROLL, "perturbation_rank": 8}, "strategy.perturbation_rank=8: must be below lora.rank (8)"),
    ],
)
def test_bad_randopt_configs_fail_in_one_line(overrides, message):
    from evora.strategies.randopt.config import check_randopt

    run = compose_run(["strategy=randopt", "lora.rank=8"])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_randopt(RandOptConfig(**overrides), run)
