"""A model's adaptable weights, read from its config alone (meta device, nothing loaded).

`nn.Linear` layers as they are; transformers' `Conv1D` (GPT-2) with its [in, out] storage;
a mixture's 3-D expert parameters (transformers 5 fuses experts into `[experts, out, in]`
tensors) as the per-expert modules its checkpoint stores, found through transformers' own
checkpoint conversion mapping (`mlp.experts.*.gate_proj.weight` + `...up_proj.weight` ->
`mlp.experts.gate_up_proj`), so adapters name the weights as vLLM and PEFT read them. A
3-D parameter with no per-expert form in the checkpoint is listed as not adaptable.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from evora.lora.layout import CONV1D, EXPERT, Adaptable


@dataclass(frozen=True)
class ModelModules:
    architecture: str  # e.g. Qwen3MoeForCausalLM
    model_type: str  # e.g. qwen3_moe
    adaptable: dict[str, Adaptable]  # checkpoint module name -> shape and kind, in model order
    not_adaptable: tuple[str, ...]  # 3-D parameters without a per-expert checkpoint form
    parameters: int  # every weight of the model
    experts: int  # experts per mixture layer (0: dense)
    config: Any  # the transformers config; in the planning process only (see __getstate__)

    def __getstate__(self) -> dict[str, Any]:
        """Sent without the transformers config, which only planning reads: unpickling it would
        import transformers (about 5 s) in a driver that needs nothing else from it."""
        return {**self.__dict__, "config": None}


@functools.lru_cache(maxsize=8)  # validation and `evora doctor` ask for the same model
def model_modules(model_path: str, *, revision: str | None = None, trust_remote_code: bool = False) -> ModelModules:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, revision=revision, trust_remote_code=trust_remote_code)
    return modules_of_config(config, trust_remote_code=trust_remote_code)


def modules_of_config(config: Any, *, trust_remote_code: bool = False) -> ModelModules:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    adaptable, fused, experts = _walk(model, CheckpointNames(config.model_type))
    architecture = (getattr(config, "architectures", None) or [type(model).__name__])[0]
    parameters = sum(p.numel() for p in model.parameters())
    return ModelModules(architecture, config.model_type, adaptable, tuple(fused), parameters, experts, config)


def adaptable_modules(
    model_path: str, *, revision: str | None = None, trust_remote_code: bool = False
) -> dict[str, Adaptable]:
    """Checkpoint module name -> Adaptable of every weight LoRA can adapt (lm_head excluded)."""
    return model_modules(model_path, revision=revision, trust_remote_code=trust_remote_code).adaptable


def _walk(model: Any, names: "CheckpointNames") -> tuple[dict[str, Adaptable], list[str], int]:
    import torch
    from transformers.pytorch_utils import Conv1D

    adaptable: dict[str, Adaptable] = {}
    fused, experts = [], 0
    for name, module in model.named_modules():
        if name == "lm_head" or name.endswith(".lm_head"):
            continue
        if isinstance(module, torch.nn.Linear):
            adaptable[names.module(name)] = Adaptable(*module.weight.shape)
        elif isinstance(module, Conv1D):
            adaptable[names.module(name)] = Adaptable(module.weight.shape[1], module.weight.shape[0], CONV1D)
        for parameter_name, parameter in module.named_parameters(recurse=False):
            if parameter.ndim == 3:
                per_expert = names.experts(f"{name}.{parameter_name}", tuple(parameter.shape))
                adaptable.update(per_expert)
                experts = max(experts, parameter.shape[0])
                if not per_expert:
                    fused.append(f"{name}.{parameter_name}")
    return adaptable, fused, experts


class CheckpointNames:
    """Module names as the checkpoint has them, from transformers' conversion mapping of the
    model type (renamed modules; per-expert weights merged into 3-D parameters)."""

    def __init__(self, model_type: str):
        try:
            from transformers.conversion_mapping import get_checkpoint_conversion_mapping
            from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter, WeightRenaming
        except ImportError:  # transformers 4: experts are nn.Linear modules, named as in the checkpoint
            self.renamings, self.mergers = [], []
            return
        rules = get_checkpoint_conversion_mapping(model_type) or []
        self.renamings = [
            (r.target_patterns[0], r.source_patterns[0])
            for r in rules
            if isinstance(r, WeightRenaming) and len(r.source_patterns) == len(r.target_patterns) == 1
        ]
        self.mergers = [
            (c.target_patterns[0], tuple(c.source_patterns))
            for c in rules
            if isinstance(c, WeightConverter)
            and len(c.target_patterns) == 1
            and all(
                isinstance(op, MergeModulelist) and op.dim == 0 or isinstance(op, Concatenate) and op.dim == 1
                for op in c.operations
            )
        ]

    def module(self, name: str) -> str:
        for model_part, checkpoint_part in self.renamings:
            if _plain(model_part) and _plain(checkpoint_part):
                name = name.replace(model_part, checkpoint_part)
        return name

    def experts(self, parameter: str, shape: tuple[int, ...]) -> dict[str, Adaptable]:
        """The per-expert modules a fused [experts, out, in] parameter is merged from."""
        for target, sources in self.mergers:
            if parameter.endswith(target) and all(s.endswith(".weight") and "*" in s for s in sources):
                prefix, (count, out, inn) = parameter[: -len(target)], shape
                return {
                    self.module(prefix + source.replace("*", str(e)).removesuffix(".weight")): Adaptable(
                        out // len(sources), inn, EXPERT
                    )
                    for e in range(count)
                    for source in sources
                }
        return {}


def _plain(pattern: str) -> bool:
    return not any(ch in pattern for ch in "^$*+?()[]{}|\\")
