"""Any file of prompt/answer records, scored by a chosen scorer.

    evora task=jsonl task.data_path=my.jsonl task.scorer=numeric
    evora task=jsonl task.data_path=qa.parquet task.prompt_field=question task.answer_field=gold task.scorer=fuzzy

Scorers (`tasks/rewards/scorers.py`): exact, numeric, fuzzy, regex (the answer field
holds the pattern), contains, choice. Reward in [0, 1]. An optional `target` field is
the reference completion (perplexity); otherwise the answer is. An optional `family`
string is the example's task family (the ecology routes on it); `task.heldout_families`
are families whose rows appear only in the held-out split.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Sequence

from evora.config.checks import choice, fail
from evora.config.schema import TaskConfig
from evora.errors import ConfigError, DataError
from evora.tasks.aggregate import choice_answer, exact_answer_text, numeric_answer
from evora.tasks.base import Example, Splits, split_examples
from evora.tasks.data import Located, read_records, require
from evora.tasks.registry import register_task
from evora.tasks.rewards.scorers import SCORERS

FAMILY_FIELD = "family"
SALT = "jsonl-split"
# The scorers whose answer is canonical (task.aggregate=majority), each the extraction the scorer
# compares: the stripped completion, the final number as a Fraction string, the choice letter.
# fuzzy, regex and contains have none (many different completions score 1.0).
ANSWERS: dict[str, Callable[[str], str | None]] = {
    "exact": exact_answer_text,
    "numeric": numeric_answer,
    "choice": choice_answer,
}


@dataclass(frozen=True)
class JsonlConfig(TaskConfig):
    scorer: str = "exact"  # exact | numeric | fuzzy | regex | contains | choice
    prompt_field: str = "prompt"  # the record field with the prompt
    answer_field: str = "answer"  # the record field with the answer
    heldout_families: list[str] = field(default_factory=list)  # families (the `family` field) only held out


def family_of(record: dict, where: str) -> str:
    """A record's family: its `family` string; "" (none) when absent or null."""
    family = record.get(FAMILY_FIELD)
    if family is None:
        return ""
    if not isinstance(family, str):
        raise DataError(f"{where}: field '{FAMILY_FIELD}' must be a string, got {type(family).__name__}")
    return family


def check_heldout_families(cfg: JsonlConfig, families: set[str]) -> None:
    """Every held-out family is one the file has (a typo would silently hold out nothing)."""
    for name in cfg.heldout_families:
        if name not in families:
            present = ", ".join(sorted(families)) or f"none: its records have no '{FAMILY_FIELD}' field"
            raise ConfigError(f"task.heldout_families={name}: not a family of {cfg.data_path} (families: {present})")


def examples_of(cfg: JsonlConfig, records: Sequence[Located]) -> list[Example]:
    examples = []
    for record, where in records:
        require(record, where, (cfg.prompt_field, cfg.answer_field))
        examples.append(
            Example(
                str(record[cfg.prompt_field]),
                str(record[cfg.answer_field]),
                target=str(record.get("target", "")),
                family=family_of(record, where),
            )
        )
    return examples


def check_jsonl(cfg: JsonlConfig) -> None:
    """Before Ray: a file is named, the scorer is one, and the held-out families are families of
    the file. A missing file is left to the plan's check of task.data_path, which names the key;
    bad rows (a non-string family) stop the plan when it builds the splits, naming file and line."""
    if cfg.data_path is None:
        raise fail("task.data_path", None, "task=jsonl needs a JSONL, JSON or parquet file")
    choice("task.scorer", cfg.scorer, tuple(SCORERS))
    if not cfg.heldout_families or cfg.data_path is None or not Path(cfg.data_path).is_file():
        return
    records = read_records(cfg.data_path)
    families = {family_of(record, where) for record, where in records}
    check_heldout_families(cfg, families - {""})


def split_heldout_families(examples: list[Example], cfg: JsonlConfig, seed: int) -> Splits:
    """The held-out split is cut from every row exactly as without held-out families (so it
    stays the same set); train and selection come from the rest, less the held-out families'
    rows, in the order task.split takes them."""
    # every row not held out lands in train, in split order; selection and train are cut from it below
    whole = split_examples(examples, dataclasses.replace(cfg, train_size=len(examples), selection_size=0), seed, SALT)
    held = set(cfg.heldout_families)
    rest = [e for e in whole.train if e.family not in held]
    if cfg.split == "ordered":  # train from the head, then selection
        train = rest[: cfg.train_size]
        selection = rest[len(train) : len(train) + cfg.selection_size]
    else:  # selection first: growing train_size never moves an example out of selection
        selection = rest[: cfg.selection_size]
        train = rest[cfg.selection_size :][: cfg.train_size]
    for name in cfg.heldout_families:  # a family that is held out but never evaluated would be a silent no-op
        if not any(e.family == name for e in whole.heldout):
            raise ConfigError(
                f"task.heldout_families={name}: none of its rows of {cfg.data_path} fall in the held-out split "
                f"(task.eval_size={cfg.eval_size}, task.split={cfg.split})"
            )
    return Splits(tuple(train), tuple(selection), whole.heldout)


@register_task("jsonl", config=JsonlConfig, validate=check_jsonl)
class JsonlTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __init__(self, cfg: JsonlConfig, seed: int):
        if cfg.data_path is None:
            raise ConfigError("task.data_path=null: task=jsonl needs a JSONL, JSON or parquet file")
        self.data_path: str = cfg.data_path
        self.cfg = cfg
        self.seed = seed
        self.score = SCORERS[cfg.scorer]
        extract = ANSWERS.get(cfg.scorer)
        if extract is not None:  # an AnswerTask only with such a scorer: `answer` is set per instance
            self._extract = extract
            self.answer = self._answer

    def splits(self) -> Splits:
        cfg = self.cfg
        examples = examples_of(cfg, read_records(self.data_path))
        if not cfg.heldout_families:
            return split_examples(examples, cfg, self.seed, SALT)
        check_heldout_families(cfg, {e.family for e in examples} - {""})
        return split_heldout_families(examples, cfg, self.seed)

    def reward(self, completion: str, example: Example) -> float:
        return self.score(completion, example.answer)

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) == 1.0

    def _answer(self, completion: str, example: Example) -> str | None:
        return self._extract(completion)
