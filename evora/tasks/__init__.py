"""Tasks: prompts, splits and rewards. Importing this package registers the built-in tasks."""

from __future__ import annotations

from evora.config.schema import TaskConfig
from evora.tasks import addition, countdown  # noqa: F401  (registration)
from evora.tasks.base import Example, Splits, Task, registered_tasks, task_class


def task_names() -> tuple[str, ...]:
    return registered_tasks()


def build_task(cfg: TaskConfig, seed: int) -> Task:
    return task_class(cfg.name)(cfg, seed)


__all__ = ["Example", "Splits", "Task", "build_task", "task_names"]
