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
import hashlib
import os
import pickle
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from evora.lora.layout import CONV1D, EXPERT, Adaptable


@dataclass(frozen=True)
class ConfigFacts:
    """What planning reads of the transformers config, as plain data: a plan, and the cache
    below, are read without importing transformers."""

    stored_dtype: str  # the dtype the checkpoint names (e.g. "bfloat16"; "float32" where it names none)
    layers: int | None  # num_hidden_layers, the range of lora.layers (None: the config has none)
    kv_values_per_token: int  # 2 x layers x KV heads x head dim of the text model: the KV cache's values per token


@dataclass(frozen=True)
class ModelModules:
    architecture: str  # e.g. Qwen3MoeForCausalLM
    model_type: str  # e.g. qwen3_moe
    adaptable: dict[str, Adaptable]  # checkpoint module name -> shape and kind, in model order
    not_adaptable: tuple[str, ...]  # 3-D parameters without a per-expert checkpoint form
    parameters: int  # every weight of the model
    experts: int  # experts per mixture layer (0: dense)
    facts: ConfigFacts


@functools.lru_cache(maxsize=8)  # validation and `evora doctor` ask for the same model
def model_modules(model_path: str, *, revision: str | None = None, trust_remote_code: bool = False) -> ModelModules:
    """A local folder's are cached on disk by its config.json (and the transformers version):
    building the model on the meta device imports transformers, 5 s of every run's start."""
    cache = None if trust_remote_code else _cache_file(model_path)
    if cache is not None and cache.is_file():
        try:
            cached = pickle.loads(cache.read_bytes())
            if isinstance(cached, ModelModules):
                return cached
        except Exception:  # a cache from another evora, or cut short: built again below
            pass
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, revision=revision, trust_remote_code=trust_remote_code)
    modules = modules_of_config(config, trust_remote_code=trust_remote_code)
    if cache is not None:
        _write_atomically(cache, pickle.dumps(modules))
        _prune(cache.parent)
    return modules


def modules_of_config(config: Any, *, trust_remote_code: bool = False) -> ModelModules:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    adaptable, fused, experts = _walk(model, CheckpointNames(config.model_type))
    architecture = (getattr(config, "architectures", None) or [type(model).__name__])[0]
    parameters = sum(p.numel() for p in model.parameters())
    facts = config_facts(config)
    return ModelModules(architecture, config.model_type, adaptable, tuple(fused), parameters, experts, facts)


def config_facts(config: Any) -> ConfigFacts:
    stored = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
    text = config.get_text_config()  # the standard names resolve through each config's attribute_map (GPT-2's n_head)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads  # absent: multi-head attention
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    layers = getattr(config, "num_hidden_layers", None)
    return ConfigFacts(stored.removeprefix("torch."), layers, 2 * text.num_hidden_layers * kv_heads * head_dim)


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evora" / "model_modules"


def _cache_file(model_path: str) -> Path | None:
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return None  # a hub id: its config comes from the hub (or the hub's cache)
    key = hashlib.sha256(config.read_bytes())
    for source in (Path(__file__), Path(__file__).with_name("layout.py")):  # how modules are read and held
        key.update(source.read_bytes())
    key.update(version("transformers").encode())
    return cache_root() / f"{key.hexdigest()[:32]}.pkl"


CACHE_ENTRIES = 256  # a few KiB each: every model and evora/transformers version a machine has run


def _prune(root: Path, keep: int = CACHE_ENTRIES) -> None:
    """The cache's oldest entries beyond `keep` go (each is rebuilt in seconds if asked for again)."""
    try:
        entries = sorted(root.glob("*.pkl"), key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in entries[keep:]:
            stale.unlink(missing_ok=True)
    except OSError:  # another process pruning at once, or a read-only home: best effort
        pass


def _write_atomically(path: Path, data: bytes) -> None:
    """Best effort: a read-only home only costs the next run the time the cache would save."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(data)
        partial.replace(path)
    except OSError:
        pass


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
