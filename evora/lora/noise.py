"""Seeded Gaussian noise, a pure function of (run seed, generation, member, tensor name).

Every tensor gets its own generator, so tensors of equal shape never share noise, and any
worker rebuilds exactly the candidate the driver means.

Where it is drawn (docs/architecture.md, "Determinism rules"): on the device of the tensors it
perturbs (a LoRA's on the engine's GPU under hardware.noise_device=auto, for strategies that
draw only on the workers; the CPU otherwise). A CUDA tensor's stream comes from a CUDA
generator (Philox), in milliseconds; a CPU tensor's from a CPU generator (mt19937), and since
each tensor has a stream of its own, many tensors are drawn at once over the process's threads
(`in_parallel`), bitwise what one thread draws. The two devices draw different numbers from the
same key: determinism is promised per device class (the CPU, or one GPU model).

A CPU stream may also be drawn in pieces (`Stream`): a contiguous fp32 draw of n >= 16 values
consumes the generator one value at a time and transforms blocks of 16, so pieces of a multiple
of 16 values (the last one at least 16) are bitwise one whole draw (tests/unit/test_noise.py).
Pieces keep a big matrix's noise in the cache while it is used, and no full-size buffer exists.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, TypeVar

import torch

from evora.lora.keys import noise_key

T = TypeVar("T")
U = TypeVar("U")

# Values a CPU piece holds: a multiple of 16 (see the module), 128 KiB of fp32 that stay in a
# core's L2 while the piece is drawn and used, and under torch's grain size (32,768 values), so
# that ops on a piece run on the thread that calls them: threads drawing different tensors then
# never start OpenMP teams of their own, whose spinning took the cores from the others' draws
# (perturb_into over 2 threads: 1.07x the noise's own time, against 1.45x at 65,536).
PIECE = 32752


def generator(key: int, device: str | torch.device = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(key)


def gaussian(key: int, shape: tuple[int, ...], device: str | torch.device = "cpu") -> torch.Tensor:
    """N(0, I) fp32 of `shape`, drawn on `device` from the key's own generator."""
    return torch.randn(shape, generator=generator(key, device), dtype=torch.float32, device=device)


def gaussian_into(key: int, out: torch.Tensor) -> None:
    """`gaussian(key, out.shape, out.device)` written into `out` (contiguous fp32): the same
    values, without a tensor of their own."""
    torch.randn(out.shape, generator=generator(key, out.device), out=out)


def noise_generation(generation: int, reuse: int) -> int:
    """The generation whose draws `generation` perturbs with under noise reuse (EGGROLL's: the
    same perturbations for `reuse` generations in a row, the first of each run drawing them)."""
    return generation - generation % reuse


def member_noise(
    run_seed: int,
    generation: int,
    member: int,
    tensor_name: str,
    shape: tuple[int, ...],
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    return gaussian(noise_key(run_seed, "noise", generation, member, tensor_name), shape, device)


# --- many tensors at once --------------------------------------------------------------------

THREAD_PREFIX = "evora-noise"
RUNS_PER_THREAD = 4  # runs of items per thread: few tasks, yet unequal runs still balance
_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (process id, threads, executor)


def _executor(threads: int) -> ThreadPoolExecutor:
    """The process's noise threads (a forked child starts its own: its parent's are not its)."""
    global _pool
    if _pool is None or _pool[:2] != (os.getpid(), threads):
        _pool = (os.getpid(), threads, ThreadPoolExecutor(max_workers=threads, thread_name_prefix=THREAD_PREFIX))
    return _pool[2]


def runs_by_cost(costs: Sequence[float], runs: int) -> list[list[int]]:
    """Item indices in at most `runs` runs, costliest items first: each run is filled to a share
    of what is left (its cost over the runs left), so an item of a share or more is a run of its
    own and cheaper ones share runs. Threads that take the runs in this order finish together
    (longest processing time first): one MLP matrix costs six attention matrices, and runs of
    neighbours left one of two threads idle for a fifth of a candidate's draw."""
    order = sorted(range(len(costs)), key=lambda i: -costs[i])  # stable: equal costs keep their order
    left, runs_left = float(sum(costs)), max(1, runs)
    grouped: list[list[int]] = []
    held = share = 0.0
    for i in order:
        if not grouped or (held >= share and runs_left > 0):
            share, runs_left, held = left / max(1, runs_left), runs_left - 1, 0.0
            grouped.append([])
        grouped[-1].append(i)
        held += costs[i]
        left -= costs[i]
    return grouped


def in_parallel(
    work: Callable[[T], U],
    items: Sequence[T],
    device: str | torch.device = "cpu",
    cost: Callable[[T], float] | None = None,
) -> list[U]:
    """`[work(item) for item in items]`, in order. On the CPU the items run at once over the
    process's threads (torch.get_num_threads()), costliest first (`cost`, e.g. an item's values;
    equal when not given): each item's noise has its own generator, so the results are bitwise
    those of one thread. Elsewhere the device parallelises each op."""
    threads = torch.get_num_threads()
    # From one of the noise threads itself, serially: waiting on the pool there could deadlock it.
    nested = threading.current_thread().name.startswith(THREAD_PREFIX)
    if torch.device(device).type != "cpu" or threads <= 1 or len(items) <= 1 or nested:
        return [work(item) for item in items]
    # A few runs a thread: a task per item costs more than a small draw.
    costs = [float(cost(item)) if cost else 1.0 for item in items]
    runs = runs_by_cost(costs, min(len(items), RUNS_PER_THREAD * threads))
    done = _executor(threads).map(lambda run: [(i, work(items[i])) for i in run], runs)
    results: list[U | None] = [None] * len(items)
    for run in done:
        for i, result in run:
            results[i] = result
    return results  # type: ignore[return-value]  # every index is set once


def named_values(item: tuple[str, torch.Tensor]) -> int:
    """A named tensor's cost to draw noise for (in_parallel's `cost`): its values."""
    return item[1].numel()


def perturbed_adapter(
    center: dict[str, torch.Tensor],
    run_seed: int,
    generation: int,
    member: int,
    scale: Callable[[str], float | torch.Tensor],
) -> dict[str, torch.Tensor]:
    """center + scale(name) * the member's noise, per tensor, drawn on the center's device (on
    the CPU, tensors at once over the process's threads): a candidate of the strategies whose
    perturbations are one Gaussian draw per member (ES, RandOpt; SNES and PGPE, whose scale is
    a tensor of sigmas)."""

    def perturbed(item: tuple[str, torch.Tensor]) -> torch.Tensor:
        name, value = item
        noise = member_noise(run_seed, generation, member, name, tuple(value.shape), value.device)
        return value + scale(name) * noise

    return dict(zip(center, in_parallel(perturbed, list(center.items()), device_of(center), cost=named_values)))


def device_of(tensors: dict[str, torch.Tensor]) -> torch.device:
    """Where a set of tensors lives (the CPU for none): where their noise is drawn."""
    return next(iter(tensors.values())).device if tensors else torch.device("cpu")


def tensors_to(tensors: dict[str, torch.Tensor], device: str | torch.device) -> dict[str, torch.Tensor]:
    """The tensors on `device` (themselves where they already are)."""
    return {name: value.to(device) for name, value in tensors.items()}


@dataclass(frozen=True)
class DenseNoise:
    """One matrix's dense perturbation, by seed: its weight becomes master + scale * eps, eps the
    key's N(0, I) in the master's shape, drawn on the master's device (`perturb_into`)."""

    name: str  # the matrix's checkpoint name
    key: int  # its generator's seed (noise_key)
    scale: float


# --- a CPU stream in pieces ------------------------------------------------------------------


def pieces(numel: int, piece: int = PIECE) -> Iterator[tuple[int, int]]:
    """(start, stop) of a flat tensor's pieces: `piece` values each, the last one at least 16
    (a shorter tail joins the piece before it), so that they draw bitwise one whole draw."""
    start = 0
    while start < numel:
        stop = min(start + piece, numel)
        if 0 < numel - stop < 16:
            stop = numel
        yield start, stop
        start = stop


class Stream:
    """One key's N(0, 1) values on the CPU, drawn in order, a piece at a time."""

    def __init__(self, key: int):
        self.generator = generator(key)

    def next_into(self, out: torch.Tensor, std: float = 1.0) -> torch.Tensor:
        """The next values into `out`, times `std` (>= 0) as they are made: normal_'s kernel
        multiplies each by std once, rounded in fp32, bitwise `(N(0, 1) values) * std`."""
        return out.normal_(0.0, std, generator=self.generator)


def perturb_into(target: torch.Tensor, base: torch.Tensor, key: int, scale: float) -> None:
    """target <- base + scale * eps (eps: the key's noise in base's shape, drawn on base's
    device), cast to target's dtype as it is written; `base` fp32, both contiguous. On the CPU
    bitwise `(gaussian(key, shape) * scale + base).to(dtype)`, each value rounded in fp32 after
    the product and after the sum, piece by piece (no full-size noise tensor). On a GPU the
    product and the sum in one kernel (a fused multiply-add: one pass fewer over the matrix),
    the same on every GPU of a class, and the same for every caller (`perturbed_on` included)."""
    if base.device.type != "cpu":
        torch.add(base, gaussian(key, tuple(base.shape), base.device), alpha=scale, out=target)
        return
    if base.numel() < 16:
        torch.add(gaussian(key, tuple(base.shape)).mul_(scale), base, out=target)
        return
    flat_base, flat_target, stream = base.view(-1), target.view(-1), Stream(key)
    buffer = torch.empty(min(PIECE + 15, base.numel()), dtype=torch.float32)
    # |scale| * eps drawn in one pass, then added, or subtracted for a negative scale (base - x
    # is base + (-x) exactly); a zero scale keeps the product's signed zeros.
    write = torch.sub if scale < 0 else torch.add
    for start, stop in pieces(base.numel(), PIECE):
        eps = (
            stream.next_into(buffer[: stop - start], abs(scale))
            if scale
            else stream.next_into(buffer[: stop - start]).mul_(scale)
        )
        # The sum in fp32, cast as it is written: bitwise the sum, then `.to(dtype)`.
        write(flat_base[start:stop], eps, out=flat_target[start:stop])


def perturbed_on(base: torch.Tensor, term: DenseNoise) -> torch.Tensor:
    """base + scale * eps in fp32 on base's device: the noise drawn where the master copies are."""
    out = torch.empty_like(base)
    perturb_into(out, base, term.key, term.scale)
    return out


def weighted_sum(
    terms: Sequence[tuple[int, float]], shape: tuple[int, ...], device: str | torch.device = "cpu"
) -> torch.Tensor:
    """sum_m c_m eps_m over (key, c_m) terms, fp32, in the terms' order (acc += c_m eps_m, each
    term rounded as `torch.add_(alpha=c_m)` rounds it); drawn on `device`. On the CPU piece by
    piece: every term's stream advances together, so the noise never exists at full size."""
    total = torch.zeros(shape, dtype=torch.float32, device=device)
    numel = total.numel()
    if torch.device(device).type != "cpu" or numel < 16:
        for key, coefficient in terms:
            total.add_(gaussian(key, shape, device), alpha=coefficient)
        return total
    streams = [(Stream(key), coefficient) for key, coefficient in terms]
    flat = total.view(-1)
    buffer = torch.empty(min(PIECE + 15, numel), dtype=torch.float32)
    for start, stop in pieces(numel, PIECE):
        acc = flat[start:stop]
        for stream, coefficient in streams:
            acc.add_(stream.next_into(buffer[: stop - start]), alpha=coefficient)
    return total
