"""Base weights of a running vLLM engine, by checkpoint name: the worker extension behind
`VLLMEngine.base_weights` / `set_base_weights` (engines/base.py), the way RLHF frameworks sync
weights into vLLM (`worker_extension_cls` + `collective_rpc`).

vLLM fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (the model class's
`packed_modules_mapping`), wraps LoRA-enabled layers (`base_layer`), shards layers over
tensor-parallel ranks, and on CPU packs each linear layer's weight for oneDNN and drops the
dense tensor. This extension maps a checkpoint name to (layer, shard) and:

- GPU, tensor-parallel size 1: writes the shard's rows of the dense weight in place;
- GPU, tensor-parallel size > 1: the engine writes the matrices once to a safetensors file
  on tmpfs, and each rank reads only its block of each (`RankSlot`: where vLLM's weight
  loaders put it) and writes it in place; read back, each rank gives its part (`RankPart`)
  and the engine puts them together;
- CPU: keeps a dense copy of each touched layer (from the checkpoint, then as set), writes
  the rows, and re-packs the layer with vLLM's own `dispatch_cpu_unquantized_gemm`.

Written for vLLM 0.32 (`WRITTEN_FOR`); `check_vllm` fails in one line when a vLLM without
the internals it uses is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from evora.engines.vllm_patches import WRITTEN_FOR
from evora.lora.noise import DenseNoise, in_parallel, perturb_into, perturbed_on

if TYPE_CHECKING:
    from vllm.config import VllmConfig

EXTENSION = "evora.engines.vllm_weights.BaseWeightsExtension"


def check_vllm() -> None:
    """The vLLM internals the extension relies on are there."""
    import vllm
    from vllm.model_executor.layers import utils

    if not callable(getattr(utils, "dispatch_cpu_unquantized_gemm", None)):
        raise RuntimeError(
            f"engine=vllm: evora's base-weight extension was written for vLLM {WRITTEN_FOR}.x; vLLM "
            f"{vllm.__version__} has no model_executor.layers.utils.dispatch_cpu_unquantized_gemm"
        )


class BaseWeightsExtension:
    """Mixed into vLLM's worker class by `worker_extension_cls`; called via `collective_rpc`."""

    # The vLLM worker's, which this class is mixed into (annotations only: no class attributes).
    vllm_config: VllmConfig
    model_runner: Any
    # CPU: the dense weight of each touched layer, by module path (_evora_dense).
    _evora_dense_copies: dict[str, torch.Tensor]

    def evora_set_base_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Tensor-parallel size 1 (the engine's process: `weights` pass by reference)."""
        touched: dict[str, Any] = {}
        for name, value in weights.items():
            layer, fused, offset, size, _ = self._evora_locate(name)
            if tuple(value.shape) != (size, layer.input_size):
                raise ValueError(f"{name}: shape {tuple(value.shape)}, the model has {(size, layer.input_size)}")
            dense = self._evora_dense(layer, fused)
            dense[offset : offset + size].copy_(value)  # cast (and moved) as it is written
            touched[fused] = layer
        if _on_cpu():
            for fused, layer in touched.items():
                _repack(layer, self._evora_dense_copies[fused])

    def evora_set_base_weights_from(self, path: str) -> None:
        """Tensor-parallel size > 1: each matrix of the safetensors file at `path` (whole, by
        checkpoint name), of which this rank reads only its own block, in place."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as matrices:
            for name in matrices.keys():
                layer, _, _, size, shard_id = self._evora_locate(name)
                matrix = matrices.get_slice(name)
                if tuple(matrix.get_shape()) != (size, layer.input_size):
                    raise ValueError(
                        f"{name}: shape {tuple(matrix.get_shape())}, the model has {(size, layer.input_size)}"
                    )
                slot = rank_slot(layer, shard_id)
                block = slot.block_of(matrix, size, layer.input_size)
                slot.rows_in(layer.weight.data).copy_(block)  # cast (and moved) as it is written

    def evora_perturb_base(self, master: Mapping[str, torch.Tensor], noise: Sequence[DenseNoise]) -> None:
        """Each term's rows <- master + scale * eps (`Engine.perturb_base`), drawn and written
        in place on the device, matrices at once over the threads on a CPU. Tensor-parallel
        size 1 only (`VLLMEngine.perturb_base`): `master` is the worker's own, passed by reference."""
        touched: dict[str, Any] = {}

        def perturb(term: DenseNoise) -> None:
            layer, fused, offset, size, _ = self._evora_locate(term.name)
            base = master[term.name]
            if tuple(base.shape) != (size, layer.input_size):
                raise ValueError(f"{term.name}: shape {tuple(base.shape)}, the model has {(size, layer.input_size)}")
            rows = self._evora_dense(layer, fused)[offset : offset + size]
            if base.device != rows.device:  # master copies on the host: noise drawn there
                rows.copy_(perturbed_on(base, term))
            else:
                perturb_into(rows, base, term.key, term.scale)
            touched[fused] = layer

        for term in noise:  # the dense copies of a CPU engine are made one at a time, before the threads
            self._evora_dense(*self._evora_locate(term.name)[:2])
        device = next(iter(master.values())).device if master else "cpu"
        in_parallel(perturb, list(noise), device, cost=lambda term: master[term.name].numel())
        if _on_cpu():
            for fused, layer in touched.items():
                _repack(layer, self._evora_dense_copies[fused])

    def evora_base_weights(self, names: Sequence[str]) -> dict[str, Any]:
        """Each named matrix, whole; at tensor-parallel size > 1 this rank's part of it (a
        `RankPart`: `whole_matrices` puts the ranks' parts together)."""
        out: dict[str, Any] = {}
        for name in names:
            layer, fused, offset, size, shard_id = self._evora_locate(name)
            if self._evora_tp() > 1:
                out[name] = rank_part(layer, shard_id)
            else:
                out[name] = self._evora_dense(layer, fused)[offset : offset + size].detach().cpu().clone()
        return out

    # --- pieces -------------------------------------------------------------------------

    def _evora_tp(self) -> int:
        return self.vllm_config.parallel_config.tensor_parallel_size

    def _evora_locate(self, name: str) -> tuple[Any, str, int, int, Any]:
        """(layer, its module path, first row, rows, weight_loader shard id) of a checkpoint weight."""
        model = self.model_runner.model
        module, _, attribute = name.rpartition(".")
        if attribute != "weight":
            raise KeyError(f"{name}: only linear layers' weights can be set")
        parent, _, leaf = module.rpartition(".")
        for fused, parts in getattr(model, "packed_modules_mapping", {}).items():
            if leaf in parts and parts != [leaf]:  # [leaf]: the checkpoint stores it fused (Phi-3's qkv_proj)
                path = f"{parent}.{fused}"
                layer = _base_layer(model, path, name)
                index = parts.index(leaf)
                sizes = checkpoint_rows(layer)
                shard_id = ("q", "k", "v")[index] if fused == "qkv_proj" else index
                return layer, path, sum(sizes[:index]), sizes[index], shard_id
        layer = _base_layer(model, module, name)
        return layer, module, 0, layer.output_size, None

    def _evora_dense(self, layer: Any, fused: str) -> torch.Tensor:
        """The layer's full weight: the parameter itself where vLLM keeps it, else a dense copy."""
        if not _on_cpu():
            return layer.weight.data
        copies = self.__dict__.setdefault("_evora_dense_copies", {})
        if fused not in copies:
            copies[fused] = self._evora_from_checkpoint(layer, fused)
        return copies[fused]

    def _evora_from_checkpoint(self, layer: Any, fused: str) -> torch.Tensor:
        """A packed CPU layer's dense weight, as vLLM loaded it: the checkpoint's parts, stacked."""
        from evora.lora.base_weights import read_weights

        model = self.model_runner.model
        parent, _, leaf = fused.rpartition(".")
        parts = getattr(model, "packed_modules_mapping", {}).get(leaf, [leaf])
        names = [f"{parent}.{part}.weight" for part in parts]
        config = self.vllm_config.model_config
        tensors = read_weights(config.model, names, config.revision)
        return torch.cat([tensors[n] for n in names]).to(config.dtype)


def checkpoint_rows(layer: Any) -> list[int]:
    """Rows of each checkpoint matrix a fused layer holds (at tensor-parallel size 1, also where
    each starts in its weight). vLLM's `output_sizes` count each rank's k/v heads times the
    ranks: with more ranks than KV heads, heads replicated over ranks counted again."""
    from vllm.model_executor.layers.linear import QKVParallelLinear

    if isinstance(layer, QKVParallelLinear):
        kv = layer.total_num_kv_heads
        return [layer.total_num_heads * layer.head_size, kv * layer.head_size, kv * layer.v_head_size]
    return list(layer.output_sizes)


@dataclass(frozen=True)
class RankSlot:
    """Where a rank keeps its part of a checkpoint matrix: rows `start` to `start + rows` of its
    weight hold block `index` of the matrix's `blocks` equal blocks along `dim` (1: a
    row-parallel layer's columns, the whole weight)."""

    start: int
    rows: int
    index: int
    blocks: int
    dim: int

    def rows_in(self, weight: torch.Tensor) -> torch.Tensor:
        return weight[self.start : self.start + self.rows]

    def block_of(self, matrix: Any, rows: int, columns: int) -> torch.Tensor:
        """This rank's block of `matrix` ([rows, columns]; a tensor, or a safetensors slice,
        of which only the block is read)."""
        if self.dim == 0:
            step = rows // self.blocks
            return matrix[self.index * step : (self.index + 1) * step, :]
        step = columns // self.blocks
        return matrix[:, self.index * step : (self.index + 1) * step]


def rank_slot(layer: Any, shard_id: Any) -> RankSlot:
    """Where this rank keeps the checkpoint matrix `shard_id` names in `layer` (None: the
    layer's own matrix), as vLLM's weight loaders put it."""
    from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear

    rank, ranks, local_rows = layer.tp_rank, layer.tp_size, layer.weight.shape[0]
    if isinstance(layer, RowParallelLinear):
        return RankSlot(0, local_rows, rank, ranks, 1)
    if shard_id is None:
        return RankSlot(0, local_rows, rank, ranks, 0)
    if isinstance(layer, QKVParallelLinear):
        q, kv = layer.num_heads * layer.head_size, layer.num_kv_heads * layer.head_size
        start, rows = {"q": (0, q), "k": (q, kv), "v": (q + kv, layer.num_kv_heads * layer.v_head_size)}[shard_id]
        if shard_id == "q":
            return RankSlot(start, rows, rank, ranks, 0)
        replicas = layer.num_kv_head_replicas
        return RankSlot(start, rows, rank // replicas, layer.total_num_kv_heads // layer.num_kv_heads, 0)
    local = [size // ranks for size in layer.output_sizes]  # gate/up and the like: each split evenly
    return RankSlot(sum(local[:shard_id]), local[shard_id], rank, ranks, 0)


@dataclass(frozen=True)
class RankPart:
    """A tensor-parallel rank's part of a checkpoint matrix, and where it sits in the matrix
    (`slot`: block `index` of `blocks` along `dim`; ranks that replicate a KV head hold the same block)."""

    tensor: torch.Tensor
    slot: RankSlot


def rank_part(layer: Any, shard_id: Any) -> RankPart:
    """This rank's part of the checkpoint matrix `shard_id` names in `layer`, read back."""
    slot = rank_slot(layer, shard_id)
    return RankPart(slot.rows_in(layer.weight.data).detach().cpu().clone(), slot)


def whole_matrices(ranks: Sequence[Mapping[str, RankPart]]) -> dict[str, torch.Tensor]:
    """Every rank's parts of each matrix, put together."""
    out = {}
    for name in ranks[0]:
        blocks = {part.slot.index: part for part in (parts[name] for parts in ranks)}
        first = blocks[0].slot
        out[name] = torch.cat([blocks[i].tensor for i in range(first.blocks)], dim=first.dim)
    return out


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _base_layer(model: Any, path: str, name: str) -> Any:
    try:
        module = model.get_submodule(path)
    except AttributeError:
        raise KeyError(f"{name}: vLLM's model has no layer {path}") from None
    return getattr(module, "base_layer", module)  # LoRA-enabled layers wrap the linear layer


def _repack(layer: Any, dense: torch.Tensor) -> None:
    """Give a CPU layer its new weight: vLLM's own packing, from a copy of the dense weight."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer.weight = torch.nn.Parameter(dense.clone(), requires_grad=False)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
