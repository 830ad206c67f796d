"""Arithmetic: procedural expressions over small integers, numeric answer.

"What is 37 * 4 - 12?" -> 136. Reward in [0, 1]: 1.0 when the final number of the
completion (after "####", in \\boxed{}, or the last number) equals the value.
"""

from __future__ import annotations

import random
from typing import ClassVar

from evora.config.schema import TaskConfig
from evora.lora.keys import noise_key
from evora.tasks.aggregate import numeric_answer
from evora.tasks.base import Example, Splits, split_examples
from evora.tasks.registry import register_task
from evora.tasks.rewards.numeric import numeric_match
from evora.tasks.rewards.safe_eval import evaluate_arithmetic

OPERATORS = ("+", "-", "*")


def generate_expression(rng: random.Random, max_operand: int = 99) -> str:
    terms = [str(rng.randint(1, max_operand)) for _ in range(rng.choice((2, 3)))]
    text = terms[0]
    for term in terms[1:]:
        text += f" {rng.choice(OPERATORS)} {term}"
    return text


def example_of(expression: str) -> Example:
    value = evaluate_arithmetic(expression)
    answer = str(value.numerator)  # + - * over integers stay integral
    return Example(
        f"What is {expression}? Give the final answer after ####.",
        answer,
        {"expression": expression},
        target=f"{expression} = {answer}\n#### {answer}",
    )


@register_task("arithmetic")
class ArithmeticTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    plain_template: ClassVar[str] = "Question: {prompt}\nAnswer: "

    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def splits(self) -> Splits:
        rng = random.Random(noise_key(self.seed, "arithmetic-problems"))
        wanted = self.cfg.train_size + self.cfg.selection_size + self.cfg.eval_size
        expressions: dict[str, None] = {}  # distinct, in generation order
        for _ in range(50 * wanted):
            if len(expressions) == wanted:
                break
            expressions.setdefault(generate_expression(rng))
        return split_examples([example_of(e) for e in expressions], self.cfg, self.seed, "arithmetic-split")

    def reward(self, completion: str, example: Example) -> float:
        return numeric_match(completion, example.answer)

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) == 1.0

    def answer(self, completion: str, example: Example) -> str | None:
        """The final number (what numeric_match compares) as an exact Fraction string, e.g. "136", "-3/4"."""
        return numeric_answer(completion)
