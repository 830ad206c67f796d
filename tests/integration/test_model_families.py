"""Families beyond Llama through the real CLI (issue: every model family users bring): GPT-2's
Conv1D (every strategy) and a Qwen3-MoE mixture on the transformers engine, refused before
Ray on vLLM, their exported adapters reloaded in PEFT against an independent reference (the
LoRA product merged into the weights by hand); EGGROLL on GPT-2; `evora doctor`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from conftest import cli_run, family_path, run_evora

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("families")]
SHORT = ["engine=hf", "generations=2", "hardware.num_workers=1", "task.eval_size=16", "eval_every=0"]
SHORT += ["task.prompts_per_generation=8"]
# A random model earns no reward, so ES's mean stays where it starts: start it away from B = 0.
ES_START = [*SHORT, "strategy.init_b_std=0.05"]
PROMPT = torch.tensor([[1, 40, 41, 42, 43, 44, 45]])


def merged_reference(model_path: str, adapter: Path):
    """The base model with scale * B @ A added to each adapted weight by hand (Conv1D: transposed;
    a fused expert tensor: its expert's rows)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    config = json.loads((adapter / "adapter_config.json").read_text())
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    scale = config["lora_alpha"] / config["r"]
    with torch.no_grad():
        for key in [k for k in tensors if k.endswith("lora_A.weight")]:
            module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            delta = scale * tensors[key.replace("lora_A", "lora_B")] @ tensors[key]
            target(model, module).add_(delta.T if config["fan_in_fan_out"] else delta)
    return model


def target(model, module: str) -> torch.Tensor:
    if ".experts." not in module:
        return model.get_submodule(module).weight
    parent, expert, projection = module.rsplit(".", 2)
    experts = model.get_submodule(parent)
    rows = experts.down_proj.shape[2]  # the intermediate size: gate rows, then up rows
    if projection == "down_proj":
        return experts.down_proj[int(expert)]
    return experts.gate_up_proj[int(expert), (0 if projection == "gate_proj" else rows) :][:rows]


def peft_logits(model_path: str, adapter: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    base = model(PROMPT).logits
    return base, PeftModel.from_pretrained(model, str(adapter))(PROMPT).logits


def assert_reloads_like_reference(model_path: str, adapter: Path, moves: bool = True) -> None:
    base, adapted = peft_logits(model_path, adapter)
    reference = merged_reference(model_path, adapter)(PROMPT).logits
    if moves:
        assert (adapted - base).abs().max() > 1e-4  # the adapter moves the model
    torch.testing.assert_close(adapted, reference, rtol=1e-4, atol=1e-4)


def test_gpt2_ga_runs_on_the_transformers_engine_and_its_adapter_loads_in_peft():
    path = family_path("gpt2")
    run_dir, _ = cli_run(
        f"model.path={path}",
        "+experiment=quickstart/ga",
        "lora.target_modules=auto",
        "strategy.init_b_std=0.05",
        *SHORT,
    )
    config = json.loads((run_dir / "adapters/best/adapter_config.json").read_text())
    assert config["fan_in_fan_out"] is True and set(config["target_modules"]) == {"c_attn", "c_proj", "c_fc"}
    # A random model earns no reward: the best member may be the unmutated start (B = 0).
    assert_reloads_like_reference(path, run_dir / "adapters/best", moves=False)


def test_gpt2_es_mean_adapter_reloads_in_peft_like_the_merged_reference():
    path = family_path("gpt2")
    run_dir, _ = cli_run(f"model.path={path}", "+experiment=quickstart/es", "lora.target_modules=auto", *ES_START)
    assert_reloads_like_reference(path, run_dir / "adapters/mean")


GRADIENT_RUNS = {
    "sft": [],
    "grpo": ["strategy.num_generations=2", "strategy.prompts_per_step=2", "strategy.steps_per_generation=2"],
    "ecology": [],
    "pbt": ["strategy.target_modules=[[auto]]", "strategy.steps_per_generation=4", "strategy.population=2"],
}


@pytest.mark.parametrize("strategy", sorted(GRADIENT_RUNS))
def test_gpt2_runs_every_other_strategy_and_its_adapter_loads_in_peft(strategy):
    path = family_path("gpt2")
    args = [
        f"model.path={path}",
        f"+experiment=quickstart/{strategy}",
        "lora.target_modules=auto",
        *SHORT,
        *GRADIENT_RUNS[strategy],
    ]
    run_dir, _ = cli_run(*args)
    # SFT's cross-entropy moves its trained adapter's B from zero; a random model's rewards (all
    # zero) move nothing, and with no evaluation between generations "best" is the start.
    adapter = run_dir / ("adapters/trained" if strategy == "sft" else "adapters/best")
    assert json.loads((adapter / "adapter_config.json").read_text())["fan_in_fan_out"] is True
    assert_reloads_like_reference(path, adapter, moves=strategy == "sft")


def test_gpt2_eggroll_exports_a_model_transformers_loads():
    from transformers import AutoModelForCausalLM

    path = family_path("gpt2")
    run_dir, _ = cli_run(f"model.path={path}", "+experiment=quickstart/eggroll", "lora.target_modules=auto", *SHORT)
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model", dtype=torch.float32)
    assert model.transformer.h[0].attn.c_attn.weight.shape == (64, 192)  # still [in, out]


def test_moe_es_with_expert_targets_runs_and_its_adapter_loads_in_peft():
    path = family_path("qwen3_moe")
    targets = "lora.target_modules=[gate_proj,up_proj,down_proj]"
    run_dir, _ = cli_run(f"model.path={path}", "+experiment=quickstart/es", targets, "lora.layers=null", *ES_START)
    tensors = (run_dir / "adapters/mean/adapter_model.safetensors").read_bytes()
    assert b"mlp.experts.3.down_proj.lora_A.weight" in tensors
    assert_reloads_like_reference(path, run_dir / "adapters/mean")


def test_moe_eggroll_on_attention_runs():
    path = family_path("qwen3_moe")
    run_dir, _ = cli_run(
        f"model.path={path}", "+experiment=quickstart/eggroll", "lora.target_modules=[q_proj,o_proj]", *SHORT
    )
    assert (run_dir / "model" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("name", "extra", "message"),
    [
        ("gpt2", [], "engine=vllm: vLLM's GPT2LMHeadModel has no LoRA support"),
        ("qwen3_moe", [], "fused-MoE kernels, which vLLM's CPU build lacks"),
        ("qwen3_moe", ["+experiment=quickstart/eggroll", "engine=hf"], "expert weights are not among those it moves"),
    ],
)
def test_what_cannot_run_ends_before_ray_in_one_line(name, extra, message, tmp_path):
    result = run_evora([f"model.path={family_path(name)}", "engine=vllm", "lora.target_modules=auto", *extra], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert ("engine=hf" if "engine=hf" not in extra else "[q_proj, k_proj, v_proj, o_proj]") in lines[0]
    assert not list(tmp_path.rglob("cli.log"))  # no run folder: nothing started


def doctor(args: list[str], tmp_path: Path):
    return run_evora(["doctor", *args], tmp_path, env={"HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize("model", ["", "gpt2", "qwen3_moe"])
def test_doctor_says_what_will_run_and_that_it_fits(model, tmp_path):
    args = [f"model.path={family_path(model)}", "engine=hf", "lora.target_modules=auto"] if model else []
    result = doctor(args, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "runs LoRA" in out and "-> fits" in out and "verdict      the run can start" in out
    if model == "gpt2":
        assert "vllm: no (vLLM's GPT2LMHeadModel has no LoRA support" in out and "(conv1d)" in out
    if model == "qwen3_moe":
        assert "mixture of 4 experts" in out and "expert, linear" in out


# Published sizes: Qwen2.5-7B 7.62B parameters, Qwen3-30B-A3B 30.5B (128 experts); bfloat16 weights.
@pytest.mark.parametrize(("model", "millions"), [("qwen2_5_7b", 7_615.6), ("qwen3_30b_a3b", 30_532.1)])
def test_doctor_estimates_a_hub_model_from_its_config_alone(model, millions, tmp_path):
    result = doctor([f"model={model}", "hardware=gpu", "hardware.gpu_memory_gib=80"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert f"{millions:,.1f}M parameters" in result.stdout
    assert f"weights {millions * 1e6 * 2 / 2**30:.2f}" in result.stdout
    too_small = doctor([f"model={model}", "hardware=gpu", "hardware.gpu_memory_gib=16"], tmp_path)
    assert too_small.returncode == 2 and "does NOT fit" in too_small.stdout


def test_a_full_weight_gpu_run_beyond_its_nodes_ram_is_refused_naming_the_key(tmp_path):
    """EGGROLL with Adam at 7B on 8 GPUs of a 256 GiB node: 73 GiB of master copies and moments a
    worker on the host (they do not fit beside vLLM's share of an 80 GiB GPU)."""
    node = ["model=qwen2_5_7b", "strategy=eggroll", "strategy.optimizer=adam", "hardware=gpu"]
    node += ["hardware.gpu_memory_gib=80", "hardware.gpus_per_node=8", "hardware.num_workers=8"]
    small = doctor([*node, "hardware.host_memory_gib=256"], tmp_path)
    assert small.returncode == 2, small.stdout + small.stderr[-2000:]
    host = next(line for line in small.stdout.splitlines() if line.startswith("host "))
    assert "8 workers a node" in host and "master copies 72.9" in host and host.endswith("of 256 GiB -> does NOT fit")
    verdict = small.stdout.strip().splitlines()[-1]
    assert verdict.startswith('verdict      cannot run: hardware.master_weights="auto": 8 workers on a node need')
    large = doctor([*node, "hardware.host_memory_gib=2048"], tmp_path)
    assert large.returncode == 0 and "of 2048 GiB -> fits" in large.stdout, large.stdout + large.stderr[-2000:]


def test_a_run_whose_estimate_exceeds_the_device_stops_before_ray(tmp_path):
    result = run_evora(["hardware.num_workers=64", "hardware.kv_cache_gib=1"], tmp_path)
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("evora: error: hardware.num_workers=64: the workers need") and "lower" in line
    assert os.listdir(tmp_path) == [] or not list(tmp_path.rglob("metrics.jsonl"))
