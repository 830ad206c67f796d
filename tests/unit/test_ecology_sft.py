"""strategy=ecology plasticity=sft off the cluster: the config's rules, which episodes `tell`
keeps for self-training (as plain data that survives a weights-only checkpoint), and
`refine` on the bundled tiny model and the CPU: the organelles with successes are trained
on their own completions by the SFT baseline's trainer, seeded, the others are left as
they were, and the tokens it trained are its spend."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from evora.distributed.evaluate import candidate_texts
from evora.distributed.worker import UnitResult
from evora.errors import ConfigError
from evora.lora.layout import build_layout
from evora.lora.modules import adaptable_modules
from evora.models import locate_model
from evora.plan.compose import compose_run
from evora.strategies.ecology import Ecology, EcologyConfig, EcologyState
from evora.strategies.ecology.strategy import PROBE, SERVE
from evora.strategies.protocol import GenerationResults, Spend, StrategyContext, TrainingContext, state_fields
from evora.tasks import build_task, task_config
from evora.tasks.prompts import PromptRenderer

TINY = locate_model("evora:tiny").path
SFT = EcologyConfig(organelles=3, plasticity="sft", sft_steps=2, sft_learning_rate=1e-2)


def training_context(calls: list | None = None) -> TrainingContext:
    task = build_task(task_config("addition", train_size=32, eval_size=8), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    renderer = PromptRenderer(tokenizer, "auto", task.plain_template)
    layout = build_layout(
        adaptable_modules(TINY), rank=1, alpha=1.0, target_modules=["down_proj"], layers=[1], base_model=TINY
    )

    def target_ids(example):
        if calls is not None:
            calls.append(example.reference)
        return renderer.target_ids(example)

    return TrainingContext(
        seed=0,
        layout=layout,
        model_path=TINY,
        train=task.splits().train,
        prompt_text=renderer.text,
        prompt_ids=renderer.ids,
        special_tokens=True,
        target_ids=target_ids,
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        rewards=lambda completions, indices: [0.0] * len(completions),
        spent=lambda spend: False,
        device="cpu",
        max_tokens=6,
        planned_steps=1000,
    )


def start(eco: Ecology, ctx: TrainingContext) -> EcologyState:
    families = tuple(e.family for e in ctx.train)
    return eco.initial_state(StrategyContext(0, ctx.layout, TINY, train_families=families, prompts_per_generation=8))


def results_with_texts(specs, ctx: TrainingContext, wrong: set[int]) -> GenerationResults:
    """Every served episode answered (reward 1), except the examples in `wrong` (reward 0)."""
    columns = sorted({p for s in specs for p in s.prompts})
    shape = (len(specs), len(columns))
    rewards, mask = np.full(shape, np.nan), np.zeros(shape, dtype=bool)
    texts = [[""] * len(columns) for _ in specs]
    for spec in specs:
        for p in spec.prompts:
            j = columns.index(p)
            mask[spec.index, j] = True
            rewards[spec.index, j] = 0.0 if p in wrong else 1.0
            texts[spec.index][j] = "nope" if p in wrong else f" {ctx.train[p].answer}"
    tokens = np.where(mask, 3, 0)
    fitness = np.nanmean(rewards, axis=1)
    return GenerationResults(0, tuple(columns), rewards, rewards > 0.5, tokens, None, fitness, mask, texts)


# --- the config ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("strategy.sft_steps=0", "strategy.sft_steps=0: must be an integer >= 1"),
        ("strategy.sft_learning_rate=0", "strategy.sft_learning_rate=0"),
        ("strategy.sft_min_reward=nan", "strategy.sft_min_reward=nan: must be a finite number"),
        ("strategy.plasticity=adam", 'strategy.plasticity="adam": allowed: es, sft, none'),
    ],
)
def test_bad_self_training_settings_are_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        compose_run(["+experiment=quickstart/ecology", "task=mix", "strategy.plasticity=sft", *override.split(" ")])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_only_plasticity_sft_keeps_texts_and_refines_and_it_asks_no_probes():
    compose_run(["+experiment=quickstart/ecology", "task=mix", "strategy.plasticity=sft"])  # valid as it is
    for cfg, expected in [
        (SFT, True),
        (EcologyConfig(), False),
        (EcologyConfig(plasticity="none"), False),
        (EcologyConfig(condition="frozen", plasticity="sft"), False),
    ]:
        eco = Ecology(cfg, run_seed=0)
        assert eco.keeps_texts is expected and eco.refines is expected
    eco = Ecology(SFT, run_seed=0)
    specs, _ = eco.ask(start(eco, training_context()), 0)
    assert specs and {s.op for s in specs} == {SERVE} and not any(s.op == PROBE for s in specs)


def test_candidate_texts_follow_the_population_order():
    def unit(indices, texts):
        empty = np.zeros((len(indices), 2))
        return UnitResult(indices, empty, empty > 0, empty.astype(int), 0, 0, {}, 0, 0.0, texts=texts)

    results = [unit([2, 0], [["c", ""], ["a", "b"]]), unit([1], [["", "d"]])]
    assert candidate_texts(results, 3) == [["a", "b"], ["", "d"], ["c", ""]]


# --- tell and refine ----------------------------------------------------------------------


def told_once(eco: Ecology, ctx: TrainingContext, wrong: set[int]):
    state = start(eco, ctx)
    specs, _ = eco.ask(state, 0)
    return state, specs, eco.tell(state, specs, results_with_texts(specs, ctx, wrong))


def test_tell_keeps_the_successful_episodes_completions_as_plain_data():
    ctx = training_context()
    eco = Ecology(SFT, run_seed=0)
    episodes = eco.episodes(start(eco, ctx), 0)
    wrong = set(episodes[:3])
    _, specs, told = told_once(eco, ctx, wrong)
    batch = told.state.sft_batch
    assert sorted(b["example"] for b in batch) == sorted(set(episodes) - wrong)
    ids = {s.index: o for s, o in zip(specs, [told.state.organelles[s.organelle]["id"] for s in specs])}
    for b in batch:
        assert b["completion"] == f" {ctx.train[b['example']].answer}"
        assert any(b["organelle"] == ids[s.index] and b["example"] in s.prompts for s in specs)
    buffer = io.BytesIO()
    torch.save(state_fields(told.state), buffer)
    buffer.seek(0)
    assert EcologyState(**torch.load(buffer, weights_only=True)).sft_batch == batch


def test_tell_needs_the_texts_under_plasticity_sft():
    ctx = training_context()
    eco = Ecology(SFT, run_seed=0)
    state = start(eco, ctx)
    specs, _ = eco.ask(state, 0)
    results = results_with_texts(specs, ctx, set())
    bare = GenerationResults(*[getattr(results, k) for k in ("generation", "prompt_indices", "rewards", "correct")],
                             results.tokens, None, results.fitness, results.evaluated)  # fmt: skip
    with pytest.raises(ValueError, match="plasticity=sft"):
        eco.tell(state, specs, bare)


def test_refine_trains_each_organelle_on_its_own_completions_seeded():
    calls: list[str] = []
    ctx = training_context(calls)
    eco = Ecology(SFT, run_seed=0)
    _, _, told = told_once(eco, ctx, set())
    state = told.state
    state.sft_batch = [b for b in state.sft_batch if b["organelle"] == "o0"]  # only o0 had successes
    before = {o["id"]: {k: v.clone() for k, v in o["adapter"].items()} for o in state.organelles}
    refined = eco.refine(state, 0, ctx)
    again = eco.refine(state, 0, ctx)
    assert refined is not None and again is not None
    assert set(calls) == {b["completion"] for b in state.sft_batch}  # the completions, not the references
    assert refined.state.sft_batch == [] and len(state.sft_batch) > 0  # the state it was given is untouched
    for o, o2 in zip(refined.state.organelles, again.state.organelles):
        assert all(torch.equal(v, o2["adapter"][k]) for k, v in o["adapter"].items())  # bit for bit, again
        changed = any(not torch.equal(v, before[o["id"]][k]) for k, v in o["adapter"].items())
        assert changed is (o["id"] == "o0"), o["id"]
    for o in state.organelles:  # the state it was given keeps its adapters
        assert all(torch.equal(v, before[o["id"]][k]) for k, v in o["adapter"].items())
    stats = refined.stats
    assert stats["sft_organelles"] == 1 and stats["sft_examples"] == len(state.sft_batch)
    assert stats["sft_loss"] > 0 and stats["sft_step_norm"] > 0
    assert refined.spend.tokens_trained > 0


def test_refine_without_successes_changes_nothing():
    ctx = training_context()
    eco = Ecology(SFT, run_seed=0)
    _, _, told = told_once(eco, ctx, set(range(len(ctx.train))))
    assert told.state.sft_batch == []
    refined = eco.refine(told.state, 0, ctx)
    assert refined is not None and refined.spend == Spend()
    assert refined.stats == {"sft_organelles": 0.0, "sft_examples": 0.0, "sft_loss": 0.0, "sft_step_norm": 0.0}
    for a, b in zip(refined.state.organelles, told.state.organelles):
        assert a["adapter"] is b["adapter"]
