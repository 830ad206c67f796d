"""The base-weight extension (evora/engines/vllm_weights.py) against vLLM's own layers at
tensor-parallel sizes above 1: vLLM's `QKVParallelLinear` built as rank r of a group of n (its
tensor-parallel rank and size are read from vLLM's parallel state, set here for the layer's
construction), and its own `weight_loader` keeping each rank's part of a checkpoint matrix: each
rank reading only its block from the file the engine writes keeps what vLLM's loader keeps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

linear = pytest.importorskip("vllm.model_executor.layers.linear")
parameter = pytest.importorskip("vllm.model_executor.parameter")

from evora.engines.vllm_weights import BaseWeightsExtension, whole_matrices  # noqa: E402

HIDDEN, HEAD = 1536, 128


def as_rank(monkeypatch, rank: int, size: int) -> None:
    """vLLM's layers built from here on are rank `rank` of `size`."""
    for module in (linear, parameter):
        for name, value in (("get_tensor_model_parallel_world_size", size), ("get_tensor_model_parallel_rank", rank)):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, lambda value=value: value)


def qkv_as_rank(monkeypatch, rank: int, size: int, heads: int, kv_heads: int) -> torch.nn.Module:
    as_rank(monkeypatch, rank, size)
    return linear.QKVParallelLinear(HIDDEN, HEAD, heads, kv_heads, bias=False, params_dtype=torch.float32)


class Model(torch.nn.Module):
    """A decoder layer's linear layers where vLLM's model classes put them."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, qkv: torch.nn.Module, **mlp: torch.nn.Module):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.layers[0].self_attn = torch.nn.Module()
        self.layers[0].self_attn.qkv_proj = qkv
        self.layers[0].mlp = torch.nn.Module()
        for name, layer in mlp.items():
            setattr(self.layers[0].mlp, name, layer)


def extension(model: torch.nn.Module, tp: int) -> BaseWeightsExtension:
    worker = BaseWeightsExtension()
    worker.vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=tp))
    worker.model_runner = SimpleNamespace(model=model)
    return worker


def set_through_a_file(worker: BaseWeightsExtension, weights: dict, folder) -> None:
    """What `VLLMEngine.set_base_weights` does at tensor-parallel size > 1."""
    path = str(folder / "weights.safetensors")
    save_file(weights, path)
    worker.evora_set_base_weights_from(path)


@pytest.mark.parametrize(
    "heads,kv_heads,size",
    [(12, 2, 2), (12, 2, 4), (32, 4, 8)],
    ids=["qwen2.5-1.5b-tp2", "qwen2.5-1.5b-tp4", "qwen3-30b-a3b-tp8"],
)
def test_checkpoint_k_and_v_reach_every_rank_when_ranks_outnumber_kv_heads(
    monkeypatch, tmp_path, heads, kv_heads, size
):
    """With more ranks than KV heads each head is replicated over ranks, and vLLM's
    `output_sizes` count the replicas' rows (Qwen2.5-1.5B at 4 ranks: 4 heads' rows, where the
    checkpoint holds 2). Qwen2.5-7B's 28 query heads do not split over 8 ranks in vLLM at all."""
    rows = {"q": heads * HEAD, "k": kv_heads * HEAD, "v": kv_heads * HEAD}
    # Each row holds its own index, so which rows a rank kept can be read back.
    checkpoint = {
        p: torch.arange(n, dtype=torch.float32)[:, None].expand(n, HIDDEN).contiguous() for p, n in rows.items()
    }
    for rank in range(size):
        qkv = qkv_as_rank(monkeypatch, rank, size, heads, kv_heads)
        weights = {f"layers.0.self_attn.{p}_proj.weight": m for p, m in checkpoint.items()}
        set_through_a_file(extension(Model(qkv), size), weights, tmp_path)
        kv_here = max(1, kv_heads // size)
        kv_head = rank * kv_heads // size  # the first KV head this rank holds
        q_rows, k_rows = heads * HEAD // size, kv_here * HEAD
        kept = qkv.weight.data[:, 0]
        assert torch.equal(kept[:q_rows], torch.arange(rank * q_rows, (rank + 1) * q_rows, dtype=torch.float32))
        expected_kv = torch.arange(kv_head * HEAD, kv_head * HEAD + k_rows, dtype=torch.float32)
        assert torch.equal(kept[q_rows : q_rows + k_rows], expected_kv), rank
        assert torch.equal(kept[q_rows + k_rows :], expected_kv), rank


SHARDS = {  # (weight_loader shard id, checkpoint module) of each layer's matrices
    "QKVParallelLinear": [("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj")],
    "MergedColumnParallelLinear": [(0, "mlp.gate_proj"), (1, "mlp.up_proj")],
    "RowParallelLinear": [(None, "mlp.down_proj")],
}


def rank_layers(monkeypatch, rank: int, size: int, heads: int, kv_heads: int, inter: int) -> tuple:
    """A decoder layer's qkv, gate/up and down projections as rank `rank` of `size` builds them."""
    qkv = qkv_as_rank(monkeypatch, rank, size, heads, kv_heads)
    gate_up = linear.MergedColumnParallelLinear(HIDDEN, [inter, inter], bias=False, params_dtype=torch.float32)
    down = linear.RowParallelLinear(inter, HIDDEN, bias=False, params_dtype=torch.float32)
    return qkv, gate_up, down


@pytest.mark.parametrize(
    "heads,kv_heads,size", [(12, 2, 4), (12, 2, 2), (32, 4, 8)], ids=["replicated", "split", "tp8"]
)
def test_each_ranks_block_is_what_vllms_loader_keeps_and_read_back_they_are_the_checkpoint(
    monkeypatch, tmp_path, heads, kv_heads, size
):
    """Each rank, reading its blocks from the file, keeps bitwise what vLLM's own weight
    loaders keep of the whole matrices; read back as each rank's part and put together: the
    checkpoint's q, k, v, gate, up and down matrices, whatever the split."""
    inter = 4 * size * 8
    shapes = {
        "self_attn.q_proj": (heads * HEAD, HIDDEN),
        "self_attn.k_proj": (kv_heads * HEAD, HIDDEN),
        "self_attn.v_proj": (kv_heads * HEAD, HIDDEN),
        "mlp.gate_proj": (inter, HIDDEN),
        "mlp.up_proj": (inter, HIDDEN),
        "mlp.down_proj": (HIDDEN, inter),
    }
    generator = torch.Generator().manual_seed(3)
    checkpoint = {f"layers.0.{m}.weight": torch.randn(shape, generator=generator) for m, shape in shapes.items()}
    ranks = []
    for rank in range(size):
        layers = [rank_layers(monkeypatch, rank, size, heads, kv_heads, inter) for _ in range(2)]
        for layer, loaded in zip(*layers):  # the reference: vLLM's loaders given every whole matrix
            for shard_id, part in SHARDS[type(layer).__name__]:
                matrix = checkpoint[f"layers.0.{part}.weight"]
                layer.weight.weight_loader(layer.weight, matrix, *([] if shard_id is None else [shard_id]))
        qkv, gate_up, down = layers[1]
        worker = extension(Model(qkv, gate_up_proj=gate_up, down_proj=down), size)
        set_through_a_file(worker, checkpoint, tmp_path)
        assert all(torch.equal(ours.weight, theirs.weight) for ours, theirs in zip(layers[1], layers[0]))
        ranks.append(worker.evora_base_weights(list(checkpoint)))
    whole = whole_matrices(ranks)
    assert whole.keys() == checkpoint.keys()
    assert all(torch.equal(whole[name], matrix) for name, matrix in checkpoint.items())
