"""Tasks: prompts, splits and rewards. Importing this package imports every module in
`tasks/builtin/`, which registers its tasks (`registry.py`): adding a task touches its module
there and its conf/task/<name>.yaml, nothing else."""

from __future__ import annotations

import importlib
import pkgutil

from evora.tasks import builtin
from evora.tasks.base import Example, Splits, Task
from evora.tasks.registry import TaskEntry, build_task, get_task, register_task, task_config, task_names

for _module in pkgutil.iter_modules(builtin.__path__):
    importlib.import_module(f"{builtin.__name__}.{_module.name}")

__all__ = [
    "Example",
    "Splits",
    "Task",
    "TaskEntry",
    "build_task",
    "get_task",
    "register_task",
    "task_config",
    "task_names",
]
