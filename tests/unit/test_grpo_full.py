"""Full-weight GRPO (strategy=grpo_full) on the bundled tiny model, on the CPU: TRL trains the
named matrices and nothing else, a rebuild continues a run exactly, each rollout request carries
the weights as they are before its step (and TRL's loss on those rollouts is its own), and a
worker's master copies become exactly the trainer's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_grpo_trainer import PROMPTS, SETTINGS, Replay, Reward, prompt_ids, recording, same
from transformers import AutoModelForCausalLM

from evora.strategies.grpo_full import FullWeightGRPO, GRPOFullConfig, TrainedWeightsState
from evora.strategies.master_weights import MasterWeights
from evora.training.grpo import FullSpec, GRPOTraining

DOWN = "model.layers.1.mlp.down_proj.weight"
FULL = FullSpec((DOWN,))
STEP = {"learning_rate": 1e-3}


def make(tiny_path: str, **kwargs) -> GRPOTraining:
    settings = replace(SETTINGS, **{**STEP, **kwargs.pop("settings", {})})
    return GRPOTraining(tiny_path, FULL, settings, PROMPTS, Reward(), **kwargs)


def base_weights(tiny_path: str) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_only_the_named_matrices_move_and_a_rebuild_continues_exactly(tiny_path):
    base = base_weights(tiny_path)
    straight = make(tiny_path)
    straight.train(2)
    moved = {name: p for name, p in straight.model.named_parameters() if not torch.equal(p.detach(), base[name])}
    assert set(moved) == {DOWN}
    assert set(straight.trained()) == {DOWN} and straight.trained()[DOWN].dtype == torch.float32
    first = make(tiny_path)
    first.train(1)
    state = first.state()
    rebuilt = make(tiny_path, trained=first.trained(), optimizer_state=state["optimizer"], step=state["step"])
    rebuilt.train(1)
    assert same(rebuilt.trained(), straight.trained())


def test_each_request_carries_the_weights_before_its_step_and_trls_loss_is_its_own(tiny_path):
    own = make(tiny_path)
    seen = recording(own)
    own_stats = own.train(2)
    replay = Replay(seen)
    sampled = make(tiny_path, sample=replay, prompt_ids=prompt_ids(tiny_path))
    sampled_stats = sampled.train(2)
    for key in ("reward", "loss", "grad_norm"):
        assert sampled_stats[key] == pytest.approx(own_stats[key], rel=1e-6, abs=1e-9), key
    one = make(tiny_path, sample=Replay(seen), prompt_ids=prompt_ids(tiny_path))
    one.train(1)
    first, second = (request.policy for request in replay.requests)
    assert first.adapter is None and second.adapter is None
    assert torch.equal(first.weights[DOWN], base_weights(tiny_path)[DOWN])
    assert same(second.weights, one.trained())  # after step 1, as the trainer held them


def test_a_workers_master_copies_become_the_trainers_and_an_older_update_is_refused(tiny_path):
    strategy = FullWeightGRPO(GRPOFullConfig(), 0)
    original = {DOWN: base_weights(tiny_path)[DOWN]}
    master: MasterWeights = strategy.start_master(original)
    trained = {DOWN: original[DOWN] + 0.5}
    state = TrainedWeightsState(trained, None, step=5, generation=1)
    norm = strategy.apply(master, strategy.update_of(state, 0))
    assert torch.equal(master.tensors[DOWN], trained[DOWN]) and master.generation == 1
    assert norm == pytest.approx(0.5 * original[DOWN].numel() ** 0.5, rel=1e-6)
    with pytest.raises(ValueError, match="not after 2"):
        strategy.update_of(state, 1)
    with pytest.raises(ValueError, match="generation 0 on weights of generation 1"):
        strategy.apply(master, strategy.update_of(state, 0))
