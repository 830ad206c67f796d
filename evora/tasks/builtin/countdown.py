"""Countdown (TinyZero / the ES paper): combine the given numbers with + - * / to reach
the target. Reward 0.1 x format + 1.0 x correct (`rewards/countdown.py`).

Problems come from a JSON/JSONL/parquet file of records with `numbers`, `target` and optionally
`context` (the full prompt, used verbatim) and `solution`, as in the ES paper's countdown.json
(whose targets are strings, some of them non-integers: "27.4"), or are generated (solvable by
construction) when `task.data_path` is null: `task.numbers` numbers (3 or 4) in
1..`task.max_number` (the paper's file: 1..99). One generated problem in eight (by its numbers and
target, `is_heldout_problem`) is held out: the held-out split is drawn from those alone, the
same for every seed, and train and selection from the rest with the run seed, so no held-out
problem is ever trained on (nor in the bundled organism's pretraining text,
`evora.models.build_organism`). `task.number_rule` and `task.answer_block` choose the scoring
rules (`rewards/countdown.py`; the paper's by default).
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

from evora.config.checks import choice
from evora.config.checks import require as require_key
from evora.config.schema import TaskConfig
from evora.errors import DataError
from evora.lora.keys import noise_key
from evora.tasks.base import Example, Splits, split_examples
from evora.tasks.data import read_records, require
from evora.tasks.registry import register_task
from evora.tasks.rewards.countdown import ANSWER_BLOCKS, NUMBER_RULES, THINK_OPEN, answer_score, countdown_reward

INSTRUCTION = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic "
    "operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> tags. "
    "And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)
# Without a chat template, prompts read as in TinyZero and the ES paper's countdown.json.
PLAIN_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the answer.\n"
    "User: {prompt}\nAssistant: "
)
RESPONSE_PREFIX = "Let me solve this step by step.\n<think>"
# Each record's `context` in the ES paper's countdown.json: this, the instruction (its numbers as
# numpy prints an array, "[ 9  8 99]") and the response prefix, with nothing between them.
PAPER_SYSTEM = (
    "You are a helpful assistant. You first think about the reasoning process in your mind and then provide "
    "the user with the answer."
)
PAPER_REPOSITORY = "github.com/VsonicV/es-fine-tuning-paper"
PAPER_FILE = "countdown/data/countdown.json"  # in PAPER_REPOSITORY
DATA_SOURCE = f"the ES paper's file is {PAPER_FILE} in {PAPER_REPOSITORY}; or write one: evora data countdown"


def countdown_prompt(numbers: list[int], target: int) -> str:
    """The full plain-text prompt (template, instruction and response prefix)."""
    return PLAIN_TEMPLATE.format(prompt=INSTRUCTION.format(numbers=numbers, target=target)) + RESPONSE_PREFIX


def paper_numbers(numbers: list[int]) -> str:
    """Numbers as the paper's contexts print them: numpy's array format, each right-aligned to the widest."""
    width = max(len(str(n)) for n in numbers)
    return "[" + " ".join(str(n).rjust(width) for n in numbers) + "]"


def paper_context(numbers: list[int], target: Any) -> str:
    """A record's `context` as the paper's countdown.json writes it."""
    instruction = INSTRUCTION.format(numbers=paper_numbers(numbers), target=target_text(target))
    return PAPER_SYSTEM + instruction + RESPONSE_PREFIX


def generate_problem(
    rng: random.Random, count: int = 4, max_number: int = 99, max_target: int = 1000
) -> dict[str, Any]:
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


HELDOUT_EIGHTH = 8  # one generated problem in eight is held out
HELDOUT_SEED = 0  # generated held-out problems: one draw for every run seed


def is_heldout_problem(numbers: list[int], target: Any) -> bool:
    """Whether a generated problem is held out: by its numbers (in any order) and target; crc32,
    not hash(), which changes from process to process."""
    key = f"{sorted(numbers)}={target_text(target)}"
    return zlib.crc32(key.encode()) % HELDOUT_EIGHTH == 0


def generated_problems(
    rng: random.Random, size: int, max_number: int, heldout: bool, counts: tuple[int, ...] = (3, 4)
) -> list[dict[str, Any]]:
    """`size` problems of `counts` numbers (3 or 4: the paper's) in 1..max_number, each held out or each not."""
    problems: list[dict[str, Any]] = []
    while len(problems) < size:
        problem = generate_problem(rng, count=rng.choice(counts), max_number=max_number)
        if is_heldout_problem(problem["numbers"], problem["target"]) == heldout:
            problems.append(problem)
    return problems


def load_problems(path: str) -> list[dict[str, Any]]:
    """Records from a JSON array, JSONL or parquet file; errors name the file and line."""
    return [_check_record(record, where) for record, where in read_records(path)]


def _check_record(record: dict[str, Any], where: str) -> dict[str, Any]:
    require(record, where, ("numbers", "target"))
    numbers, target = record["numbers"], record["target"]
    if not (isinstance(numbers, list) and numbers and all(type(n) is int for n in numbers)):
        raise DataError(f"{where}: 'numbers' must be a non-empty list of integers")
    if target_value(target) is None:
        raise DataError(f"{where}: 'target' must be a number, or a string of one (got {target!r})")
    return record


def target_value(target: Any) -> float | None:
    """A target as the paper reads it (`float(target)`), or None when it is not a finite number."""
    if isinstance(target, bool) or not isinstance(target, (int, float, str)):
        return None
    try:
        value = float(target)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def target_text(target: Any) -> str:
    """How a target reads in prompts and answers: as the data wrote it ("98", "27.4")."""
    if isinstance(target, float) and target.is_integer():
        return str(int(target))
    return str(target)


@dataclass(frozen=True)
class CountdownConfig(TaskConfig):
    number_rule: str = "all_exactly_once"  # all_exactly_once (the paper) | at_most_once
    answer_block: str = "last"  # which <answer> block is scored: last (the paper) | first
    max_number: int = 99  # generated problems: numbers in 1..max_number (the paper's file: 1..99)
    numbers: list[int] = field(default_factory=lambda: [3, 4])  # generated: numbers per problem (the paper: 3 or 4)


def check_countdown(cfg: CountdownConfig) -> None:
    choice("task.number_rule", cfg.number_rule, NUMBER_RULES)
    choice("task.answer_block", cfg.answer_block, ANSWER_BLOCKS)
    require_key(cfg.max_number >= 2, "task.max_number", cfg.max_number, "must be an integer >= 2")
    counts = list(cfg.numbers)
    valid = counts and all(type(n) is int and 2 <= n <= 6 for n in counts)
    require_key(bool(valid), "task.numbers", counts, "must be a non-empty list of integers in 2..6")


@register_task("countdown", config=CountdownConfig, validate=check_countdown, data_source=DATA_SOURCE)
class CountdownTask:
    """Reward in [0, 1.1]: 0.1 x format score (0 to 1) + 1.0 for a correct answer."""

    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.1)
    plain_template: ClassVar[str] = PLAIN_TEMPLATE

    def __init__(self, cfg: CountdownConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def splits(self) -> Splits:
        cfg = self.cfg
        if cfg.data_path is not None:
            examples = [self.example_of(p) for p in load_problems(cfg.data_path)]
            return split_examples(examples, cfg, self.seed, "countdown-split")
        counts = tuple(cfg.numbers)
        heldout = generated_problems(random.Random(HELDOUT_SEED), cfg.eval_size, cfg.max_number, True, counts)
        rng = random.Random(noise_key(self.seed, "countdown-problems"))
        rest = generated_problems(rng, cfg.selection_size + cfg.train_size, cfg.max_number, False, counts)
        selection, train = rest[: cfg.selection_size], rest[cfg.selection_size :]
        return Splits(*(tuple(map(self.example_of, part)) for part in (train, selection, heldout)))

    @staticmethod
    def example_of(problem: dict[str, Any]) -> Example:
        numbers, target = list(problem["numbers"]), target_text(problem["target"])
        solution = str(problem.get("solution", ""))
        return Example(
            INSTRUCTION.format(numbers=numbers, target=target),
            solution,
            {"numbers": numbers, "target": target},
            target=f" {solution} = {target}</think>\n<answer>{solution}</answer>",
            prefix=RESPONSE_PREFIX,
            rendered=problem.get("context"),
        )

    def reward(self, completion: str, example: Example) -> float:
        # The prompt opens the think block, so the response is scored as if it began with it.
        opened = (example.rendered or example.prefix).endswith(THINK_OPEN)
        response = THINK_OPEN + completion if opened else completion
        return countdown_reward(response, *self._rules(example))

    def correct(self, completion: str, example: Example) -> bool:
        return answer_score(completion, *self._rules(example)) == 1.0

    # No `answer` (not an AnswerTask): many different equations reach one target, so a
    # completion has no canonical answer to vote on (task.aggregate=majority does not apply).

    def _rules(self, example: Example) -> tuple[list[int], str, str, str]:
        return example.data["numbers"], example.data["target"], self.cfg.number_rule, self.cfg.answer_block
