"""Multi-LoRA products for vLLM's CPU backend.

vLLM's CPU punica ops (`vllm/lora/ops/torch_ops`) have two problems for evora:

- a correctness bug: index -1 means "no adapter" (vLLM's GPU kernels skip those rows),
  but the torch ops index with it, i.e. take the last adapter slot. A base-model request
  batched while every slot is in use silently runs with another request's adapter;
- speed: they gather a full [out, rank] weight copy for every token (`weights[indices]`)
  before an einsum, at every LoRA module of every layer, every step.

The linear layers (every LoRA module evora targets) take the grouped path: once per step,
when vLLM recomputes its LoRA metadata, the step's token rows are grouped by adapter
(`StepGroups`); every layer then runs two batched matmuls over the groups (all slices of a
fused qkv / gate_up layer at once: A stacked, B block-diagonal), on weights arranged once
per set of active adapters (`GroupedWeights`, keyed by the adapters' LoRA ids, which evora
never reuses for other weights). Rows without an adapter are left untouched. The per-row
ops below serve the rest (logits and embedding LoRA, and the rare step the grouped path
does not cover): one matmul per adapter present, -1 rows untouched.

Both compute the same products as vLLM's ops up to float summation order (the engine
tests hold vLLM = transformers token for token, mixed batches included).
`evora/engines/vllm_patches.py` installs them, on CPU only, for the vLLM version they were
written for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

# The per-row ops replaced in vllm.lora.punica_wrapper.punica_cpu (by name).
REPLACED = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")


# --- the grouped path (linear layers) ----------------------------------------------------


# Runs or groups of at least this many rows on average are multiplied one by one (prefill:
# long, unequal groups, where padding them to one length would waste more than the calls
# cost); shorter ones as one padded, batched pair of matmuls for all groups (decode).
LOOP_ROWS = 64
# The padded path makes its buffers (gathered inputs, products) a few groups at a time, each
# under this size: glibc maps a buffer over its mmap threshold (at most 32 MiB) afresh on every
# call and faults it in page by page, which made the op 2.5x slower at Qwen2.5-1.5B's widths
# (bench/cpu_lora.py's widths table).
CHUNK_BYTES = 16 * 2**20


@dataclass(frozen=True)
class StepGroups:
    """A step's token rows grouped by adapter slot, in one of four shapes:

    - `length` > 0, `gather` None: the rows come as G equal runs, one slot each (a uniform
      population in decode); x is viewed as [G, length, in] as it is;
    - `length` > 0: the rows are gathered into G groups padded to `length` cells each
      (`gather`: the row behind each cell, group-major; a padding cell repeats a real row and
      `keep` zeroes its product) and multiplied batched, a chunk of groups at a time; the
      products are added at their rows;
    - `length` 0, `gather` None: long runs of one slot each (prefill: a prompt's tokens),
      multiplied run by run in place (`runs`: start, end and group of each);
    - `length` 0: the rows gathered by slot without padding (`gather`), multiplied group by
      group (`runs` over the gathered rows) and added back at their rows.
    """

    num_rows: int
    slots: tuple[int, ...]  # the adapter slot of each group
    lora_ids: tuple[int | None, ...]  # the LoRA id in each of those slots: keys GroupedWeights
    length: int
    gather: torch.Tensor | None = None
    keep: torch.Tensor | None = None  # [G, length, 1] fp32: 1 a real cell, 0 padding
    runs: tuple[tuple[int, int, int], ...] = ()

    def weights_key(self, dtype: torch.dtype) -> tuple:
        """What a layer's `GroupedWeights` for this step depend on."""
        return self.slots, self.lora_ids, dtype


# (num_rows, slots, lora_ids): the first three fields of a StepGroups.
Named = tuple[int, tuple[int, ...], tuple["int | None", ...]]


def step_groups(indices: torch.Tensor, slot_ids: list[int | None]) -> StepGroups | None:
    """Group the rows of a step by their adapter slot (`indices`, -1: none); None when no row has one."""
    indices = indices.to("cpu", torch.long)
    values, counts = torch.unique_consecutive(indices, return_counts=True)
    run_slots, run_counts = values.tolist(), counts.tolist()
    if min(run_slots, default=-1) >= 0 and len(set(run_slots)) == len(run_slots) and len(set(run_counts)) == 1:
        return StepGroups(indices.numel(), tuple(run_slots), tuple(slot_ids[s] for s in run_slots), run_counts[0])
    slots = sorted({s for s in run_slots if s >= 0})
    if not slots:
        return None
    named: Named = (indices.numel(), tuple(slots), tuple(slot_ids[s] for s in slots))
    with_adapter = [(n, s) for n, s in zip(run_counts, run_slots) if s >= 0]
    if sum(n for n, _ in with_adapter) >= LOOP_ROWS * len(with_adapter):  # long runs: in place
        ends = torch.cumsum(counts, 0).tolist()
        runs = tuple((end - n, end, slots.index(s)) for n, s, end in zip(run_counts, run_slots, ends) if s >= 0)
        return StepGroups(*named, 0, runs=runs)
    return _gathered(indices, named)


def _gathered(indices: torch.Tensor, named: Named) -> StepGroups:
    """Rows gathered by slot: padded to one length, or (long groups) as they are."""
    order = torch.argsort(indices, stable=True)
    order = order[indices[order] >= 0]
    counts = torch.unique_consecutive(indices[order], return_counts=True)[1]
    if order.numel() >= LOOP_ROWS * counts.numel():  # (index_add_ beats a gather back at these sizes)
        ends = torch.cumsum(counts, 0).tolist()
        return StepGroups(
            *named, 0, order, runs=tuple((end - n, end, g) for g, (n, end) in enumerate(zip(counts.tolist(), ends)))
        )
    length = int(counts.max())
    offsets = torch.arange(length)
    real = offsets[None, :] < counts[:, None]  # [G, length]
    cells = (torch.cumsum(counts, 0) - counts)[:, None] + offsets[None, :]
    gather = order[cells.clamp(max=order.numel() - 1)].flatten()
    keep = None if bool(real.all()) else real.to(torch.float32).unsqueeze(-1)
    return StepGroups(*named, length, gather, keep)


@dataclass(frozen=True)
class GroupedWeights:
    """One layer's LoRA weights for a step's groups: A of every slice stacked [G, S r, in]
    (fp32, as vLLM's shrink buffer; used transposed, which MKL multiplies up to 2x faster
    than an [in, r] layout when S r is small), B block-diagonal [G, S r, sum of slices]
    (output dtype)."""

    key: tuple
    a: torch.Tensor
    b: torch.Tensor


def grouped_weights(
    lora_a: tuple[torch.Tensor, ...],
    lora_b: tuple[torch.Tensor, ...],
    groups: StepGroups,
    output_slices: tuple[int, ...],
    dtype: torch.dtype,
) -> GroupedWeights:
    """Arrange vLLM's stacked weights ([max_loras, 1, rank, in], [max_loras, 1, out, rank]) for the groups."""
    index = torch.tensor(groups.slots, dtype=torch.long)
    a = torch.cat([stacked[index, 0] for stacked in lora_a], dim=1).to(torch.float32).contiguous()
    rank = lora_a[0].shape[2]
    b = torch.zeros((len(groups.slots), rank * len(lora_b), sum(output_slices)), dtype=dtype)
    offset = 0
    for i, (stacked, size) in enumerate(zip(lora_b, output_slices)):
        rows = min(size, stacked.shape[2])  # an adapter and the model may pad differently
        b[:, i * rank : (i + 1) * rank, offset : offset + rows] = stacked[index, 0, :rows].transpose(1, 2)
        offset += size
    return GroupedWeights(groups.weights_key(dtype), a, b)


def grouped_lora_linear(
    y: torch.Tensor, x: torch.Tensor, groups: StepGroups, weights: GroupedWeights, scale: float
) -> None:
    """y[row] += (x[row] @ A_slot^T * scale) @ B_slot^T for every row in a group, in place."""
    inputs = x.reshape(-1, x.shape[-1])
    if inputs.dtype != torch.float32:  # vLLM's shrink buffer is fp32
        inputs = inputs.float()
    out = y.view(-1, y.shape[-1])
    if not groups.length:
        if groups.gather is not None:
            inputs = inputs.index_select(0, groups.gather)
        _run_by_run(out, inputs, groups, weights, scale)
    elif groups.gather is None:  # equal runs: x and y viewed as [G, length, ...], y added in place
        count, length = len(groups.slots), groups.length
        shrunk = _shrink(inputs.view(count, length, -1), weights.a, scale, None, y.dtype)
        out.view(count, length, -1).baddbmm_(shrunk, weights.b)
    else:
        _padded(out, inputs, groups, weights, scale)


def _shrink(
    inputs: torch.Tensor, a: torch.Tensor, scale: float, keep: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    """[G, length, S r] = inputs @ A^T * scale, padding cells zeroed, in the output's dtype."""
    shrunk = torch.bmm(inputs, a.transpose(1, 2))
    if scale != 1.0:
        shrunk.mul_(scale)
    if keep is not None:
        shrunk.mul_(keep)  # padding cells add nothing back
    return shrunk.to(dtype)


def _padded(out: torch.Tensor, inputs: torch.Tensor, groups: StepGroups, weights: GroupedWeights, scale: float) -> None:
    """Gathered groups padded to one length, a chunk of groups at a time (its gathered inputs and
    products each under CHUNK_BYTES), the products added at their rows."""
    length, count = groups.length, len(groups.slots)
    row_bytes = max(inputs.shape[1] * inputs.element_size(), out.shape[1] * out.element_size())
    step = max(1, CHUNK_BYTES // (length * row_bytes))
    gather = cast(torch.Tensor, groups.gather)
    for first in range(0, count, step):
        last = min(first + step, count)
        cells = gather[first * length : last * length]
        keep = None if groups.keep is None else groups.keep[first:last]
        rows = inputs.index_select(0, cells).view(last - first, length, -1)
        shrunk = _shrink(rows, weights.a[first:last], scale, keep, out.dtype)
        out.index_add_(0, cells, torch.bmm(shrunk, weights.b[first:last]).view(-1, out.shape[1]))


def _run_by_run(
    out: torch.Tensor, inputs: torch.Tensor, groups: StepGroups, weights: GroupedWeights, scale: float
) -> None:
    """Long runs into y's rows in place; or gathered groups into a buffer added back at their rows."""

    def shrunk(start: int, end: int, group: int) -> torch.Tensor:
        product = inputs[start:end] @ weights.a[group].T
        return (product if scale == 1.0 else product * scale).to(out.dtype)

    if groups.gather is None:
        for start, end, group in groups.runs:
            out[start:end].addmm_(shrunk(start, end, group), weights.b[group])
        return
    products = torch.empty((inputs.shape[0], out.shape[1]), dtype=out.dtype)
    for start, end, group in groups.runs:
        torch.mm(shrunk(start, end, group), weights.b[group], out=products[start:end])
    out.index_add_(0, groups.gather, products)


# --- the per-row ops (logits, embeddings, fallback) -------------------------------------


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


# The signatures of vLLM's torch ops (vllm/lora/ops/torch_ops/lora_ops.py), which these replace.


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    outputs = lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    outputs = lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = 1 if outputs.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    common = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    outputs = lora_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def _per_token(lora_indices_tensor: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    scaling: float,
) -> None:
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    add_inputs: bool = False,
) -> None:
    bgmv_expand(inputs, lora_b_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    b_seq_start_loc: torch.Tensor,
    seq_len_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    batches: int,
    max_seq_length: int,
    token_nums: int,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = False,
) -> None:
    bgmv_expand_slice(
        inputs,
        lora_b_weights,
        output_tensor,
        _per_token(lora_indices_tensor, seq_len_tensor),
        slice_offset,
        slice_size,
        add_inputs,
    )
