"""Every change evora makes to vLLM's internals, in one place, each checked against the vLLM
version it was written for (`WRITTEN_FOR`): with another vLLM, a patch is not installed and
the engine keeps vLLM's own behaviour (and says so once in the log).

- `install_cpu_lora`: grouped multi-LoRA ops for the CPU backend (`vllm_cpu_lora`): the
  linear layers' `add_lora_linear` runs batched matmuls over the step's adapter groups, and
  the per-row ops leave rows without an adapter untouched.
- `install_memory_adapters`: a LoRA request may carry its tensors (`memory_request`): the
  worker's LoRA manager builds the adapter from them (`LoRAModel.from_lora_tensors`, what
  its file loader ends in) instead of reading a folder, the way RL frameworks (veRL) hand
  fresh weights to vLLM. Only for an engine in evora's process (no engine-core process, tensor
  parallel size 1), where the request object itself reaches the model runner.
- `install_cpu_distribution_name`: the CPU build's distribution is named `vllm-cpu`, so
  `importlib.metadata.version("vllm")` (lm-eval's vLLM backend asks it at import) fails; this
  process then answers it with vllm-cpu's metadata and the version vLLM's own platform
  detection gives that build (`<version>+cpu`). Not a change to vLLM itself: any version.

The base-weight worker extension (`vllm_weights`) uses vLLM's public extension point and is
checked against the same version.
"""

from __future__ import annotations

import functools
import logging
import sys
from importlib import metadata
from typing import Any, Iterator, Literal, cast

import torch

from evora.engines import vllm_cpu_lora

WRITTEN_FOR = "0.32"
log = logging.getLogger(__name__)


def vllm_version() -> str:
    import vllm

    return vllm.__version__


def written_for_this_vllm(what: str) -> bool:
    version = vllm_version()
    if version.split(".")[:2] == WRITTEN_FOR.split("."):
        return True
    log.warning("evora: %s was written for vLLM %s.x, not %s: vLLM's own code runs instead", what, WRITTEN_FOR, version)
    return False


class _CpuBuildAsVllm(metadata.Distribution):
    """vllm-cpu's installed metadata, named `vllm` and versioned `<version>+cpu`: the version vLLM's
    own platform detection gives the CPU build (`vllm.platforms.vllm_version_matches_substr`)."""

    def __init__(self, cpu_build: metadata.Distribution):
        self.cpu_build = cpu_build

    def read_text(self, filename: str) -> str | None:
        text = self.cpu_build.read_text(filename)
        if text is None or filename not in ("METADATA", "PKG-INFO"):
            return text
        lines = [
            "Name: vllm" if line.startswith("Name:") else f"{line}+cpu" if line.startswith("Version:") else line
            for line in text.split("\n")
        ]
        return "\n".join(lines)

    def locate_file(self, path: Any) -> Any:
        return self.cpu_build.locate_file(path)


class _VllmFinder(metadata.DistributionFinder):
    """Finds the CPU build's metadata under the name `vllm` (and no modules)."""

    def __init__(self, distribution: metadata.Distribution):
        self.distribution = distribution

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        return None

    def find_distributions(
        self, context: metadata.DistributionFinder.Context = metadata.DistributionFinder.Context()
    ) -> Iterator[metadata.Distribution]:
        return iter([self.distribution] if context.name == "vllm" else [])


def install_cpu_distribution_name() -> bool:
    """`vllm`'s metadata answered with the CPU build's where only `vllm-cpu` is installed."""
    try:
        metadata.distribution("vllm")
        return False  # the GPU build (or installed already)
    except metadata.PackageNotFoundError:
        pass
    try:
        cpu_build = metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    sys.meta_path.append(_VllmFinder(_CpuBuildAsVllm(cpu_build)))
    return True


def install_cpu_lora() -> bool:
    """Install the grouped CPU LoRA ops; False (vLLM's own ops stay) with another vLLM."""
    if not written_for_this_vllm("the grouped CPU LoRA ops"):
        return False
    import vllm.lora.punica_wrapper.punica_cpu as punica_cpu

    wrapper = punica_cpu.PunicaWrapperCPU
    if not all(callable(getattr(punica_cpu, name, None)) for name in vllm_cpu_lora.REPLACED):
        return False
    for name in vllm_cpu_lora.REPLACED:
        setattr(punica_cpu, name, getattr(vllm_cpu_lora, name))
    if not getattr(wrapper, "_evora_grouped", False):
        _group_linear_layers(wrapper)
    return True


def _group_linear_layers(wrapper: Any) -> None:
    """Wrap the punica wrapper: group the rows once per metadata update, batch every linear layer."""
    update_metadata, add_lora_linear = wrapper.update_metadata, wrapper.add_lora_linear

    # PunicaWrapperCPU's signatures; self: the wrapper instance.
    def grouped_update_metadata(
        self: Any, mapping: Any, lora_index_to_id: list[int | None], max_loras: int, vocab_size: int, **kwargs: Any
    ) -> None:
        update_metadata(self, mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        # vLLM recomputes its metadata whenever the batch's mapping or the slots' adapters change.
        self._evora_groups = vllm_cpu_lora.step_groups(self.token_lora_indices, list(lora_index_to_id))
        self._evora_weights = getattr(self, "_evora_weights", {})

    def grouped_add_lora_linear(
        self: Any,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        lora_b_stacked: tuple[torch.Tensor, ...],
        scale: float,
        output_slices: tuple[int, ...],
        **kwargs: Any,
    ) -> None:
        # Set by grouped_update_metadata; False before the first update (vLLM's own op runs).
        groups = cast("vllm_cpu_lora.StepGroups | Literal[False] | None", getattr(self, "_evora_groups", False))
        if groups is None:
            return None  # no row of this step has an adapter
        if groups is False or not _fits(groups, y, x, lora_a_stacked, output_slices):
            return add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, **kwargs)
        cached = self._evora_weights.get(id(lora_a_stacked[0]))
        if cached is None or cached.key != groups.weights_key(y.dtype):  # one entry per layer: the active adapters
            cached = vllm_cpu_lora.grouped_weights(lora_a_stacked, lora_b_stacked, groups, output_slices, y.dtype)
            self._evora_weights[id(lora_a_stacked[0])] = cached
        vllm_cpu_lora.grouped_lora_linear(y, x, groups, cached, scale)
        return None

    wrapper.update_metadata = grouped_update_metadata
    wrapper.add_lora_linear = grouped_add_lora_linear
    wrapper._evora_grouped = True
    wrapper._evora_vllm_add_lora_linear = add_lora_linear  # bench/throughput.py --previous


def install_memory_adapters() -> bool:
    """Let LoRA requests carry their tensors; False (files only) with another vLLM."""
    if not written_for_this_vllm("loading adapters from memory"):
        return False
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.lora.worker_manager import WorkerLoRAManager

    if getattr(WorkerLoRAManager, "_evora_memory", False):
        return True
    load_from_folder = WorkerLoRAManager._load_adapter

    def load_adapter(self: Any, lora_request: Any) -> Any:
        tensors = getattr(lora_request, "evora_tensors", None)
        if tensors is None:
            return load_from_folder(self, lora_request)
        helper = PEFTHelper.from_dict(
            {**lora_request.evora_config, "vllm_max_position_embeddings": self.max_position_embeddings}
        )
        helper.validate_legal(self.lora_config)
        mapper = getattr(self._adapter_manager.model, "hf_to_vllm_mapper", None)
        mapper = mapper.get_rename_mapper() if mapper is not None else None
        skip_prefixes = getattr(self._adapter_manager.model, "lora_skip_prefixes", None)
        _check_modules(self, tensors, mapper, lora_request.lora_name, helper, skip_prefixes)
        lora = self._lora_model_cls.from_lora_tensors(
            lora_model_id=lora_request.lora_int_id,
            tensors=dict(tensors),
            peft_helper=helper,
            # Where the tensors are: a candidate drawn on the GPU (hardware.noise_device) stays
            # there, and vLLM copies it into its LoRA slots without a trip through the host.
            device=str(next(iter(tensors.values())).device) if tensors else "cpu",
            dtype=self.lora_config.lora_dtype,
            model_vocab_size=self.vocab_size,
            weights_mapper=mapper,
            skip_prefixes=skip_prefixes,
        )
        lora.is_3d_lora_weight = lora_request.is_3d_lora_weight
        for check in ("_validate_moe_lora_format", "_validate_modules_to_save", "_validate_token_classification_lora"):
            getattr(self._adapter_manager, check)(lora)  # as vLLM's folder loader does
        return lora

    setattr(WorkerLoRAManager, "_load_adapter", load_adapter)  # (a method mypy would not let us assign)
    setattr(WorkerLoRAManager, "_evora_memory", True)
    return True


def _expected_modules(adapter_manager: Any) -> set[str]:
    """The module names vLLM's folder loader expects (`WorkerLoRAManager._load_adapter`): each
    supported module, or the modules a packed one is made of (`qkv_proj` -> q/k/v_proj; a
    mixture's `experts` -> `experts.0.gate_proj`, `experts.0.down_proj`, ... per expert), and
    `experts` itself too (PEFT's 3-D expert format names the fused layer)."""
    packed = adapter_manager.packed_modules_mapping
    expected: set[str] = set()
    for module in adapter_manager.supported_lora_modules:
        expected.update(packed.get(module, [module]))
        if module == "experts":
            expected.add(module)
    return expected


def _check_modules(
    manager: Any, tensors: Any, mapper: Any, name: str, helper: Any, skip_prefixes: list[str] | None
) -> None:
    """Every tensor targets a module this model's LoRA layers take: an adapter whose modules
    vLLM skipped would be silently not applied. vLLM's folder loader's rule
    (`LoRAModel.from_local_checkpoint`, its `check_unexpected_modules`): an expert module by its
    name from `experts` on (`model.layers.0.mlp.experts.3.gate_proj` -> `experts.3.gate_proj`),
    any other by its last part; `base_layer` tensors and skipped prefixes are not checked."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.utils import is_base_embedding_weights, parse_fine_tuned_lora_name

    expected = _expected_modules(manager._adapter_manager)
    to_save = set(helper.modules_to_save or ())
    unexpected: set[str] = set()
    for key in tensors:
        if is_base_embedding_weights(key) or "base_layer" in key:
            continue
        if skip_prefixes and LoRAModel._should_skip_module(key, skip_prefixes):
            continue
        module = parse_fine_tuned_lora_name(key, mapper)[0]
        if ".experts" in module:
            if module[module.find(".experts") + 1 :] not in expected:
                unexpected.add(module)
        elif module.rsplit(".", 1)[-1] not in expected | to_save:
            unexpected.add(module)
    if unexpected:
        shown = sorted(m for m in expected if not m.startswith("experts."))  # not every expert's
        raise ValueError(f"adapter {name}: expected target modules in {shown}, got {sorted(unexpected)[:4]}")


@functools.cache
def _memory_request_type() -> type:
    from vllm.lora.request import LoRARequest

    class MemoryLoRARequest(LoRARequest, omit_defaults=True, array_like=True):
        """A LoRA request with its PEFT tensors and adapter config (`install_memory_adapters`)."""

        evora_tensors: Any = None
        evora_config: Any = None

    return MemoryLoRARequest


def memory_request(name: str, lora_id: int, tensors: Any, config: Any) -> Any:
    # vLLM wants a path; nothing reads it for a request that carries its tensors.
    return _memory_request_type()(name, lora_id, f"memory:{name}", evora_tensors=tensors, evora_config=dict(config))


def _fits(groups: Any, y: Any, x: Any, lora_a_stacked: tuple, output_slices: tuple) -> bool:
    """The grouped path covers the step: one row per token, a contiguous output the slices fill."""
    return (
        x.numel() == groups.num_rows * x.shape[-1]
        and y.is_contiguous()
        and y.shape[-1] == sum(output_slices)
        and len(lora_a_stacked) == len(output_slices)
    )
