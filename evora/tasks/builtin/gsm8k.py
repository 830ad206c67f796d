"""GSM8K: grade-school maths word problems with a numeric final answer.

Data: task.data_path (a JSONL/JSON/parquet file of `question`/`answer` records, the
answer ending in "#### <number>" as in openai/gsm8k), or the hub dataset task.dataset
(default openai/gsm8k, config main: its train split feeds train and selection, its test
split held-out). Reward in [0, 1]: 1.0 when the completion's final answer ("####",
\\boxed{}, or the last number) equals the reference's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from evora.config.schema import TaskConfig
from evora.errors import DataError
from evora.tasks.aggregate import numeric_answer
from evora.tasks.base import Example, Splits, split_examples
from evora.tasks.data import Located, hub_records, read_records, require
from evora.tasks.registry import register_task
from evora.tasks.rewards.numeric import extract_final_answer, numeric_match

INSTRUCTION = "\nSolve the problem step by step, then give the final numeric answer after ####."
HUB_DATASET, HUB_CONFIG = "openai/gsm8k", "main"


def example_of(record: dict[str, Any], where: str) -> Example:
    require(record, where, ("question", "answer"))
    final = extract_final_answer(str(record["answer"]))
    if final is None:
        raise DataError(f"{where}: the answer has no final number (expected '#### <number>')")
    return Example(str(record["question"]) + INSTRUCTION, final, target=str(record["answer"]))


@register_task("gsm8k", hub_data=True)
class GSM8KTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    plain_template: ClassVar[str] = "Question: {prompt}\nAnswer: "

    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def splits(self) -> Splits:
        cfg = self.cfg
        if cfg.data_path is not None:
            return split_examples(_examples(read_records(cfg.data_path)), cfg, self.seed, "gsm8k-split")
        hub = hub_records(cfg.dataset or HUB_DATASET, cfg.dataset_config or HUB_CONFIG, ("train", "test"))
        pool = split_examples(_examples(hub["train"]), replace(cfg, eval_size=0), self.seed, "gsm8k-split")
        return Splits(pool.train, pool.selection, tuple(_examples(hub["test"])[: cfg.eval_size]))

    def reward(self, completion: str, example: Example) -> float:
        return numeric_match(completion, example.answer)

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) == 1.0

    def answer(self, completion: str, example: Example) -> str | None:
        """The final number (what numeric_match compares) as an exact Fraction string, e.g. "136", "-3/4"."""
        return numeric_answer(completion)


def _examples(located: list[Located]) -> list[Example]:
    return [example_of(record, where) for record, where in located]
