"""Tasks: prompts, splits and rewards. Importing this package registers the built-in tasks."""

from __future__ import annotations

from evora.tasks import (  # noqa: F401  (registration)
    addition,
    arithmetic,
    conciseness,
    countdown,
    families,
    gsm8k,
    jsonl,
    lm_eval_task,
    mix,
    mmlu_pro,
)
from evora.tasks.base import Example, Splits, Task, build_task, registered_tasks


def task_names() -> tuple[str, ...]:
    return registered_tasks()


__all__ = ["Example", "Splits", "Task", "build_task", "task_names"]
