"""MMLU-Pro: multiple choice with up to ten options (A-J).

Data: task.data_path (JSONL/JSON/parquet records with `question`, `options` (a list)
and `answer` (a letter), as in TIGER-Lab/MMLU-Pro), or the hub dataset task.dataset
(default TIGER-Lab/MMLU-Pro; its validation and test splits pooled, then split with
the seed). Reward in [0, 1]: 1.0 when the letter the completion commits to ("answer is
(C)", "Answer: C", "(C)", or a leading "C.") is the right one.
"""

from __future__ import annotations

import string
from typing import Any, ClassVar

from evora.config.schema import TaskConfig
from evora.errors import DataError
from evora.tasks.aggregate import choice_answer
from evora.tasks.base import Example, Splits, split_examples
from evora.tasks.data import hub_records, read_records, require
from evora.tasks.registry import register_task
from evora.tasks.rewards.choice import choice_match

LETTERS = string.ascii_uppercase[:10]
HUB_DATASET = "TIGER-Lab/MMLU-Pro"


def example_of(record: dict[str, Any], where: str) -> Example:
    require(record, where, ("question", "options", "answer"))
    options, answer = record["options"], str(record["answer"]).strip().upper()
    if not isinstance(options, list) or not 2 <= len(options) <= len(LETTERS):
        raise DataError(f"{where}: 'options' must be a list of 2 to {len(LETTERS)} options")
    if answer not in LETTERS[: len(options)]:
        raise DataError(f"{where}: 'answer' must be one of {', '.join(LETTERS[: len(options)])}")
    listed = "\n".join(f"{LETTERS[i]}. {option}" for i, option in enumerate(options))
    prompt = f"{record['question']}\n{listed}\nAnswer with the letter of the correct option."
    return Example(prompt, answer, {"category": record.get("category", "")}, target=f"The answer is ({answer}).")


@register_task("mmlu_pro", hub_data=True)
class MMLUProTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    plain_template: ClassVar[str] = "Question: {prompt}\nAnswer: "

    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def splits(self) -> Splits:
        cfg = self.cfg
        if cfg.data_path is not None:
            located = read_records(cfg.data_path)
        else:
            hub = hub_records(cfg.dataset or HUB_DATASET, cfg.dataset_config, ("validation", "test"))
            located = hub["validation"] + hub["test"]
        return split_examples([example_of(r, w) for r, w in located], cfg, self.seed, "mmlu-pro-split")

    def reward(self, completion: str, example: Example) -> float:
        return choice_match(completion, example.answer)

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) == 1.0

    def answer(self, completion: str, example: Example) -> str | None:
        """The letter the completion commits to (what choice_match compares), e.g. "C"."""
        return choice_answer(completion)
