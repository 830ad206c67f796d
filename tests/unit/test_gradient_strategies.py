"""Gradient strategies (sft, grpo's shared parts) and the memetic GA off the cluster, on the
tiny model and the CPU: budgets, exact continuation from a checkpointed state, the budget
ending a generation early, and the refined elite replacing the elite with its compute counted."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoTokenizer

from conftest import make_summary
from evora.errors import ConfigError
from evora.lora.layout import build_layout
from evora.lora.modules import adaptable_modules
from evora.models import locate_model
from evora.strategies.budget import Budget, budget_of, check_budget
from evora.strategies.ga import GAConfig, GeneticAlgorithm
from evora.strategies.ga.memetic import REFINED
from evora.strategies.protocol import StrategyContext, TrainingContext
from evora.strategies.sft import SFTConfig, SupervisedFineTuning
from evora.tasks import build_task, task_config
from evora.tasks.prompts import PromptRenderer
from evora.tracking.compute import ComputeLedger, Spend, usage_of_summary

TINY = locate_model("evora:tiny").path


def context(spent=lambda spend: False, train_size: int = 64) -> TrainingContext:
    task = build_task(task_config("addition", train_size=train_size, eval_size=8), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    renderer = PromptRenderer(tokenizer, "auto", task.plain_template)
    layout = build_layout(
        adaptable_modules(TINY), rank=1, alpha=1.0, target_modules=["down_proj"], layers=[1], base_model=TINY
    )
    train = task.splits().train
    return TrainingContext(
        seed=0,
        layout=layout,
        model_path=TINY,
        train=train,
        prompt_text=renderer.text,
        prompt_ids=renderer.ids,
        special_tokens=True,
        target_ids=renderer.target_ids,
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        rewards=lambda completions, indices: [
            float(c.strip() == train[i].answer) for c, i in zip(completions, indices)
        ],
        spent=spent,
        device="cpu",
        max_tokens=6,
        planned_steps=1000,
    )


def start(strategy, ctx):
    return strategy.initial_state(StrategyContext(0, ctx.layout, TINY))


# --- budgets ------------------------------------------------------------------------------


def test_one_budget_at_a_time_and_positive():
    with pytest.raises(ConfigError, match=r"strategy.match=\"runs/x\": one budget at a time; strategy.budget_flops"):
        check_budget(SFTConfig(budget_flops=1e9, match="runs/x"))
    with pytest.raises(ConfigError, match=r"strategy.budget_tokens=0: must be > 0"):
        check_budget(SFTConfig(budget_tokens=0))
    with pytest.raises(ConfigError, match=r"strategy.match_by=\"steps\": allowed: flops, tokens, seconds"):
        check_budget(SFTConfig(match_by="steps"))


def test_budget_from_a_key_or_from_the_matched_run():
    assert budget_of(SFTConfig()) is None
    assert budget_of(SFTConfig(budget_tokens=500)) == Budget("tokens", 500.0, "strategy.budget_tokens")
    summary = make_summary(0.1, 0.5, flops=3e9)
    usage = usage_of_summary(summary["compute"])
    assert usage["flops"] == 3e9 and usage["tokens"] == 150.0  # make_summary: 100 prompt + 50 generated
    budget = budget_of(SFTConfig(match="runs/es", match_by="tokens"), usage)
    assert budget == Budget("tokens", 150.0, "strategy.match=runs/es")
    assert not budget.spent({"tokens": 149.0}) and budget.spent({"tokens": 150.0})


def test_ledger_usage_counts_what_is_not_yet_booked():
    ledger = ComputeLedger(parameters=10)
    ledger.search.add(Spend(tokens_generated=5))
    ledger.add_seconds("search", 2.0)
    usage = ledger.search_usage(Spend(tokens_trained=1), seconds=0.5)
    assert usage == {"flops": 2 * 10 * 5 + 6 * 10 * 1, "tokens": 6.0, "seconds": 2.5}


# --- sft --------------------------------------------------------------------------------


def test_sft_continues_exactly_from_a_checkpointed_state():
    ctx, cfg = context(), SFTConfig(steps_per_generation=3, learning_rate=1e-2)
    straight = SupervisedFineTuning(cfg, run_seed=0)
    first = straight.improve(start(straight, ctx), 0, ctx)
    second = straight.improve(first.state, 1, ctx)
    resumed = SupervisedFineTuning(cfg, run_seed=0)  # a restarted driver: only the state survives
    again = resumed.improve(first.state, 1, ctx)
    assert again.state.step == second.state.step == 6
    for name, tensor in second.state.adapter.items():
        assert torch.equal(tensor, again.state.adapter[name]), name
    b = [k for k in first.state.adapter if "lora_B" in k]
    assert all(first.state.adapter[k].abs().sum() > 0 for k in b)  # B starts at 0 and moved
    assert first.spend.tokens_trained > 0 and first.stats["steps"] == 3.0


def test_sft_state_survives_a_checkpoint_round_trip(tmp_path):
    from evora.strategies.protocol import state_fields
    from evora.tracking import checkpoint

    ctx, cfg = context(), SFTConfig(steps_per_generation=2, learning_rate=1e-2)
    strategy = SupervisedFineTuning(cfg, run_seed=0)
    first = strategy.improve(start(strategy, ctx), 0, ctx)
    path = tmp_path / "latest.pt"
    checkpoint.atomic_save(checkpoint.run_state("sft", first.state, state_fields(first.state), {}), path)
    saved = checkpoint.load_run_state(path, "sft", type(first.state))  # weights_only: plain data only
    restored = type(first.state)(**saved["state"])
    expected = strategy.improve(first.state, 1, ctx)
    again = SupervisedFineTuning(cfg, run_seed=0).improve(restored, 1, ctx)
    assert all(torch.equal(expected.state.adapter[k], again.state.adapter[k]) for k in expected.state.adapter)


def test_the_budget_ends_a_generation_after_the_step_that_spends_it():
    calls = []

    def spent(spend):
        calls.append(spend.tokens_trained)
        return len(calls) >= 2

    ctx = context(spent)
    strategy = SupervisedFineTuning(SFTConfig(steps_per_generation=10), run_seed=0)
    told = strategy.improve(start(strategy, ctx), 0, ctx)
    assert told.stats["steps"] == 2.0 and told.state.step == 2
    assert calls[0] < calls[1] == told.spend.tokens_trained  # the spend so far, growing


# --- memetic GA ----------------------------------------------------------------------------


def test_the_refined_elite_replaces_the_elite_and_its_compute_is_counted():
    ctx = context()
    cfg = GAConfig(population=4, keep_top=1, parents=2, refine="sft", refine_every=2, refine_steps=4)
    ga = GeneticAlgorithm(dataclasses.replace(cfg, refine_learning_rate=1e-2), run_seed=0)
    state = start(ga, ctx)
    state = dataclasses.replace(state, pool=[state.pool[0], state.pool[0]], ids=["a", "b"], fitness=[0.5, 0.4])
    assert ga.refine(state, 0, ctx) is None  # after generation 1: not due (every 2)
    told = ga.refine(state, 1, ctx)
    assert told.state.ids == ["a+sft2", "b"] and told.state.fitness == [0.5, 0.4]
    assert not all(torch.equal(told.state.pool[0][k], state.pool[0][k]) for k in state.pool[0])
    assert all(torch.equal(told.state.pool[1][k], state.pool[1][k]) for k in state.pool[1])  # only the elite
    assert told.spend.tokens_trained > 0 and told.stats["refine_steps"] == 4.0
    (record,) = told.lineage
    assert record["op"] == REFINED and record["parents"] == ["a"] and record["id"] == "a+sft2"
    assert ga.center(told.state) is told.state.pool[0]  # the run's adapter is the refined elite


def test_memetic_ga_needs_tensor_encoding():
    from evora.strategies.ga.config import check_ga

    with pytest.raises(ConfigError, match=r"strategy.refine=\"sft\": a refined elite is a new adapter"):
        check_ga(GAConfig(refine="sft", encoding="seeds", crossover_rate=0.0))
