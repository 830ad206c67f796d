"""Every change evora makes to vLLM's internals, in one place, each checked against the vLLM
version it was written for (`WRITTEN_FOR`): with another vLLM, a patch is not installed and
the engine keeps vLLM's own behaviour (and says so once in the log).

- `install_cpu_lora`: grouped multi-LoRA ops for the CPU backend (`vllm_cpu_lora`): the
  linear layers' `add_lora_linear` runs batched matmuls over the step's adapter groups, and
  the per-row ops leave rows without an adapter untouched.

The base-weight worker extension (`vllm_weights`) uses vLLM's public extension point and is
checked against the same version.
"""

from __future__ import annotations

import logging
from typing import Any

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

    def grouped_update_metadata(self, mapping, lora_index_to_id, max_loras, vocab_size, **kwargs):
        update_metadata(self, mapping, lora_index_to_id, max_loras, vocab_size, **kwargs)
        # vLLM recomputes its metadata whenever the batch's mapping or the slots' adapters change.
        self._evora_groups = vllm_cpu_lora.step_groups(self.token_lora_indices, list(lora_index_to_id))
        self._evora_weights = getattr(self, "_evora_weights", {})

    def grouped_add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, **kwargs):
        groups = getattr(self, "_evora_groups", False)
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


def _fits(groups: Any, y: Any, x: Any, lora_a_stacked: tuple, output_slices: tuple) -> bool:
    """The grouped path covers the step: one row per token, a contiguous output the slices fill."""
    return (
        x.reshape(-1, x.shape[-1]).shape[0] == groups.num_rows
        and y.is_contiguous()
        and y.shape[-1] == sum(output_slices)
        and len(lora_a_stacked) == len(output_slices)
    )
