"""Countdown (TinyZero / the ES paper): combine the given numbers with + - * / to reach
the target. Reward 0.1 x format + 1.0 x correct (`rewards/countdown.py`).

Problems come from a JSON/JSONL file of records with `numbers`, `target` and optionally
`context` (the full prompt) and `solution`, as in the ES paper's countdown.json, or are
generated (solvable by construction) when `task.data_path` is null.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, ClassVar

from evora.config.schema import TaskConfig
from evora.errors import DataError
from evora.lora.noise import noise_key
from evora.tasks.base import Example, Splits, register_task
from evora.tasks.rewards.countdown import THINK_OPEN, countdown_reward

INSTRUCTION = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
    "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> tags. "
    "And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)
PREAMBLE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the answer.\n"
    "User: {instruction}\nAssistant: Let me solve this step by step.\n<think>"
)


def countdown_prompt(numbers: list[int], target: int) -> str:
    return PREAMBLE.format(instruction=INSTRUCTION.format(numbers=numbers, target=target))


def generate_problem(rng: random.Random, count: int = 4, max_number: int = 99,
                     max_target: int = 1000) -> dict[str, Any]:
    """A solvable problem: numbers, a target reached by an expression over all of them."""
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        order = rng.sample(numbers, len(numbers))
        value, text = order[0], str(order[0])
        for number in order[1:]:
            op = rng.choice("+-*/")
            if op == "/" and (number == 0 or value % number):
                op = "+"
            value = {"+": value + number, "-": value - number, "*": value * number, "/": value // number}[op]
            text = f"({text} {op} {number})"
        if 0 < value <= max_target:
            return {"numbers": numbers, "target": value, "solution": text[1:-1] if count > 1 else text}


def load_problems(path: str) -> list[dict[str, Any]]:
    """Records from a JSON array or JSONL file; errors name the file and line."""
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from None
        located = [(record, f"{path}: record {i}") for i, record in enumerate(records)]
    else:
        located = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    located.append((json.loads(line), f"{path}:{lineno}"))
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}:{lineno}: invalid JSON: {error.msg}") from None
    return [_check_record(record, where) for record, where in located]


def _check_record(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected an object with numbers and target")
    for key in ("numbers", "target"):
        if key not in record:
            raise DataError(f"{where}: missing field '{key}'")
    numbers, target = record["numbers"], record["target"]
    if not (isinstance(numbers, list) and numbers and all(type(n) is int for n in numbers)):
        raise DataError(f"{where}: 'numbers' must be a non-empty list of integers")
    if type(target) is not int:
        raise DataError(f"{where}: 'target' must be an integer")
    return record


@register_task("countdown")
class CountdownTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.1)

    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def _problems(self) -> list[dict[str, Any]]:
        wanted = self.cfg.train_size + self.cfg.eval_size
        if self.cfg.data_path is not None:
            return load_problems(self.cfg.data_path)
        rng = random.Random(noise_key(self.seed, "countdown-problems"))
        return [generate_problem(rng, count=rng.choice((3, 4))) for _ in range(wanted)]

    def splits(self) -> Splits:
        problems = self._problems()
        random.Random(noise_key(self.seed, "countdown-split")).shuffle(problems)
        examples = [self._example(p) for p in problems]
        n_train = min(self.cfg.train_size, max(1, len(examples) - self.cfg.eval_size))
        return Splits(tuple(examples[:n_train]), tuple(examples[n_train:n_train + self.cfg.eval_size]))

    @staticmethod
    def _example(problem: dict[str, Any]) -> Example:
        numbers, target = list(problem["numbers"]), int(problem["target"])
        prompt = problem.get("context") or countdown_prompt(numbers, target)
        return Example(prompt, str(problem.get("solution", "")), {"numbers": numbers, "target": target})

    def reward(self, completion: str, example: Example) -> float:
        # The prompt opens the think block, so the response is scored as if it began with it.
        response = THINK_OPEN + completion if example.prompt.endswith(THINK_OPEN) else completion
        return countdown_reward(response, example.data["numbers"], example.data["target"])
