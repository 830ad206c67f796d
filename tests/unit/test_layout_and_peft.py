"""Adapter layout from the model, PEFT-layout save/load, and restricted layers."""

import json

import pytest
import torch

from evora.errors import ConfigError
from evora.lora.init import adapter_from_path, random_adapter
from evora.lora.layout import build_layout
from evora.lora.peft_io import load_adapter_tensors, read_adapter_config, save_adapter


def test_layout_of_the_tiny_model(tiny_shapes, tiny_path):
    lay = build_layout(
        tiny_shapes, rank=8, alpha=16, target_modules=["q_proj", "down_proj"], layers=None, base_model=tiny_path
    )
    assert [s.name for s in lay.modules] == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.mlp.down_proj",
        "model.layers.1.self_attn.q_proj",
        "model.layers.1.mlp.down_proj",
    ]
    shapes = lay.shapes()
    assert shapes["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"] == (8, 384)
    assert shapes["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"] == (128, 8)
    assert lay.scale == 2.0
    assert lay.num_parameters() == 2 * (8 * (128 + 128) + 8 * (384 + 128))


def test_layers_restrict_the_modules(tiny_shapes):
    lay = build_layout(tiny_shapes, rank=1, alpha=1, target_modules=["down_proj"], layers=[1], base_model="m")
    assert [s.layer for s in lay.modules] == [1]


def test_unknown_module_names_the_key_and_the_model_modules(tiny_shapes):
    with pytest.raises(ConfigError, match=r"lora.target_modules=\['c_attn'\].*down_proj"):
        build_layout(tiny_shapes, rank=1, alpha=1, target_modules=["c_attn"], layers=None, base_model="m")


def test_saved_adapter_is_peft_layout_with_only_the_chosen_layers(tmp_path, tiny_shapes, tiny_path):
    lay = build_layout(tiny_shapes, rank=8, alpha=8, target_modules=["v_proj"], layers=[1], base_model=tiny_path)
    tensors = random_adapter(lay, seed=0, a_std=None, b_std=0.1)
    save_adapter(tmp_path, tensors, lay, torch.bfloat16)
    config = read_adapter_config(tmp_path)
    assert config["r"] == 8 and config["lora_alpha"] == 8 and config["layers_to_transform"] == [1]
    loaded = load_adapter_tensors(tmp_path)
    # vLLM ignores layers_to_transform, so layer 0 must have no tensors at all.
    assert sorted(loaded) == [
        "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight",
        "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight",
    ]
    for name, value in loaded.items():
        assert value.dtype == torch.float32
        assert torch.allclose(value, tensors[name].to(torch.bfloat16).float())


def test_peft_loads_the_adapter_and_applies_exactly_its_delta(tmp_path, tiny_shapes, tiny_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lay = build_layout(tiny_shapes, rank=8, alpha=4, target_modules=["down_proj"], layers=[1], base_model=tiny_path)
    tensors = random_adapter(lay, seed=1, a_std=None, b_std=0.2)
    save_adapter(tmp_path, tensors, lay)
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    merged = PeftModel.from_pretrained(base, str(tmp_path)).merge_and_unload()
    slot = lay.modules[0]
    delta = merged.get_parameter(f"{slot.name}.weight") - before[f"{slot.name}.weight"]
    expected = lay.scale * tensors[slot.b_key] @ tensors[slot.a_key]
    assert torch.allclose(delta, expected, atol=1e-5)
    untouched = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(merged.get_parameter(untouched), before[untouched])


def test_init_from_path_checks_the_layout(tmp_path, tiny_shapes):
    lay = build_layout(tiny_shapes, rank=8, alpha=8, target_modules=["v_proj"], layers=None, base_model="m")
    tensors = random_adapter(lay, seed=0, a_std=0.5, b_std=0.5)
    save_adapter(tmp_path, tensors, lay)
    again = adapter_from_path(lay, str(tmp_path))
    assert all(torch.equal(again[k], tensors[k]) for k in tensors)
    other = build_layout(tiny_shapes, rank=8, alpha=8, target_modules=["q_proj"], layers=None, base_model="m")
    with pytest.raises(ConfigError, match="strategy.init_path"):
        adapter_from_path(other, str(tmp_path))


def test_random_init_scales(tiny_shapes):
    lay = build_layout(tiny_shapes, rank=8, alpha=8, target_modules=["down_proj"], layers=None, base_model="m")
    t = random_adapter(lay, seed=0, a_std=None, b_std=0.0)
    slot = lay.modules[0]
    assert torch.all(t[slot.b_key] == 0)
    assert abs(float(t[slot.a_key].std()) - 384**-0.5) < 0.01
    assert json.dumps(sorted(t)) == json.dumps(sorted(lay.shapes()))


def test_per_layer_noise_scales_are_mean_abs_base_weight_per_layer(tiny_shapes, tiny_path):
    from safetensors.torch import load_file

    from evora.lora.base_weights import per_layer_scales

    lay = build_layout(
        tiny_shapes, rank=1, alpha=1, target_modules=["q_proj", "down_proj"], layers=None, base_model=tiny_path
    )
    scales = per_layer_scales(lay, tiny_path)
    weights = load_file(f"{tiny_path}/model.safetensors")
    for layer in (0, 1):
        w = [
            weights[f"model.layers.{layer}.self_attn.q_proj.weight"],
            weights[f"model.layers.{layer}.mlp.down_proj.weight"],
        ]
        expected = float(sum(x.abs().sum() for x in w) / sum(x.numel() for x in w))
        for slot in lay.modules:
            if slot.layer == layer:
                assert abs(scales[slot.a_key] - expected) < 1e-6 and scales[slot.b_key] == scales[slot.a_key]
    assert scales[lay.modules[0].a_key] != scales[lay.modules[-1].a_key]
