"""Conciseness (the ES paper's task; the ES-over-LoRA notes): answer at the length of a reference.

Reward -|len(completion) - len(target)| in characters, in [-len(completion) - len(target), 0]:
0 is a completion exactly as long as the reference. The completion is measured as generated
(the decoded text, whitespace included), as the paper's `compute_reward` measures it;
task.length_measure=stripped leaves its surrounding whitespace out. Correct when the length is within
20% (at least 2 characters) of the reference's. The paper's minimal supervision: 2
training prompts, 8 test prompts (`data_files/conciseness_*.jsonl`, written for evora);
task.data_path can point to a JSONL file of prompt/target records instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from evora.config.checks import choice
from evora.config.schema import TaskConfig
from evora.tasks.base import Example, Splits, split_examples
from evora.tasks.data import read_records, require
from evora.tasks.registry import register_task

DATA = Path(__file__).resolve().parent.parent / "data_files"


LENGTH_MEASURES = ("generated", "stripped")


def length_gap(completion: str, target: str, measure: str = "generated") -> int:
    measured = completion.strip() if measure == "stripped" else completion
    return abs(len(measured) - len(target))


def _examples(path: str) -> list[Example]:
    examples = []
    for record, where in read_records(path):
        require(record, where, ("prompt", "target"))
        examples.append(Example(str(record["prompt"]), str(record["target"]), target=str(record["target"])))
    return examples


@dataclass(frozen=True)
class ConcisenessConfig(TaskConfig):
    # A completion's length as generated (the paper: the decoded text, whitespace included) |
    # stripped (surrounding whitespace left out).
    length_measure: str = "generated"


def check_conciseness(cfg: ConcisenessConfig) -> None:
    choice("task.length_measure", cfg.length_measure, LENGTH_MEASURES)


@register_task("conciseness", config=ConcisenessConfig, validate=check_conciseness)
class ConcisenessTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (float("-inf"), 0.0)

    def __init__(self, cfg: ConcisenessConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def splits(self) -> Splits:
        if self.cfg.data_path is not None:
            return split_examples(_examples(self.cfg.data_path), self.cfg, self.seed, "conciseness-split")
        train = _examples(str(DATA / "conciseness_train.jsonl"))[: self.cfg.train_size]
        test = _examples(str(DATA / "conciseness_test.jsonl"))
        selection, heldout = test[: self.cfg.selection_size], test[self.cfg.selection_size :]
        return Splits(tuple(train), tuple(selection), tuple(heldout[: self.cfg.eval_size]))

    def reward(self, completion: str, example: Example) -> float:
        return -float(length_gap(completion, example.answer, self.cfg.length_measure))

    # No `answer` (not an AnswerTask): the reward is a length, not an answer to vote on.

    def correct(self, completion: str, example: Example) -> bool:
        gap = length_gap(completion, example.answer, self.cfg.length_measure)
        return gap <= max(2, 0.2 * len(example.answer))
