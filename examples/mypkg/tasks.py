"""A task class: `evora task.name=mypkg.tasks:ReverseTask` (with PYTHONPATH=examples).

Reverse a short word: "reverse: abc =" -> "cba". Reward in [0, 1]: 1.0 for the exact reversal.
"""

from __future__ import annotations

import random

from evora.config.schema import TaskConfig
from evora.tasks.base import Example, Splits, split_examples
from evora.tasks.rewards.exact import exact_answer

LETTERS = "abcdefghij"


class ReverseTask:
    reward_range = (0.0, 1.0)
    plain_template = "{prompt}"

    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def splits(self) -> Splits:
        rng = random.Random(0)
        words = {"".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 5))) for _ in range(3000)}
        examples = [Example(f"reverse: {w} =", w[::-1]) for w in sorted(words)]
        return split_examples(examples, self.cfg, self.seed, "reverse-split")

    def reward(self, completion: str, example: Example) -> float:
        return exact_answer(completion, example.answer)

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) == 1.0
