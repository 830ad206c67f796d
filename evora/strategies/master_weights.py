"""fp32 master copies of the matrices a full-weight strategy moves (`full_weights.py`, the
contract), and the digests workers compare them by. Split from the contract so that the
contract's protocols, which the strategy registry reads in the CLI, import no torch."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import xxhash

from evora.lora import Tensors
from evora.lora.noise import in_parallel


@dataclass
class MasterWeights:
    """fp32 master copies of the selected matrices (by checkpoint name) and, with Adam, its
    moments; `generation`: how many updates they hold. The engine's weights are re-cast from them."""

    tensors: Tensors
    generation: int = 0
    adam_m: Tensors | None = None
    adam_v: Tensors | None = None
    transposed: frozenset[str] = frozenset()  # names stored [in, out] as the checkpoint has them (GPT-2's Conv1D)
    # weight_decay_anchor=start: the model's own weights (fp32), which decay pulls towards; never
    # snapshotted (a resumed worker reads them from the model again) and constant, so unchecked.
    anchor: Tensors | None = None

    @property
    def device(self) -> torch.device:
        """Where the copies live (the plan's choice: the engine's device when they fit beside it)."""
        return next(iter(self.tensors.values())).device if self.tensors else torch.device("cpu")

    def checksum(self) -> str:
        """A digest of every value's bits, computed where they are (`tensor_digest`): workers
        compare their weights without copying them off the device."""
        named = [
            (name, t) for group in (self.tensors, self.adam_m or {}, self.adam_v or {}) for name, t in group.items()
        ]
        named.sort(key=lambda item: item[0])
        digest = hashlib.blake2b(digest_size=16)
        for (name, _), part in zip(
            named, in_parallel(tensor_digest, [t for _, t in named], self.device, cost=torch.Tensor.numel)
        ):
            digest.update(name.encode())
            digest.update(part)
        return digest.hexdigest()

    def to(self, device: str | torch.device) -> "MasterWeights":
        """The same copies on `device` (itself when they are there already)."""
        if self.device == torch.device(device):
            return self

        def moved(group: Tensors | None) -> Tensors | None:
            return None if group is None else {k: v.to(device) for k, v in group.items()}

        tensors = moved(self.tensors)
        assert tensors is not None
        return MasterWeights(
            tensors, self.generation, moved(self.adam_m), moved(self.adam_v), self.transposed, moved(self.anchor)
        )

    def decay(self, name: str, rate: float) -> torch.Tensor:
        """Decoupled weight decay's step of a matrix: rate * W towards zero, or rate * (W - W_0)
        towards the model's own weights when the copies carry them (weight_decay_anchor=start)."""
        weight = self.tensors[name]
        return rate * (weight if self.anchor is None else weight - self.anchor[name])

    def finite(self) -> bool:
        return all(bool(torch.isfinite(t).all()) for t in self.tensors.values())

    def snapshot(self) -> Tensors:
        """Every tensor on the CPU, flat (moments prefixed), for one safetensors file."""
        out = {k: v.cpu() for k, v in self.tensors.items()}
        for prefix, group in (("adam_m/", self.adam_m), ("adam_v/", self.adam_v)):
            out.update({prefix + k: v.cpu() for k, v in (group or {}).items()})
        return out

    @classmethod
    def from_snapshot(
        cls, tensors: Tensors, generation: int, transposed: frozenset[str] = frozenset()
    ) -> "MasterWeights":
        plain = {k: v.clone() for k, v in tensors.items() if "/" not in k}
        m, v = ({k[len(p) :]: t.clone() for k, t in tensors.items() if k.startswith(p)} for p in ("adam_m/", "adam_v/"))
        return cls(plain, generation, m or None, v or None, transposed)


# Rows of a fingerprint's block: 2**20 values each, weighted by odd int64 constants.
FINGERPRINT_ROW = 1 << 20
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64


def _odd_weights(count: int, device: torch.device, salt: int = 0) -> torch.Tensor:
    """count odd int64 constants (a Weyl sequence: exact integer arithmetic, wrapping)."""
    steps = torch.arange(1, count + 1, dtype=torch.int64, device=device) + salt
    return steps * _GOLDEN | 1


def tensor_digest(tensor: torch.Tensor) -> bytes:
    """A tensor's bits digested where they are: XXH3-64 of its bytes on the CPU (at memory
    speed: CRC-32 took 4-6x the time to read them, bench/real_shapes.py), `fingerprint` on a GPU
    (no copy to the host). Any single changed bit changes either."""
    if tensor.device.type == "cpu":
        return xxhash.xxh3_64_digest(tensor.detach().contiguous().view(torch.uint8).numpy().data)
    return fingerprint(tensor).to_bytes(8, "little", signed=True)


def fingerprint(tensor: torch.Tensor) -> int:
    """sum_i bits_i w_i mod 2**64 over the tensor's 32-bit words, w_i odd: any single changed
    value changes it (w_i is invertible mod 2**64), and integer sums do not depend on the order
    a device reduces in, so every device and thread count gives the same number for the same
    bits. Computed on the tensor's device, a block of rows at a time."""
    words = tensor.detach().contiguous().view(-1).view(torch.int32)
    row = min(FINGERPRINT_ROW, max(1, words.numel()))
    weights = _odd_weights(row, words.device)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    for block, start in enumerate(range(0, words.numel(), row * 16)):
        chunk = words[start : start + row * 16].to(torch.int64)
        full = chunk.numel() // row * row
        sums = (chunk[:full].view(-1, row) * weights).sum(dim=1)
        if full < chunk.numel():
            tail = (chunk[full:] * weights[: chunk.numel() - full]).sum().view(1)
            sums = torch.cat([sums, tail])
        total += (sums * _odd_weights(sums.numel(), words.device, salt=block * 16)).sum()
    return int(total)


def start_copies(tensors: Tensors, transposed: frozenset[str], anchored: bool) -> MasterWeights:
    """fp32 master copies of the checkpoint's matrices, as stored; `anchored`: with a second fp32
    copy that decay pulls towards."""
    copies = {k: v.detach().to(torch.float32).clone() for k, v in tensors.items()}
    anchor = {k: v.clone() for k, v in copies.items()} if anchored else None
    return MasterWeights(copies, transposed=transposed, anchor=anchor)
