"""Layouts read from the model (docs/architecture.md, "Layouts"): every family of the
architecture matrix, built tiny from transformers' own config classes, gives its adaptable
modules with their kinds; `auto` takes its layers' projections; EGGROLL's update respects
Conv1D's [in, out] storage."""

from __future__ import annotations

import pytest
import torch

from conftest import family_path
from evora.errors import ConfigError
from evora.lora.layout import CONV1D, EXPERT, LINEAR, build_layout
from evora.lora.modules import model_modules, modules_of_config
from evora.models.build_family import FAMILIES

EXPECTED_AUTO = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "qwen2": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "qwen3": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "mistral": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "gemma2": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "phi3": ("o_proj", "qkv_proj", "gate_up_proj", "down_proj"),  # in model order
    "gpt2": ("c_attn", "c_proj", "c_fc"),
    "qwen3_moe": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_auto_targets_are_the_projections_of_every_layer(family):
    modules = model_modules(family_path(family))
    layout = build_layout(modules.adaptable, rank=1, alpha=1, target_modules="auto", layers=None, base_model="m")
    assert layout.target_modules == EXPECTED_AUTO[family]
    assert {s.layer for s in layout.modules} == {0, 1}
    assert not any("lm_head" in s.name or "embed" in s.name or "wte" in s.name for s in layout.modules)


def test_gpt2_conv1d_layers_are_adaptable_as_stored():
    modules = model_modules(family_path("gpt2"))
    c_fc = modules.adaptable["transformer.h.0.mlp.c_fc"]
    assert (c_fc.out_features, c_fc.in_features, c_fc.kind) == (256, 64, CONV1D)  # Conv1D weight is [64, 256]
    layout = build_layout(modules.adaptable, rank=1, alpha=1, target_modules=["c_fc"], layers=None, base_model="m")
    assert layout.fan_in_fan_out and all(s.stored_transposed for s in layout.modules)


def test_moe_experts_are_named_as_their_checkpoint_stores_them():
    from safetensors import safe_open

    path = family_path("qwen3_moe")
    modules = model_modules(path)
    experts = {n: a for n, a in modules.adaptable.items() if a.kind == EXPERT}
    assert modules.experts == 4 and len(experts) == 2 * 4 * 3  # layers x experts x (gate, up, down)
    with safe_open(f"{path}/model.safetensors", framework="pt") as handle:
        stored = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
    for name, shape in experts.items():  # [out, in] of every expert module is its checkpoint weight's
        assert stored[f"{name}.weight"] == (shape.out_features, shape.in_features)
    assert "model.layers.0.mlp.gate" not in modules.adaptable  # the router is not a projection


def test_renamed_mixture_modules_keep_their_checkpoint_names():
    from transformers import MixtralConfig

    config = MixtralConfig(
        hidden_size=64, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        num_local_experts=3, vocab_size=100,
    )  # fmt: skip
    adaptable = modules_of_config(config).adaptable
    assert adaptable["model.layers.0.block_sparse_moe.experts.2.w2"].kind == EXPERT
    assert adaptable["model.layers.0.self_attn.q_proj"].kind == LINEAR


def test_a_name_that_matches_nothing_lists_the_real_modules_and_auto():
    adaptable = model_modules(family_path("gpt2")).adaptable
    with pytest.raises(ConfigError) as error:
        build_layout(adaptable, rank=1, alpha=1, target_modules=["down_proj"], layers=None, base_model="m")
    assert "c_attn, c_proj, c_fc" in str(error.value) and "lora.target_modules=auto" in str(error.value)


def test_eggroll_updates_a_conv1d_master_as_the_transpose_of_the_linear_one():
    from evora.strategies.eggroll import EggrollConfig, EggrollStrategy
    from evora.strategies.eggroll.strategy import EggrollState

    strategy = EggrollStrategy(EggrollConfig(population=4, rank=1, sigma=0.1, lr=0.5), run_seed=3)
    state = EggrollState(["m"], [[6, 5]], 1.0, fitness=[[1.0, 0.0, 0.5, 2.0]])
    update = strategy.update_of(state, 0)
    weight = torch.randn(6, 5)
    linear = strategy.start_master({"m.weight": weight})
    conv1d = strategy.start_master({"m.weight": weight.T.contiguous()}, frozenset({"m.weight"}))
    strategy.apply(linear, update)
    strategy.apply(conv1d, update)
    assert not torch.equal(linear.tensors["m.weight"], weight)
    torch.testing.assert_close(conv1d.tensors["m.weight"], linear.tensors["m.weight"].T, rtol=0, atol=0)
