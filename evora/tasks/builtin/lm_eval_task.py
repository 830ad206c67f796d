"""An lm-evaluation-harness task as an evora task, for any strategy:

    evora task=lm_eval task.lm_eval_task=gsm8k_cot_zeroshot ...
    evora task=lm_eval task.lm_eval_task=my_task task.lm_eval_path=my_tasks/

The task's documents (its test split, else validation, else train) are split into evora's train,
selection and held-out examples. A prompt is lm-eval's own zero-shot context for the document
(`fewshot_context`: description and `doc_to_text`), used as it is (lm-eval's default, no chat
template); the answer is `doc_to_target`. The reward of a completion is the task's first metric
from lm-eval's own `process_results`, on the completion cut at the task's stop strings (`until`),
as lm-eval's generation stops there. Relative data files in a task YAML of `task.lm_eval_path` are
read from that folder.

Supported: `generate_until` tasks with lm-eval's default filter (the first completion as it is),
whose first metric scores a document in [0, 1] (exact_match and the like). Loglikelihood and
multiple-choice tasks rank the model's probabilities of given answers rather than score a
completion, which is what evora's strategies evolve; tasks with answer-extraction filters need the
filter pipeline run per completion, not yet done. lm-eval is the optional extra `.[eval]`."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterator, Optional

from evora.config.schema import TaskConfig
from evora.errors import ConfigError
from evora.tasks.base import Example, Splits, split_examples
from evora.tasks.registry import register_task

SALT = "lm-eval-split"
SUPPORTED_OUTPUT = "generate_until"
DEFAULT_FILTERS = ({"name": "none", "filter": [{"function": "take_first"}]},)


@dataclass(frozen=True)
class LmEvalConfig(TaskConfig):
    lm_eval_task: Optional[str] = None  # an lm-evaluation-harness task's name
    lm_eval_path: Optional[str] = None  # a folder of your own lm-eval task YAMLs (lm-eval's include_path)


@contextmanager
def reading_from(folder: str | None) -> Iterator[None]:
    """Relative data files of a task YAML read from `folder` (the task's include path) rather
    than from wherever the process runs (a Ray worker's folder); the working directory is restored."""
    if folder is None:
        yield
        return
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def load_lm_eval_task(name: str, include_path: str | None) -> Any:
    """lm-eval's task object (its documents loaded): from `include_path` alone when it defines the
    task (quick), else from lm-eval's own tasks too."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ConfigError("task=lm_eval: needs lm-evaluation-harness: pip install -e '.[eval]'") from None
    include_path = str(Path(include_path).resolve()) if include_path else None  # read below from inside it
    manager = TaskManager(include_path=include_path, include_defaults=False) if include_path else None
    if manager is None or name not in manager.all_tasks:
        manager = TaskManager(include_path=include_path)
    if name not in manager.all_tasks:
        raise ConfigError(f"task.lm_eval_task={name}: no such lm-eval task (see `lm-eval ls tasks`)")
    with reading_from(include_path):
        loaded = manager.load_task_or_group([name])
    task = loaded.get(name)
    if task is None or isinstance(task, dict):
        raise ConfigError(f"task.lm_eval_task={name}: a group of tasks; name one of its tasks")
    return task


def check_supported(name: str, task: Any) -> None:
    config = task.config
    if config.output_type != SUPPORTED_OUTPUT:
        raise ConfigError(
            f"task.lm_eval_task={name}: output_type {config.output_type}; supported: {SUPPORTED_OUTPUT} (docs/tasks.md)"
        )
    filters = config.filter_list
    if filters and [f if isinstance(f, dict) else vars(f) for f in filters] != list(DEFAULT_FILTERS):
        raise ConfigError(f"task.lm_eval_task={name}: answer-extraction filters are not supported yet")


def check_lm_eval(cfg: LmEvalConfig) -> None:
    """Before Ray: the task exists and is of a supported kind."""
    if not cfg.lm_eval_task:
        raise ConfigError("task.lm_eval_task=null: task=lm_eval needs an lm-eval task name")
    check_supported(cfg.lm_eval_task, load_lm_eval_task(cfg.lm_eval_task, cfg.lm_eval_path))


def documents(task: Any) -> list[dict]:
    for has, docs in ((task.has_test_docs, task.test_docs), (task.has_validation_docs, task.validation_docs)):
        if has():
            return list(docs())
    return list(task.training_docs())


@register_task("lm_eval", config=LmEvalConfig, validate=check_lm_eval)
class LmEvalTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __init__(self, cfg: LmEvalConfig, seed: int):
        if not cfg.lm_eval_task:
            raise ConfigError("task.lm_eval_task=null: task=lm_eval needs an lm-eval task name")
        self.cfg, self.seed = cfg, seed
        self.task = load_lm_eval_task(cfg.lm_eval_task, cfg.lm_eval_path)
        check_supported(cfg.lm_eval_task, self.task)
        self.metric = self.task.config.metric_list[0]["metric"]
        self.until = [s for s in (self.task.config.generation_kwargs or {}).get("until", []) if s]

    def splits(self) -> Splits:
        examples = []
        for doc in documents(self.task):
            context = self.task.fewshot_context(doc, num_fewshot=0)
            answer = self.task.doc_to_target(doc)
            examples.append(Example(context, str(answer), data={"doc": doc}, rendered=context))
        return split_examples(examples, self.cfg, self.seed, SALT)

    def cut(self, completion: str) -> str:
        """The completion up to the first of the task's stop strings."""
        ends = [i for i in (completion.find(s) for s in self.until) if i >= 0]
        return completion[: min(ends)] if ends else completion

    def reward(self, completion: str, example: Example) -> float:
        return float(self.task.process_results(example.data["doc"], [self.cut(completion)])[self.metric])

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) == 1.0
