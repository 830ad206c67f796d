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
from concurrent.futures.process import BrokenProcessPool
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


POOL_REBUILDS = 3  # a score call rebuilds a broken pool at most this often, then scores what is left as errors


class RewardPool:
    """Scores (completion, example) pairs in reward processes, one call per pair."""

    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg, self.seed = cfg, seed
        self.penalty = cfg.reward_penalty
        self.timeout_s = cfg.reward_timeout_s
        self.pool = self._new_pool()

    def _new_pool(self) -> ProcessPool:
        # Forked from a clean server that has imported evora.tasks: a replacement process starts
        # in milliseconds, and never inherits an engine's threads or GPU context (plain fork would).
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["evora.tasks"])
        return ProcessPool(
            max_workers=self.cfg.reward_workers,
            initializer=_start_reward_process,
            initargs=(self.cfg, self.seed, self.cfg.reward_memory_mb),
            context=context,
        )

    def _rebuild(self) -> None:
        self.close()
        self.pool = self._new_pool()

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> Scores:
        """Each pair's (reward, correct, failure). A reward process that dies while pebble has not yet
        marked its call as running (a race under load) breaks the whole pool and aborts every call
        in it: the pool is rebuilt and the aborted calls, and only those, are made again, so a
        fair reward's score never depends on that race."""
        outcomes: dict[int, tuple[float, bool, str | None]] = {}
        pending = list(range(len(completions)))
        for _ in range(POOL_REBUILDS + 1):
            if not self.pool.active:
                self._rebuild()
            futures = [
                self.pool.schedule(_reward_and_correct, args=(completions[i], examples[i]), timeout=self.timeout_s)
                for i in pending
            ]
            aborted = []
            for index, future in zip(pending, futures):
                try:
                    reward, right = future.result()
                    outcomes[index] = (reward, right, None)
                except FutureTimeout:  # pebble killed and replaced the process
                    outcomes[index] = (self.penalty, False, "timeout")
                except BrokenProcessPool:  # aborted with the pool, whichever call broke it
                    aborted.append(index)
                except Exception:  # it raised (MemoryError too), or its process died (ProcessExpired)
                    outcomes[index] = (self.penalty, False, "error")
            if not aborted:
                break
            pending = aborted
        else:
            outcomes.update({index: (self.penalty, False, "error") for index in pending})
        ordered = [outcomes[i] for i in range(len(completions))]
        return Scores(
            [reward for reward, _, _ in ordered],
            [right for _, right, _ in ordered],
            errors=sum(failure == "error" for _, _, failure in ordered),
            timeouts=sum(failure == "timeout" for _, _, failure in ordered),
        )

    def close(self) -> None:
        self.pool.stop()
        self.pool.join(timeout=10)


def reward_scorer(task: Task, cfg: TaskConfig, seed: int) -> Scorer:
    """The pool for a user's reward or task class; in-process scoring for built-ins."""
    return RewardPool(cfg, seed) if is_user_reward(cfg) else InProcessRewards(task, cfg.reward_penalty)
