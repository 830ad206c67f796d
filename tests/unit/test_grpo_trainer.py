"""GRPO through TRL on the bundled tiny model, on the CPU: chunks continue one run, a rebuild
from trained() + state() continues it exactly, the reward sees the right prompts, and the
token counters add up."""

from __future__ import annotations

import zlib
from dataclasses import replace

import pytest
import torch

from evora.training.grpo import GRPOSettings, GRPOTraining, LoraSpec, prompt_order
from evora.training.grpo_trl import rollout_seed
from evora.training.rollouts import Rollout, RolloutRequest

PROMPTS = ["12+34=", "5+7=", "40+2=", "9+9=", "33+21="]
LORA = LoraSpec(rank=2, alpha=4, target_modules=("q_proj", "v_proj"))
SETTINGS = GRPOSettings(
    learning_rate=1e-2,
    num_generations=4,
    prompts_per_step=2,
    beta=0.0,
    max_completion_length=8,
    temperature=1.0,
    epsilon=0.2,
    max_grad_norm=1.0,
    weight_decay=0.0,
    seed=0,
)


class Reward:
    """A reward that differs between completions (so groups have advantages), recording its calls."""

    def __init__(self, constant: float | None = None):
        self.constant, self.calls = constant, []

    def __call__(self, completions: list[str], index: list[int]) -> list[float]:
        self.calls.append(list(index))
        if self.constant is not None:
            return [self.constant] * len(completions)
        return [(zlib.crc32(c.encode()) % 5) / 4 for c in completions]


def make(tiny_path: str, reward: Reward | None = None, **kwargs) -> GRPOTraining:
    settings = replace(SETTINGS, **kwargs.pop("settings", {}))
    return GRPOTraining(tiny_path, LORA, settings, PROMPTS, reward or Reward(), **kwargs)


def b_tensors(adapter: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [v for k, v in adapter.items() if "lora_B" in k]


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=atol) for k in a)


@pytest.fixture(scope="module")
def four_steps(tiny_path):
    """One uninterrupted 4-step run: the reference that chunked and rebuilt runs must match."""
    reward = Reward()
    trainer = make(tiny_path, reward)
    stats = trainer.train(4)
    return trainer, stats, reward


def test_one_chunk_trains_the_adapter_and_counts_tokens(four_steps):
    trainer, stats, reward = four_steps
    assert stats["steps"] == 4 and trainer.step == 4
    assert {"loss", "reward", "entropy", "grad_norm"} <= stats.keys()
    assert all(b.abs().sum() > 0 for b in b_tensors(trainer.trained()))  # PEFT starts B at 0
    s = SETTINGS
    assert 0 < trainer.tokens_generated <= 4 * s.prompts_per_step * s.num_generations * s.max_completion_length
    assert trainer.tokens_prompt > 0
    # each completion row is trained once, with its prompt; no forward-only pass without beta
    assert trainer.tokens_trained == trainer.tokens_prompt + trainer.tokens_generated
    assert trainer.tokens_scored == 0


def test_the_reward_sees_each_steps_prompts_once_per_completion(four_steps):
    _, _, reward = four_steps
    assert len(reward.calls) == 4  # one generation per optimizer step
    expected = prompt_order(len(PROMPTS), SETTINGS.prompts_per_step, SETTINGS.seed, 0, 4)
    g = SETTINGS.num_generations
    for step, call in enumerate(reward.calls):
        prompts = expected[step * 2 : step * 2 + 2]
        assert call == [i for i in prompts for _ in range(g)]
        assert all(0 <= i < len(PROMPTS) for i in call)
    # a pass over the prompts before any repeats, across chunk boundaries
    assert sorted(expected[:5]) == list(range(5))


def test_chunks_and_a_rebuild_continue_the_same_run(tiny_path, four_steps):
    reference = four_steps[0].trained()
    reward = Reward()
    chunked = make(tiny_path, reward)
    assert chunked.train(2)["steps"] == 2
    assert chunked.train(2)["steps"] == 2 and chunked.step == 4
    assert same(chunked.trained(), reference)  # the prompt order and optimizer carried over
    assert reward.calls == four_steps[2].calls

    first = make(tiny_path)
    first.train(2)
    state = first.state()
    rebuilt = make(tiny_path, trained=first.trained(), optimizer_state=state["optimizer"], step=state["step"])
    assert rebuilt.train(2)["steps"] == 2 and rebuilt.step == 4
    assert same(rebuilt.trained(), reference)


def test_a_constant_reward_gives_no_advantage_and_no_update(tiny_path):
    trainer = make(tiny_path, Reward(constant=1.0))
    start = trainer.trained()
    stats = trainer.train(2)
    assert stats["steps"] == 2 and stats["reward"] == 1.0
    after = trainer.trained()
    assert all(torch.count_nonzero(b) == 0 for b in b_tensors(after))
    assert same(after, start)  # zero gradients: AdamW moves nothing (no weight decay here)


def test_stop_ends_a_chunk_and_the_callers_rng_is_left_alone(tiny_path):
    trainer = make(tiny_path)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    stats = trainer.train(3, stop=lambda: True)
    assert torch.equal(torch.rand(3), expected)
    assert stats["steps"] == 1 and trainer.step == 1
    assert trainer.train(2, stop=lambda: False)["steps"] == 2 and trainer.step == 3


def test_beta_adds_a_reference_pass_and_logs_kl(tiny_path):
    trainer = make(tiny_path, settings={"beta": 0.1})
    stats = trainer.train(1)
    assert "kl" in stats and stats["kl"] >= 0
    assert trainer.tokens_scored == trainer.tokens_trained > 0  # the base model scores what the policy trains on


def test_micro_batches_split_one_generation(tiny_path):
    reward = Reward()
    trainer = make(tiny_path, reward, settings={"micro_batches": 2})
    assert trainer.train(1)["steps"] == 1
    assert [len(c) for c in reward.calls] == [SETTINGS.prompts_per_step * SETTINGS.num_generations]
    assert trainer.tokens_trained == trainer.tokens_prompt + trainer.tokens_generated
    with pytest.raises(ValueError, match="micro_batches"):
        make(tiny_path, settings={"micro_batches": 3})


def test_a_fresh_adapter_is_seeded(tiny_path):
    a, b = make(tiny_path).trained(), make(tiny_path).trained()
    c = make(tiny_path, settings={"seed": 1}).trained()
    assert same(a, b) and not same(a, c)


def test_chat_templated_prompts_get_no_second_bos(tiny_path):
    with_bos, without = make(tiny_path), make(tiny_path, special_tokens=False)
    with_bos.train(1)
    without.train(1)
    rows = SETTINGS.prompts_per_step * SETTINGS.num_generations
    assert with_bos.tokens_prompt - without.tokens_prompt == rows  # one BOS per generated row


class Replay:
    """A sampler (training.rollouts.RolloutSampler) that gives back completions recorded before,
    step by step, and keeps the requests it was sent."""

    def __init__(self, completions: list[list[list[int]]], logprobs: list[list[list[float]]] | None = None):
        self.completions, self.logprobs, self.requests = completions, logprobs, []

    def __call__(self, request: RolloutRequest) -> list[Rollout]:
        self.requests.append(request)
        step = len(self.requests) - 1
        logprobs = self.logprobs[step] if self.logprobs is not None else [None] * len(self.completions[step])
        return [Rollout(tuple(c), None if lp is None else tuple(lp)) for c, lp in zip(self.completions[step], logprobs)]


def recording(trainer: GRPOTraining) -> list[list[list[int]]]:
    """The completions TRL samples itself, step by step (its `_generate`, observed)."""
    seen: list[list[list[int]]] = []
    generate = trainer._trainer._generate

    def observed(prompts):
        out = generate(prompts)
        seen.append([list(ids) for ids in out[1]])
        return out

    trainer._trainer._generate = observed
    return seen


def prompt_ids(tiny_path: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)(PROMPTS)["input_ids"]


@pytest.mark.parametrize("loss_type", ["dapo", "dr_grpo"])
def test_trls_loss_on_sampled_rollouts_equals_its_own(tiny_path, loss_type):
    """The same completions through `rollout_func` (a sampler) and through TRL's own generate:
    the same rewards, advantages, loss and gradient norm, and the same steps to float rounding
    (AdamW's first steps are near sign(gradient): rounding in a near-zero gradient moves its
    element by a part of a step that depends on the CPU: 1.3e-5 (dapo) and 1.7e-4 (dr_grpo) of a
    2e-2 step on one Xeon, under 1e-4 on another; a wrong rollout moves elements by up to 4e-2)."""
    own = make(tiny_path, settings={"loss_type": loss_type})
    seen = recording(own)
    own_stats = own.train(2)
    replay = Replay(seen)
    sampled = make(tiny_path, settings={"loss_type": loss_type}, sample=replay, prompt_ids=prompt_ids(tiny_path))
    sampled_stats = sampled.train(2)
    assert sampled_stats["reward"] == own_stats["reward"] and sampled_stats["reward_std"] == own_stats["reward_std"]
    for key in ("loss", "grad_norm"):
        assert sampled_stats[key] == pytest.approx(own_stats[key], rel=1e-6, abs=1e-9), key
    after, before = sampled.trained(), make(tiny_path).trained()
    assert close(after, own.trained(), atol=5e-4) and not close(after, before, atol=1e-3)
    assert (sampled.tokens_prompt, sampled.tokens_generated) == (own.tokens_prompt, own.tokens_generated)
    # each request: the step's rows (each prompt G times), their own seeds, the policy's adapter as it is then
    order = prompt_order(len(PROMPTS), SETTINGS.prompts_per_step, SETTINGS.seed, 0, 2)
    ids, g = prompt_ids(tiny_path), SETTINGS.num_generations
    for step, request in enumerate(replay.requests):
        assert request.step == step and not request.logprobs
        assert request.prompts == tuple(tuple(ids[i]) for i in order[2 * step : 2 * step + 2] for _ in range(g))
        assert request.seeds == tuple(rollout_seed(SETTINGS.seed, step, row) for row in range(2 * g))
    first = replay.requests[0].policy.adapter
    assert same(first, make(tiny_path).trained())  # sampled from the adapter before the step
    assert not same(replay.requests[1].policy.adapter, replay.requests[0].policy.adapter)


def test_importance_sampling_weighs_the_loss_by_the_samplers_logprobs(tiny_path):
    """With the correction on, the sampler's log-probabilities enter TRL's loss through its
    importance-sampling ratio: the same completions with log-probabilities 1 lower give another step."""
    own = make(tiny_path)
    seen = recording(own)
    own.train(1)
    settings = {"importance_sampling": "token_truncate", "importance_sampling_cap": 2.0}
    ids = prompt_ids(tiny_path)
    policy = scored_logprobs(make(tiny_path), ids, seen[0])
    steps = {}
    for shift in (0.0, 1.0):
        replay = Replay(seen, [[[v - shift for v in row] for row in policy]])
        trainer = make(tiny_path, settings=settings, sample=replay, prompt_ids=ids)
        stats = trainer.train(1)
        assert replay.requests[0].logprobs and "sampling/importance_sampling_ratio/mean" in stats
        steps[shift] = (trainer.trained(), stats)
    # the policy's own log-probabilities: ratios of 1 (to rounding), the uncorrected step
    assert steps[0.0][1]["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
    assert steps[1.0][1]["sampling/importance_sampling_ratio/max"] == pytest.approx(2.0)  # e^1 capped at C_max
    assert not same(steps[0.0][0], steps[1.0][0])


def scored_logprobs(trainer: GRPOTraining, ids: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
    """Each completion's token log-probabilities under the trainer's (untrained) policy: the step's
    prompts are those of step 0's order, G rows each."""
    order = prompt_order(len(PROMPTS), SETTINGS.prompts_per_step, SETTINGS.seed, 0, 1)
    rows = [ids[i] for i in order for _ in range(SETTINGS.num_generations)]
    out = []
    with torch.no_grad():
        for prompt, completion in zip(rows, completions):
            logits = trainer.model(torch.tensor([prompt + completion])).logits[0].float()
            logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
            out.append(logprobs[torch.arange(len(completion)), torch.tensor(completion)].tolist())
    return out


@pytest.mark.parametrize("loss_type", ["cispo", "sapo"])
def test_trls_other_losses_take_a_step(tiny_path, loss_type):
    trainer = make(tiny_path, settings={"loss_type": loss_type, "epsilon_high": 0.28})
    stats = trainer.train(1)
    assert stats["steps"] == 1 and torch.isfinite(torch.tensor(stats["loss"]))
    assert not same(trainer.trained(), make(tiny_path).trained())
