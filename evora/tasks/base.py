"""The task protocol: examples, deterministic splits and a pure reward.

Rewards are pure functions of (completion, example) from `tasks/rewards/`; they never
execute model output. The worker scores completions with `score_completions`, where a
reward that raises scores the configured penalty and is counted, not fatal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Protocol, Sequence

from evora.config.schema import TaskConfig


@dataclass(frozen=True)
class Example:
    prompt: str
    answer: str
    data: Mapping[str, Any] = field(default_factory=dict)  # task-specific fields (numbers, target, ...)


@dataclass(frozen=True)
class Splits:
    train: tuple[Example, ...]
    heldout: tuple[Example, ...]

    def get(self, split: str) -> tuple[Example, ...]:
        return {"train": self.train, "heldout": self.heldout}[split]


class Task(Protocol):
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]]

    def __init__(self, cfg: TaskConfig, seed: int) -> None: ...

    def splits(self) -> Splits:
        """Train and held-out examples; the same for the same config and seed."""

    def reward(self, completion: str, example: Example) -> float:
        """A score in `reward_range`."""


_TASKS: dict[str, type] = {}


def register_task(name: str) -> Callable[[type], type]:
    def add(cls: type) -> type:
        cls.name = name
        _TASKS[name] = cls
        return cls

    return add


def task_class(name: str) -> type:
    return _TASKS[name]


def registered_tasks() -> tuple[str, ...]:
    return tuple(sorted(_TASKS))


@dataclass(frozen=True)
class Scores:
    rewards: list[float]
    errors: int  # reward calls that raised and scored the penalty


def score_completions(task: Task, completions: Sequence[str], examples: Sequence[Example],
                      penalty: float) -> Scores:
    rewards, errors = [], 0
    for completion, example in zip(completions, examples):
        try:
            rewards.append(float(task.reward(completion, example)))
        except Exception:  # a reward bug must not kill a generation; it is counted
            rewards.append(penalty)
            errors += 1
    return Scores(rewards, errors)
