"""A task class: `evora task.name=mypkg.tasks:ReverseTask task.max_letters=4` (with PYTHONPATH=examples).

Reverse a short word: "reverse: abc =" -> "cba". Reward in [0, 1]: 1.0 for the exact reversal.
Registered with a config of its own, so `task.max_letters` is a key of this task alone, checked
before Ray by `check_reverse`. (A class that is not registered runs too, on TaskConfig's keys.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evora.config.checks import require
from evora.config.schema import TaskConfig
from evora.tasks import register_task
from evora.tasks.base import Example, Splits, split_examples
from evora.tasks.rewards.exact import exact_answer

LETTERS = "abcdefghij"


@dataclass(frozen=True)
class ReverseConfig(TaskConfig):
    max_letters: int = 5  # the longest word


def check_reverse(cfg: ReverseConfig) -> None:
    require(2 <= cfg.max_letters <= 8, "task.max_letters", cfg.max_letters, "must be in 2..8")


@register_task("reverse", config=ReverseConfig, validate=check_reverse)
class ReverseTask:
    reward_range = (0.0, 1.0)

    def __init__(self, cfg: ReverseConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def splits(self) -> Splits:
        rng = random.Random(0)
        words = {"".join(rng.choice(LETTERS) for _ in range(rng.randint(2, self.cfg.max_letters))) for _ in range(3000)}
        examples = [Example(f"reverse: {w} =", w[::-1]) for w in sorted(words)]
        return split_examples(examples, self.cfg, self.seed, "reverse-split")

    def reward(self, completion: str, example: Example) -> float:
        return exact_answer(completion, example.answer)

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) == 1.0
