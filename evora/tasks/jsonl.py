"""Any file of prompt/answer records, scored by a chosen scorer.

    evora task=jsonl task.data_path=my.jsonl task.scorer=numeric
    evora task=jsonl task.data_path=qa.parquet task.prompt_field=question task.answer_field=gold task.scorer=fuzzy

Scorers (`tasks/rewards/scorers.py`): exact, numeric, fuzzy, regex (the answer field
holds the pattern), contains, choice. Reward in [0, 1]. An optional `target` field is
the reference completion (perplexity); otherwise the answer is.
"""

from __future__ import annotations

from typing import ClassVar

from evora.config.schema import TaskConfig
from evora.errors import ConfigError
from evora.tasks.base import Example, Splits, register_task, split_examples
from evora.tasks.data import read_records, require
from evora.tasks.rewards.scorers import SCORERS


@register_task("jsonl")
class JsonlTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __init__(self, cfg: TaskConfig, seed: int):
        if cfg.data_path is None:
            raise ConfigError("task.data_path=null: task=jsonl needs a JSONL, JSON or parquet file")
        self.cfg = cfg
        self.seed = seed
        self.score = SCORERS[cfg.scorer]

    def splits(self) -> Splits:
        cfg, examples = self.cfg, []
        for record, where in read_records(cfg.data_path):
            require(record, where, (cfg.prompt_field, cfg.answer_field))
            examples.append(
                Example(
                    str(record[cfg.prompt_field]), str(record[cfg.answer_field]), target=str(record.get("target", ""))
                )
            )
        return split_examples(examples, cfg, self.seed, "jsonl-split")

    def reward(self, completion: str, example: Example) -> float:
        return self.score(completion, example.answer)

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) == 1.0
