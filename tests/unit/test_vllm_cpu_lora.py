"""The grouped CPU LoRA products equal vLLM's gather-then-einsum reference."""

import pytest
import torch

from evora.engines.vllm_cpu_lora import bgmv_expand, bgmv_expand_slice, bgmv_shrink, lora_products, sgmv_shrink


def reference(inputs, weights, indices):
    """vLLM's gather-then-einsum, with -1 rows meaning no adapter (as its GPU kernels treat them)."""
    selected = weights[indices]
    if selected.dim() == 4:
        selected = selected.squeeze(1)
    out = torch.einsum("bi, boi -> bo", inputs, selected)
    out[indices < 0] = 0
    return out


@pytest.mark.parametrize(
    "indices",
    [[0, 1, 1, 2, 0, -1], [3, 3, 3, 3, 3, 3], [-1, -1, 2, 2, 0, 1], [-1, -1, -1, -1, -1, -1], [3, -1, 3, -1, 3, 3]],
)
def test_grouped_products_match_the_reference(indices):
    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(6, 10, generator=g)
    weights = torch.randn(4, 1, 7, 10, generator=g)  # [max_loras, 1, out, in] as vLLM stacks them
    idx = torch.tensor(indices)
    assert torch.allclose(
        lora_products(inputs, weights, idx, torch.float32), reference(inputs, weights, idx), atol=1e-5
    )


def test_ops_write_like_vllms():
    g = torch.Generator().manual_seed(1)
    x, a = torch.randn(5, 8, generator=g), torch.randn(3, 1, 4, 8, generator=g)
    idx = torch.tensor([0, 2, 2, 1, 0])
    out = torch.zeros(5, 6)
    bgmv_shrink(x, a, out, idx, scaling=0.5)
    assert torch.allclose(out[:, :4], 0.5 * reference(x, a, idx), atol=1e-5) and torch.all(out[:, 4:] == 0)
    b, y = torch.randn(3, 1, 6, 4, generator=g), torch.ones(5, 6)
    bgmv_expand(out[:, :4].clone(), b, y, idx, add_inputs=True)
    assert torch.allclose(y, 1 + reference(out[:, :4], b, idx), atol=1e-5)
    z = torch.zeros(5, 10)
    bgmv_expand_slice(out[:, :4].clone(), b, z, idx, slice_offset=2, slice_size=6, add_inputs=False)
    assert torch.allclose(z[:, 2:8], reference(out[:, :4], b, idx), atol=1e-5) and torch.all(z[:, :2] == 0)
    per_seq = torch.zeros(5, 4)
    sgmv_shrink(x, a, per_seq, None, torch.tensor([2, 3]), torch.tensor([1, 0]), 2, 3, 5, 1.0)
    assert torch.allclose(per_seq, reference(x, a, torch.tensor([1, 1, 0, 0, 0])), atol=1e-5)


def test_ambiguous_rows_are_refused_not_filled_with_garbage():
    x, w = torch.randn(9, 8), torch.randn(3, 1, 4, 8)
    with pytest.raises(RuntimeError, match="one adapter per batch"):
        lora_products(x, w, torch.tensor([0, 1, 0, 1]), torch.float32)
    # one adapter: every row belongs to it, whatever the index count
    assert torch.allclose(lora_products(x, w, torch.tensor([2, 2]), torch.float32), x @ w[2, 0].T)


def test_no_adapter_rows_never_take_the_last_slot():
    """vLLM's CPU ops index with -1 and so apply the last slot's adapter to base rows."""
    x, w = torch.randn(4, 8), torch.randn(3, 1, 5, 8)
    out = lora_products(x, w, torch.tensor([0, -1, 2, -1]), torch.float32)
    assert torch.all(out[1] == 0) and torch.all(out[3] == 0)
    assert torch.allclose(out[2], x[2] @ w[2, 0].T)


# --- the grouped path (linear layers) ----------------------------------------------------

SLICES = (12, 4, 4)  # a fused qkv layer's output slices
MAX_LORAS, RANK, IN = 5, 3, 10


def stacked_weights(seed):
    """vLLM's stacked LoRA weights of one fused layer: A [max_loras, 1, rank, in], B [max_loras, 1, out, rank]."""
    g = torch.Generator().manual_seed(seed)
    lora_a = tuple(torch.randn(MAX_LORAS, 1, RANK, IN, generator=g) for _ in SLICES)
    lora_b = tuple(torch.randn(MAX_LORAS, 1, size, RANK, generator=g) for size in SLICES)
    return lora_a, lora_b


def dense_reference(x, indices, lora_a, lora_b, scale):
    """Row by row: y[row, slice] = (x[row] @ A[slot]^T * scale) @ B[slot]^T; rows without an adapter stay 0."""
    out = torch.zeros(x.shape[0], sum(SLICES), dtype=torch.float64)
    for row, slot in enumerate(indices.tolist()):
        if slot < 0:
            continue
        offset = 0
        for a, b, size in zip(lora_a, lora_b, SLICES):
            out[row, offset : offset + size] = (x[row].double() @ a[slot, 0].double().T * scale) @ b[slot, 0].double().T
            offset += size
    return out


@pytest.mark.parametrize(
    "indices, viewed",
    [
        ([2, 2, 0, 0, 4, 4], True),  # equal runs, one slot each (decode, uniform population): x viewed as it is
        ([0, 0, 0, 1, 3, 3], False),  # unequal runs
        ([1, 3, 1, 3, 2, 1], False),  # interleaved: rows are gathered by slot
        ([-1, 2, 2, -1, 0, 0], False),  # base-model rows in a mixed batch stay untouched
        ([4, 4, 4, 4, 4, 4], True),  # one adapter
        ([2, 2, 0, 0, 2, 2], False),  # a slot in two runs
    ],
)
def test_grouped_lora_linear_equals_the_row_by_row_products(indices, viewed):
    from evora.engines.vllm_cpu_lora import grouped_lora_linear, grouped_weights, step_groups

    lora_a, lora_b = stacked_weights(0)
    x = torch.randn(len(indices), IN, generator=torch.Generator().manual_seed(1))
    idx = torch.tensor(indices)
    groups = step_groups(idx, [10 + s for s in range(MAX_LORAS)])
    assert (groups.gather is None) == viewed
    assert groups.lora_ids == tuple(10 + s for s in groups.slots)
    y = torch.ones(len(indices), sum(SLICES))
    grouped_lora_linear(y, x, groups, grouped_weights(lora_a, lora_b, groups, SLICES, torch.float32), 0.5)
    assert torch.allclose(y.double() - 1, dense_reference(x, idx, lora_a, lora_b, 0.5), atol=1e-5)


def test_padded_groups_are_multiplied_a_chunk_of_groups_at_a_time(monkeypatch):
    """Groups whose padded buffers would pass CHUNK_BYTES go a few at a time (glibc maps a big
    buffer afresh on every call): the same products, base rows untouched."""
    import evora.engines.vllm_cpu_lora as ops

    lora_a, lora_b = stacked_weights(6)
    idx = torch.tensor([1, 3, 1, 0, 3, 2, -1, 4, 1, 4])
    groups = ops.step_groups(idx, list(range(MAX_LORAS)))
    assert groups.length == 3 and groups.gather is not None and groups.keep is not None  # padded
    x = torch.randn(len(idx), IN, generator=torch.Generator().manual_seed(7))
    weights = ops.grouped_weights(lora_a, lora_b, groups, SLICES, torch.float32)
    calls = []
    bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda *args, **kw: calls.append(args[0].shape[0]) or bmm(*args, **kw))
    monkeypatch.setattr(ops, "CHUNK_BYTES", 3 * 2 * sum(SLICES) * 4)  # two groups' products a chunk
    y = torch.ones(len(idx), sum(SLICES))
    ops.grouped_lora_linear(y, x, groups, weights, 0.5)
    assert calls == [2, 2, 2, 2, 1, 1]  # 5 groups: shrink and expand for 2, 2 and 1
    assert torch.allclose(y.double() - 1, dense_reference(x, idx, lora_a, lora_b, 0.5), atol=1e-5)


def long_rows(shape: str) -> list[int]:
    """Prefill-like: slots 4 and 1 with 70 and 90 rows (and 20 base rows), as runs or interleaved."""
    rows = [4] * 70 + [-1] * 20 + [1] * 90
    if shape == "runs":  # a prompt's tokens are one run; a slot may come back in a later run
        return rows + [4] * 80
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(3)).tolist()
    return [rows[i] for i in order if shape == "interleaved with base rows" or rows[i] >= 0]


@pytest.mark.parametrize("shape", ["runs", "interleaved", "interleaved with base rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_groups_are_multiplied_one_by_one_without_padding(shape, dtype):
    from evora.engines.vllm_cpu_lora import LOOP_ROWS, grouped_lora_linear, grouped_weights, step_groups

    lora_a, lora_b = stacked_weights(4)
    idx = torch.tensor(long_rows(shape))
    groups = step_groups(idx, list(range(MAX_LORAS)))
    assert groups.length == 0 and groups.slots == (1, 4) and min(e - s for s, e, _ in groups.runs) >= LOOP_ROWS
    assert (groups.gather is None) == (shape == "runs")  # runs are multiplied in place, no gather
    assert groups.runs == ((0, 70, 1), (90, 180, 0), (180, 260, 1)) if shape == "runs" else len(groups.runs) == 2
    x = torch.randn(len(idx), IN, generator=torch.Generator().manual_seed(5))
    y = torch.ones(len(idx), sum(SLICES), dtype=dtype)
    weights = grouped_weights(lora_a, lora_b, groups, SLICES, dtype)
    grouped_lora_linear(y, x.to(dtype), groups, weights, 1.0)
    expected = dense_reference(x.to(dtype).float(), idx, lora_a, lora_b, 1.0)
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    assert torch.allclose(y.double() - 1, expected, atol=tolerance, rtol=0.02)


def test_no_adapter_rows_make_no_groups():
    from evora.engines.vllm_cpu_lora import step_groups

    assert step_groups(torch.tensor([-1, -1, -1]), [None] * MAX_LORAS) is None


def test_grouped_weights_pad_to_the_model_and_key_by_the_adapters_in_the_slots():
    """An adapter's B may have fewer rows than the model's slice (padding): the rest stays zero."""
    from evora.engines.vllm_cpu_lora import grouped_weights, step_groups

    lora_a, lora_b = stacked_weights(2)
    short = (lora_b[0][:, :, :10], lora_b[1], lora_b[2])
    groups = step_groups(torch.tensor([3, 3, 1, 1]), [None, 7, None, 8, None])
    weights = grouped_weights(lora_a, short, groups, SLICES, torch.float32)
    assert weights.a.shape == (2, 3 * RANK, IN) and weights.b.shape == (2, 3 * RANK, sum(SLICES))
    assert torch.all(weights.b[:, :RANK, 10:12] == 0) and torch.all(weights.b[:, RANK:, :12] == 0)
    assert weights.key == ((3, 1), (8, 7), torch.float32)
    assert groups.weights_key(torch.bfloat16) != weights.key


def test_adapters_from_memory_must_target_modules_the_model_takes():
    """An in-memory adapter naming a module vLLM has no LoRA layer for fails, as its folder would."""
    from types import SimpleNamespace

    from evora.engines.vllm_patches import _check_modules

    adapters = SimpleNamespace(
        packed_modules_mapping={"qkv_proj": ["q_proj", "k_proj", "v_proj"]},
        supported_lora_modules=["qkv_proj", "o_proj"],
    )
    manager = SimpleNamespace(_adapter_manager=adapters)
    helper = SimpleNamespace(modules_to_save=None)
    good = {f"base_model.model.model.layers.0.self_attn.{m}.lora_A.weight": None for m in ("q_proj", "o_proj")}
    _check_modules(manager, good, None, "ok#1", helper, None)
    bad = {**good, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight": None}
    with pytest.raises(
        ValueError, match=r"adapter bad#2: expected target modules in .*got \['model.layers.0.mlp.down_proj'\]"
    ):
        _check_modules(manager, bad, None, "bad#2", helper, None)
