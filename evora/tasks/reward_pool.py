"""User rewards, bounded in time and isolated (docs/architecture.md, "Failure handling").

A user's reward (`task.reward=`, or a user task class) may hang, crash the interpreter
(a segfault, `os._exit`) or eat the machine's memory. It runs in a small pool of reward
processes (pebble), each with its own copy of the task, a per-call deadline
(`task.reward_timeout_s`) and an address-space limit (`task.reward_memory_mb`). A call past
its deadline, or whose process died, scores `task.reward_penalty` and is counted; pebble
replaces the process and the run goes on. Built-in rewards are bounded by construction and
stay in-process (`InProcessRewards`): no IPC on the common path.
"""

from __future__ import annotations

import multiprocessing
import resource
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Protocol, Sequence

from pebble import ProcessPool

from evora.config.schema import TaskConfig
from evora.tasks.base import Example, Task, build_task, is_user_reward


@dataclass(frozen=True)
class Scores:
    rewards: list[float]
    correct: list[bool]
    errors: int  # calls that raised, or whose reward process died: scored the penalty
    timeouts: int = 0  # calls past task.reward_timeout_s: scored the penalty


class Scorer(Protocol):
    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> Scores: ...

    def close(self) -> None: ...


class InProcessRewards:
    """Built-in rewards: pure, bounded functions, called directly."""

    def __init__(self, task: Task, penalty: float):
        self.task, self.penalty = task, penalty

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> Scores:
        rewards, correct, errors = [], [], 0
        for completion, example in zip(completions, examples):
            try:
                rewards.append(float(self.task.reward(completion, example)))
                correct.append(bool(self.task.correct(completion, example)))
            except Exception:  # a reward bug must not kill a generation; it is counted
                rewards.append(self.penalty)
                correct.append(False)
                errors += 1
        return Scores(rewards, correct, errors)

    def close(self) -> None:
        pass


_task: Task | None = None  # the reward process's own task


def _start_reward_process(cfg: TaskConfig, seed: int, memory_mb: int | None) -> None:
    global _task
    if memory_mb is not None:  # a runaway allocation fails in the reward (MemoryError), not in the machine
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _task = build_task(cfg, seed)


def _reward_and_correct(completion: str, example: Example) -> tuple[float, bool]:
    assert _task is not None
    return float(_task.reward(completion, example)), bool(_task.correct(completion, example))


class RewardPool:
    """Scores (completion, example) pairs in reward processes, one call per pair."""

    def __init__(self, cfg: TaskConfig, seed: int):
        self.penalty = cfg.reward_penalty
        self.timeout_s = cfg.reward_timeout_s
        # Forked from a clean server that has imported evora.tasks: a replacement process starts
        # in milliseconds, and never inherits an engine's threads or GPU context (plain fork would).
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["evora.tasks"])
        self.pool = ProcessPool(
            max_workers=cfg.reward_workers,
            initializer=_start_reward_process,
            initargs=(cfg, seed, cfg.reward_memory_mb),
            context=context,
        )

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> Scores:
        futures = [
            self.pool.schedule(_reward_and_correct, args=(c, e), timeout=self.timeout_s)
            for c, e in zip(completions, examples)
        ]
        rewards, correct, errors, timeouts = [], [], 0, 0
        for future in futures:
            try:
                reward, right = future.result()
            except FutureTimeout:  # pebble killed and replaced the process
                timeouts += 1
                reward, right = self.penalty, False
            except Exception:  # it raised (MemoryError too), or its process died (ProcessExpired)
                errors += 1
                reward, right = self.penalty, False
            rewards.append(reward)
            correct.append(right)
        return Scores(rewards, correct, errors, timeouts)

    def close(self) -> None:
        self.pool.stop()
        self.pool.join(timeout=10)


def reward_scorer(task: Task, cfg: TaskConfig, seed: int) -> Scorer:
    """The pool for a user's reward or task class; in-process scoring for built-ins."""
    return RewardPool(cfg, seed) if is_user_reward(cfg) else InProcessRewards(task, cfg.reward_penalty)
