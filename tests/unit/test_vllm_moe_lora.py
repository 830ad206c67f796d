"""MoE LoRA module names against vLLM's own functions (vLLM 0.32), no engine and no weights.

A stand-in for vLLM's Qwen3MoeForCausalLM module tree (each module an instance of the vLLM
class the real model has, made without weights or a distributed setup) lets vLLM's own
`get_supported_lora_modules`, `process_packed_modules_mapping`, `is_in_target_modules` and
folder loader (`WorkerLoRAManager._load_adapter` -> `LoRAModel.from_local_checkpoint`) run
as they would on the real model.

- vLLM wraps a mixture's routed experts as ONE layer, `model.layers.N.mlp.experts` (a
  MoERunner); `lora_target_modules` selects it only by the name `experts`.
- An adapter held in memory (evora's `memory_request`) passes evora's module check exactly
  when the same tensors in a folder pass vLLM's own check.
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

NUM_EXPERTS, HIDDEN, MOE_INTER, INTER = 4, 16, 8, 24
RANK = 2
SUFFIXES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _bare(cls):
    obj = cls.__new__(cls)
    torch.nn.Module.__init__(obj)
    return obj


def stub_qwen3_moe(mlp_only_layers: tuple[int, ...] = (), num_layers: int = 2):
    """Qwen3MoeForCausalLM's LoRA-relevant module tree (qwen3_moe.py): qkv_proj, o_proj, the
    router `mlp.gate` (GateLinear), the routed experts `mlp.experts` (MoERunner, holding the
    gate again as `mlp.experts.gate`), dense `gate_up_proj`/`down_proj` in mlp_only layers."""
    from vllm.model_executor.layers.fused_moe import MoERunner
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

    class StubQwen3Moe(torch.nn.Module):
        packed_modules_mapping = copy.deepcopy(Qwen3MoeForCausalLM.packed_modules_mapping)
        embedding_modules = Qwen3MoeForCausalLM.embedding_modules
        hf_to_vllm_mapper = Qwen3MoeForCausalLM.hf_to_vllm_mapper
        is_3d_moe_weight = Qwen3MoeForCausalLM.is_3d_moe_weight
        is_non_gated_moe = Qwen3MoeForCausalLM.is_non_gated_moe
        lora_skip_prefixes = Qwen3MoeForCausalLM.lora_skip_prefixes

    model = StubQwen3Moe()
    # As Qwen3MoeForCausalLM.__init__ does (it sets the class-level dict; a copy here).
    model.packed_modules_mapping = {k: list(v) for k, v in model.packed_modules_mapping.items() if k != "gate_up_proj"}
    if mlp_only_layers:
        model.packed_modules_mapping["gate_up_proj"] = ["gate_proj", "up_proj"]
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList()
    for index in range(num_layers):
        layer = torch.nn.Module()
        layer.self_attn = torch.nn.Module()
        layer.self_attn.qkv_proj = _bare(QKVParallelLinear)
        layer.self_attn.o_proj = _bare(RowParallelLinear)
        layer.mlp = torch.nn.Module()
        if index in mlp_only_layers:
            layer.mlp.gate_up_proj = _bare(MergedColumnParallelLinear)
            layer.mlp.down_proj = _bare(RowParallelLinear)
        else:
            layer.mlp.gate = _bare(GateLinear)
            runner = _bare(MoERunner)
            runner.gate = layer.mlp.gate
            # RoutedExperts.get_expert_mapping as FusedMoEFactory configures it for Qwen3-MoE,
            # before LoRA wrapping (lora_base_layer_prefix still "").
            runner.get_expert_mapping = lambda: RoutedExperts.build_expert_params_mapping(
                "gate_proj", "down_proj", "up_proj", num_experts=NUM_EXPERTS, routed_experts_prefix=""
            )
            layer.mlp.experts = runner
        model.model.layers.append(layer)
    model.lm_head = _bare(ParallelLMHead)
    return model


def stub_worker(model):
    """What WorkerLoRAManager._load_adapter reads of itself and of its LoRAModelManager."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.utils import get_supported_lora_modules, process_packed_modules_mapping

    adapter_manager = SimpleNamespace(
        model=model,
        supported_lora_modules=get_supported_lora_modules(model),
        packed_modules_mapping=process_packed_modules_mapping(model),
        moe_ep_load_spec=None,
        # The format checks need the wrapped layers; names only here.
        _validate_moe_lora_format=lambda lora: None,
        _validate_modules_to_save=lambda lora: None,
        _validate_token_classification_lora=lambda lora: None,
    )
    return SimpleNamespace(
        _adapter_manager=adapter_manager,
        _lora_model_cls=LoRAModel,
        lora_config=SimpleNamespace(max_lora_rank=8, lora_dtype=torch.float32),
        max_position_embeddings=512,
        vocab_size=100,
    )


def _pair(module: str, in_features: int, out_features: int) -> dict[str, torch.Tensor]:
    prefix = f"base_model.model.{module}"
    return {
        f"{prefix}.lora_A.weight": torch.randn(RANK, in_features),
        f"{prefix}.lora_B.weight": torch.randn(out_features, RANK),
    }


def per_expert_adapter(layer: int = 0, experts: range = range(NUM_EXPERTS)) -> dict[str, torch.Tensor]:
    """evora's names: attention and every expert's gate/up/down, as the checkpoint stores them."""
    tensors: dict[str, torch.Tensor] = {}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        tensors |= _pair(f"model.layers.{layer}.self_attn.{name}", HIDDEN, HIDDEN)
    for e in experts:
        for name, (i, o) in {
            "gate_proj": (HIDDEN, MOE_INTER),
            "up_proj": (HIDDEN, MOE_INTER),
            "down_proj": (MOE_INTER, HIDDEN),
        }.items():
            tensors |= _pair(f"model.layers.{layer}.mlp.experts.{e}.{name}", i, o)
    return tensors


def peft_3d_adapter(layer: int = 0) -> dict[str, torch.Tensor]:
    """PEFT's target_parameters format: experts.base_layer = gate_up_proj, experts = down_proj."""
    return _pair(f"model.layers.{layer}.mlp.experts.base_layer", HIDDEN, 2 * MOE_INTER * NUM_EXPERTS) | _pair(
        f"model.layers.{layer}.mlp.experts", MOE_INTER, HIDDEN * NUM_EXPERTS
    )


CONFIG = {"peft_type": "LORA", "r": RANK, "lora_alpha": 2 * RANK, "target_modules": SUFFIXES, "bias": "none"}

CASES = {
    "per-expert keys": (per_expert_adapter(), ()),
    "PEFT 3-D expert keys": (peft_3d_adapter(), ()),
    "router gate": (_pair("model.layers.0.mlp.gate", HIDDEN, NUM_EXPERTS), ()),
    "expert index beyond the model's": (per_expert_adapter(experts=range(NUM_EXPERTS, NUM_EXPERTS + 1)), ()),
    "expert named w1 (Mixtral's name)": (_pair("model.layers.0.mlp.experts.0.w1", HIDDEN, MOE_INTER), ()),
    "dense gate_proj, no dense MLP": (_pair("model.layers.0.mlp.gate_proj", HIDDEN, INTER), ()),
    "dense gate_proj, mlp_only layer": (_pair("model.layers.0.mlp.gate_proj", HIDDEN, INTER), (0,)),
    "per-expert keys, mlp_only layer 1": (per_expert_adapter(), (1,)),
}


def _outcome(load) -> str:
    try:
        load()
    except ValueError as error:
        return f"refused: {str(error)[:80]}"
    return "loaded"


@pytest.mark.parametrize("case", list(CASES))
def test_a_memory_adapter_passes_evoras_check_exactly_when_vllms_folder_loader_takes_it(case, tmp_path):
    from safetensors.torch import save_file
    from vllm.lora.request import LoRARequest
    from vllm.lora.worker_manager import WorkerLoRAManager

    from evora.engines import vllm_patches

    tensors, mlp_only = CASES[case]
    worker = stub_worker(stub_qwen3_moe(mlp_only_layers=mlp_only))
    assert vllm_patches.install_memory_adapters()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "adapter_model.safetensors"))
    (tmp_path / "adapter_config.json").write_text(json.dumps(CONFIG))

    # vLLM's own folder loader (the installed patch hands a folder request to it unchanged).
    folder = _outcome(lambda: WorkerLoRAManager._load_adapter(worker, LoRARequest("a", 1, str(tmp_path))))
    memory = _outcome(
        lambda: WorkerLoRAManager._load_adapter(worker, vllm_patches.memory_request("a", 1, tensors, CONFIG))
    )
    assert (folder == "loaded") == (memory == "loaded"), f"folder: {folder}; memory: {memory}"


def test_per_expert_keys_load_from_memory():
    """The case evora writes (lora/modules.py names), spelled out: the folder loader takes it."""
    from vllm.lora.worker_manager import WorkerLoRAManager

    from evora.engines import vllm_patches

    assert vllm_patches.install_memory_adapters()
    worker = stub_worker(stub_qwen3_moe())
    tensors = per_expert_adapter()
    lora = WorkerLoRAManager._load_adapter(worker, vllm_patches.memory_request("a", 1, tensors, CONFIG))
    assert "model.layers.0.mlp.experts.3.gate_proj" in lora.loras  # stacked later, by the LoRA manager's pack_moe


def test_vllm_wraps_the_experts_layer_only_when_the_targets_name_experts():
    from vllm.lora.utils import is_in_target_modules, process_packed_modules_mapping

    model = stub_qwen3_moe(mlp_only_layers=(1,))
    packed = process_packed_modules_mapping(model)
    assert packed["experts"][:3] == ["experts.0.gate_proj", "experts.0.down_proj", "experts.0.up_proj"]
    assert not is_in_target_modules("model.layers.0.mlp.experts", SUFFIXES, packed)
    targets = [*SUFFIXES, "experts"]
    for module in (
        "model.layers.0.mlp.experts",
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.1.mlp.gate_up_proj",
        "model.layers.1.mlp.down_proj",
    ):
        assert is_in_target_modules(module, targets, packed), module
    assert not is_in_target_modules("model.layers.0.mlp.gate", targets, packed)  # the router: only "gate"


def test_evora_asks_vllm_for_the_experts_layer_when_its_layout_adapts_experts():
    from vllm.lora.utils import is_in_target_modules, process_packed_modules_mapping

    from evora.distributed.worker_spec import vllm_target_modules
    from evora.lora.layout import EXPERT, Adaptable, build_layout

    adaptable = {
        f"model.layers.0.self_attn.{n}": Adaptable(HIDDEN, HIDDEN) for n in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    adaptable |= {
        f"model.layers.0.mlp.experts.{e}.{n}": Adaptable(MOE_INTER, HIDDEN, EXPERT)
        for e in range(NUM_EXPERTS)
        for n in ("gate_proj", "up_proj", "down_proj")
    }
    moe = build_layout(adaptable, rank=RANK, alpha=4, target_modules="auto", layers=None, base_model="m")
    attention = build_layout(
        adaptable, rank=RANK, alpha=4, target_modules=["q_proj", "o_proj"], layers=None, base_model="m"
    )
    packed = process_packed_modules_mapping(stub_qwen3_moe())
    assert is_in_target_modules("model.layers.0.mlp.experts", list(vllm_target_modules(moe)), packed)
    assert is_in_target_modules("model.layers.0.self_attn.qkv_proj", list(vllm_target_modules(moe)), packed)
    assert vllm_target_modules(attention) == ("q_proj", "o_proj")  # no experts adapted: not wrapped
