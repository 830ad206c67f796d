"""Seeded Gaussian noise, a pure function of (run seed, generation, member, tensor name).

Every tensor gets its own generator, so tensors of equal shape never share noise, and
any worker rebuilds exactly the candidate the driver means.
"""

from __future__ import annotations

import hashlib

import torch


def noise_key(*parts: object) -> int:
    """A 63-bit generator seed from the parts' text (stable across processes and machines)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def gaussian(key: int, shape: tuple[int, ...]) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(key)
    return torch.randn(shape, generator=generator, dtype=torch.float32)


def gaussian_into(key: int, out: torch.Tensor) -> None:
    """`gaussian(key, out.shape)` written into `out` (contiguous fp32 on the CPU): the same values,
    without a tensor of their own."""
    torch.randn(out.shape, generator=torch.Generator(device="cpu").manual_seed(key), out=out)


def member_noise(run_seed: int, generation: int, member: int, tensor_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    return gaussian(noise_key(run_seed, "noise", generation, member, tensor_name), shape)
