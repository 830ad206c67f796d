"""The order and randomness of a chunked GRPO run (`evora/training/grpo.py`): which prompts
each step draws, the sampler that hands them to TRL, and RNG use that leaves the caller's
streams alone."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch.utils.data import Sampler

from evora.lora.keys import noise_key


def prompt_order(n_prompts: int, per_step: int, seed: int, first_step: int, steps: int) -> list[int]:
    """Prompt indices of steps [first_step, first_step + steps), `per_step` each: passes over
    the prompts, each a fresh seeded permutation, so any step's prompts are known up front."""
    order: list[int] = []
    permutations: dict[int, list[int]] = {}
    for position in range(first_step * per_step, (first_step + steps) * per_step):
        epoch, offset = divmod(position, n_prompts)
        if epoch not in permutations:
            permutations[epoch] = list(range(n_prompts))
            random.Random(noise_key(seed, "grpo-order", epoch)).shuffle(permutations[epoch])
        order.append(permutations[epoch][offset])
    return order


class StepSampler(Sampler[int]):
    """Dataset rows in the order TRL's RepeatSampler would give them: per step, each prompt
    `group` times in a row, the step's whole batch `repeats` times (once per micro-batch:
    TRL generates from the first and serves the others from its buffer)."""

    def __init__(self, order: list[int], per_step: int, group: int, repeats: int):
        self.order, self.per_step, self.group, self.repeats = order, per_step, group, repeats

    def __iter__(self) -> Iterator[int]:
        for start in range(0, len(self.order), self.per_step):
            batch = self.order[start : start + self.per_step]
            for _ in range(self.repeats):
                for index in batch:
                    yield from [index] * self.group

    def __len__(self) -> int:
        return len(self.order) * self.group * self.repeats


@contextmanager
def own_rng(device: torch.device) -> Iterator[None]:
    """Run code that reseeds the global RNGs (TRL's set_seed, our per-step seeds) without
    changing the caller's random, numpy and torch streams."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices: list[int] = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
