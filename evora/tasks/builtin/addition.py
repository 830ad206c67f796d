"""The quickstart task: "a+b=" -> the sum, and nothing after it.

Pairs a, b in 0..99. A fixed eighth of all pairs is held out of training, of the tiny
model's pretraining (`evora.models.build_tiny`) and of every run, whatever the seed, so
held-out rewards of different runs compare; the selection split comes from that pool
too, disjoint from the held-out sample. Reward in [0, 1]: 1.0 for the exact answer alone.
"""

from __future__ import annotations

import random
from typing import ClassVar

from evora.config.schema import TaskConfig
from evora.lora.keys import noise_key
from evora.tasks.aggregate import exact_answer_text
from evora.tasks.base import Example, Splits
from evora.tasks.registry import register_task
from evora.tasks.rewards.exact import exact_answer

MAX_OPERAND = 99
HELDOUT_SEED = 0  # the held-out sample is fixed: runs with different seeds compare on it


def is_heldout_pair(a: int, b: int) -> bool:
    return (7 * a + 13 * b) % 8 == 0


def all_pairs() -> list[tuple[int, int]]:
    return [(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]


def training_pairs() -> list[tuple[int, int]]:
    return [p for p in all_pairs() if not is_heldout_pair(*p)]


def heldout_pairs() -> list[tuple[int, int]]:
    return [p for p in all_pairs() if is_heldout_pair(*p)]


def prompt_of(a: int, b: int) -> str:
    return f"{a}+{b}="


def example_of(a: int, b: int) -> Example:
    return Example(prompt_of(a, b), str(a + b), {"a": a, "b": b})


@register_task("addition")
class AdditionTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def splits(self) -> Splits:
        train_pool, held_pool = training_pairs(), heldout_pairs()
        train = random.Random(noise_key(self.seed, "addition-train")).sample(
            train_pool, min(self.cfg.train_size, len(train_pool))
        )
        random.Random(HELDOUT_SEED).shuffle(held_pool)
        heldout = held_pool[: self.cfg.eval_size]
        selection = held_pool[self.cfg.eval_size : self.cfg.eval_size + self.cfg.selection_size]
        return Splits(*(tuple(example_of(*p) for p in pairs) for pairs in (train, selection, heldout)))

    def reward(self, completion: str, example: Example) -> float:
        return exact_answer(completion, example.answer)

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) == 1.0

    def answer(self, completion: str, example: Example) -> str | None:
        """The stripped completion (what exact_answer compares), e.g. "57"; None when blank."""
        return exact_answer_text(completion)
