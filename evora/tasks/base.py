"""The task protocol: examples, deterministic splits, a pure reward and correctness.

Rewards are pure functions of (completion, example) built from `tasks/rewards/`; they
never execute model output. The worker scores completions through `reward_pool`: a reward
that raises, hangs or crashes scores the configured penalty and is counted, not fatal.
"""

from __future__ import annotations

import functools
import importlib
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from evora.config.schema import TaskConfig
from evora.errors import ConfigError


@dataclass(frozen=True)
class Example:
    prompt: str  # the question as a user asks it (the user turn under a chat template)
    answer: str  # what the reward checks against
    data: Mapping[str, Any] = field(default_factory=dict)  # task-specific fields (numbers, target, ...)
    target: str = ""  # a reference completion (perplexity, supervised training); "" means `answer`
    prefix: str = ""  # the start of the model's turn, written for it (e.g. "<think>")
    rendered: str | None = None  # a prompt given in full by the data; used as it is, in every format
    family: str = ""  # task=mix: the task family it comes from

    @property
    def reference(self) -> str:
        return self.target or self.answer


@dataclass(frozen=True)
class Splits:
    train: tuple[Example, ...]
    selection: tuple[Example, ...]  # for choosing among adapters without touching held-out
    heldout: tuple[Example, ...]

    def get(self, split: str) -> tuple[Example, ...]:
        return {"train": self.train, "selection": self.selection, "heldout": self.heldout}[split]


class Task(Protocol):
    # Read-only properties: class attributes of most tasks, set per instance by CustomReward and MixTask.
    @property
    def name(self) -> str: ...

    @property
    def reward_range(self) -> tuple[float, float]: ...

    @property
    def plain_template(self) -> str | Mapping[str, str]:
        """How a prompt reads without a chat template ("{prompt}" by default); task=mix: one per family."""

    def __init__(self, cfg: TaskConfig, seed: int) -> None: ...

    def splits(self) -> Splits:
        """Train, selection and held-out examples; the same for the same config and seed."""

    def reward(self, completion: str, example: Example) -> float:
        """A score in `reward_range`."""

    def correct(self, completion: str, example: Example) -> bool:
        """Whether the completion counts as right (accuracy)."""


@runtime_checkable
class AnswerTask(Protocol):
    """A task whose completions have a canonical answer (majority voting, task.aggregate=majority):
    equal strings are the same answer; None when the completion gives no answer."""

    def answer(self, completion: str, example: Example) -> str | None: ...


def load_object(dotted: str, key: str) -> Any:
    """`package.module:attribute` -> the attribute; ConfigError naming `key` otherwise."""
    module_name, _, attribute = dotted.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f'{key}="{dotted}": expected a dotted path like mypkg.rewards:score')
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f'{key}="{dotted}": cannot load it ({type(error).__name__}: {error})') from None


class CustomReward:
    """A task whose reward (and correctness: reward >= the top of its range) is the user's
    function `reward(completion, example) -> float`, given as task.reward=pkg.module:func."""

    def __init__(self, task: Task, reward: Callable[[str, Example], float]):
        self.task = task
        self._reward = reward
        self.name = task.name
        self.plain_template = task.plain_template
        self.reward_range = task.reward_range

    def splits(self) -> Splits:
        return self.task.splits()

    def reward(self, completion: str, example: Example) -> float:
        return float(self._reward(completion, example))

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) >= self.reward_range[1]

    @property
    def batched(self) -> BatchReward | None:
        """The reward, where it was declared to score batches."""
        return self._reward if isinstance(self._reward, BatchReward) else None


class BatchReward:
    """A user reward that scores a batch in one call: `score_batch(completions, examples) ->
    list[float]` (a judge of your own, a model's forward pass). Declared with `@evora.batch_reward`;
    evora never guesses it from a signature. Called one completion at a time it is a batch of one."""

    def __init__(self, score_batch: Callable[[list[str], list[Example]], list[float]]):
        self.score_batch = score_batch
        functools.update_wrapper(self, score_batch)

    def __call__(self, completion: str, example: Example) -> float:
        return float(self.score_batch([completion], [example])[0])

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        # By name, as pickle takes a function: the module's attribute is this object, not the function.
        return load_object, (f"{self.__module__}:{self.__qualname__}", "task.reward")  # type: ignore[attr-defined]


def batch_reward(score_batch: Callable[[list[str], list[Example]], list[float]]) -> BatchReward:
    """Decorator: `score_batch(completions, examples) -> list[float]` is a reward over a batch."""
    return BatchReward(score_batch)


SERVED_REWARDS = ("judge", "reward_model")  # task.reward values scored by a model, not by user code


def is_user_reward(cfg: TaskConfig) -> bool:
    """A reward from a user's code (task.reward, or a task class by import path): run isolated."""
    return (cfg.reward is not None and cfg.reward not in SERVED_REWARDS) or ":" in cfg.name


SPLITS = ("shuffled", "ordered")


def split_examples(examples: list[Example], cfg: TaskConfig, seed: int, salt: str) -> Splits:
    """task.split=shuffled: shuffle with the seed, then take held-out, selection and train, in
    that order, so growing train_size never moves an example out of the held-out set.
    task.split=ordered (the ES paper's Countdown split): train, then selection, from the
    data's head in file order; held-out from its tail."""
    if cfg.split == "ordered":
        heldout = examples[len(examples) - cfg.eval_size :] if cfg.eval_size else []
        head = examples[: len(examples) - len(heldout)]
        train = head[: cfg.train_size]
        selection = head[len(train) : len(train) + cfg.selection_size]
        return Splits(tuple(train), tuple(selection), tuple(heldout))
    from evora.lora.keys import noise_key

    shuffled = list(examples)
    random.Random(noise_key(seed, salt)).shuffle(shuffled)
    heldout = shuffled[: cfg.eval_size]
    selection = shuffled[cfg.eval_size : cfg.eval_size + cfg.selection_size]
    train = shuffled[cfg.eval_size + cfg.selection_size :][: cfg.train_size]
    return Splits(tuple(train), tuple(selection), tuple(heldout))
