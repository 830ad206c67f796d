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
