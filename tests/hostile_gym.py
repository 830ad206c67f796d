"""A reasoning-gym dataset of our own (a task.plugins module) whose score_answer hangs, segfaults,
exits its process or raises on the problems it picks (4 sums in 10), and scores the rest as reasoning-gym's
default does: task=reasoning_gym must run it in reward processes, count each failure and go on."""

from __future__ import annotations

import ctypes
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Optional

from reasoning_gym.dataset import ProceduralDataset
from reasoning_gym.factory import DATASETS, register_dataset

NAME = "hostile_sums"


@dataclass
class HostileSumsConfig:
    max_value: int = 9
    seed: Optional[int] = None
    size: int = 500

    def validate(self) -> None:
        assert self.max_value >= 1, "max_value must be >= 1"


def hangs() -> float:
    while True:
        time.sleep(3600)


def segfaults() -> float:
    return float(ctypes.string_at(0))  # reads address 0: SIGSEGV


def exits() -> float:
    os._exit(1)


def raises() -> float:
    raise ValueError("a scorer bug")


BEHAVIOURS = {1: hangs, 2: segfaults, 3: exits, 4: raises}  # by (a + b) % 10: 6 in 10 are fair


class HostileSums(ProceduralDataset):
    def __init__(self, config: HostileSumsConfig):
        # The seed evora gives (create_dataset(seed=...)): without it ProceduralDataset draws one of
        # its own, and the held-out problems would differ from process to process.
        super().__init__(config=config, seed=config.seed, size=config.size)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        draw = random.Random(self.seed + idx)
        a, b = draw.randint(0, self.config.max_value), draw.randint(0, self.config.max_value)
        return {"question": f"{a}+{b}=", "answer": str(a + b), "metadata": {"a": a, "b": b}}

    def score_answer(self, answer: Optional[str], entry: dict[str, Any]) -> float:
        behaviour = BEHAVIOURS.get(int(entry["answer"]) % 10)
        return behaviour() if behaviour is not None else super().score_answer(answer, entry)


if NAME not in DATASETS:  # imported again in every reward process
    register_dataset(NAME, HostileSums, HostileSumsConfig)
