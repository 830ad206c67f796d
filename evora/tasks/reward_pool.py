"""User rewards, bounded in time and isolated (docs/architecture.md, "Failure handling").

A user's reward (`task.reward=`, or a user task class) may hang, crash the interpreter
(a segfault, `os._exit`) or eat the machine's memory. It runs in a small pool of reward
processes (pebble), each with its own copy of the task, a per-call deadline
(`task.reward_timeout_s`) and an address-space limit (`task.reward_memory_mb`). A call past
its deadline, or whose process died, fails and is counted; pebble replaces the process and
the run goes on. A failed reward is left out of the fitness and the metrics, or scores
`task.reward_penalty` where the user sets one (`Scores`). A reward declared with
`@evora.batch_reward` is called on batches of `task.reward_batch_size`, each call with the
deadline. Built-in rewards are bounded by construction and stay in-process
(`InProcessRewards`): no IPC on the common path. Rewards served by a model (`task.reward=judge`,
`reward_model`) have scorers of their own (`SERVED_SCORERS`).
"""

from __future__ import annotations

import multiprocessing
import resource
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Sequence

from pebble import ProcessPool

from evora.config.schema import TaskConfig
from evora.tasks.base import CustomReward, Example, Task
from evora.tasks.registry import build_task, isolated_reward
from evora.tasks.scores import ERROR, FAILED, TIMEOUT, Outcome, Scorer, Scores, failure_message


class InProcessRewards:
    """Built-in rewards: pure, bounded functions, called directly."""

    def __init__(self, task: Task, penalty: float | None):
        self.task, self.penalty = task, penalty

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> Scores:
        return Scores.of([self._one(c, e) for c, e in zip(completions, examples)], self.penalty)

    def _one(self, completion: str, example: Example) -> Outcome:
        try:
            return Outcome(float(self.task.reward(completion, example)), bool(self.task.correct(completion, example)))
        except Exception as error:  # a reward bug must not kill a generation; it is counted
            return Outcome(failure=ERROR, message=failure_message(error))

    def close(self) -> None:
        pass


_task: Task | None = None  # the reward process's own task


def _start_reward_process(cfg: TaskConfig, seed: int, memory_mb: int | None) -> None:
    global _task
    if memory_mb is not None:  # a runaway allocation fails in the reward (MemoryError), not in the machine
        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _task = build_task(cfg, seed)


def _rewards(completions: list[str], examples: list[Example]) -> list[tuple[float, bool]]:
    """A call of a reward that scores one completion at a time (here, one)."""
    assert _task is not None
    return [(float(_task.reward(c, e)), bool(_task.correct(c, e))) for c, e in zip(completions, examples)]


def _batch_rewards(completions: list[str], examples: list[Example]) -> list[tuple[float, bool]]:
    """A batched reward's call: its rewards, each correct at the top of the task's range."""
    assert isinstance(_task, CustomReward) and _task.batched is not None
    rewards = [float(r) for r in _task.batched.score_batch(completions, examples)]
    if len(rewards) != len(completions):
        raise ValueError(f"score_batch returned {len(rewards)} rewards for {len(completions)} completions")
    return [(r, r >= _task.reward_range[1]) for r in rewards]


POOL_REBUILDS = 3  # a score call rebuilds a broken pool at most this often, then scores what is left as errors

Call = tuple[Callable[..., list[tuple[float, bool]]], list[int]]  # a function of the reward process, and its pairs


class RewardPool:
    """Scores (completion, example) pairs in reward processes: one call per pair, or per batch of
    `task.reward_batch_size` pairs for a reward declared with `@evora.batch_reward`."""

    def __init__(self, cfg: TaskConfig, seed: int, batched: bool = False):
        self.cfg, self.seed = cfg, seed
        self.timeout_s = cfg.reward_timeout_s
        self.batch = cfg.reward_batch_size if batched else 0
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

    def _calls(self, pending: list[int]) -> list[Call]:
        if not self.batch:
            return [(_rewards, [i]) for i in pending]
        return [(_batch_rewards, pending[s : s + self.batch]) for s in range(0, len(pending), self.batch)]

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> Scores:
        """Each pair's outcome. A reward process that dies while pebble has not yet marked its
        call as running (a race under load) breaks the whole pool and aborts every call in it:
        the pool is rebuilt and the aborted calls, and only those, are made again, so a fair
        reward's score never depends on that race."""
        outcomes: dict[int, Outcome] = {}
        pending = list(range(len(completions)))
        for _ in range(POOL_REBUILDS + 1):
            if not self.pool.active:
                self._rebuild()
            calls = self._calls(pending)
            futures = [
                self.pool.schedule(
                    function,
                    args=([completions[i] for i in pairs], [examples[i] for i in pairs]),
                    timeout=self.timeout_s,
                )
                for function, pairs in calls
            ]
            aborted: list[int] = []
            for (_, pairs), future in zip(calls, futures):
                try:
                    outcomes.update({i: Outcome(r, c) for i, (r, c) in zip(pairs, future.result())})
                except FutureTimeout:  # pebble killed and replaced the process
                    outcomes.update({i: Outcome(failure=TIMEOUT, message=f"past {self.timeout_s} s") for i in pairs})
                except BrokenProcessPool:  # aborted with the pool, whichever call broke it
                    aborted += pairs
                except Exception as error:  # it raised (MemoryError too), or its process died (ProcessExpired)
                    outcomes.update({i: Outcome(failure=ERROR, message=failure_message(error)) for i in pairs})
            if not aborted:
                break
            pending = aborted
        else:
            outcomes.update({index: FAILED for index in pending})
        return Scores.of([outcomes[i] for i in range(len(completions))], self.cfg.reward_penalty)

    def close(self) -> None:
        self.pool.stop()
        self.pool.join(timeout=10)


def _judge(task: Task, cfg: TaskConfig, device: str) -> Scorer:
    from evora.tasks.judge import JudgeRewards

    return JudgeRewards(cfg)


def _reward_model(task: Task, cfg: TaskConfig, device: str) -> Scorer:
    from evora.tasks.reward_model import RewardModelRewards

    return RewardModelRewards(cfg, device)


# task.reward values scored by a model (tasks.base.SERVED_REWARDS), imported only where they score
SERVED_SCORERS: dict[str, Callable[[Task, TaskConfig, str], Scorer]] = {"judge": _judge, "reward_model": _reward_model}


def reward_scorer(task: Task, cfg: TaskConfig, seed: int, device: str = "cpu") -> Scorer:
    """A served reward's scorer; the pool for a user's reward or task class; in-process scoring
    for built-ins. `device`: where a reward model runs (the engine worker's)."""
    if cfg.reward in SERVED_SCORERS:
        return SERVED_SCORERS[cfg.reward](task, cfg, device)
    if isolated_reward(cfg):
        return RewardPool(cfg, seed, batched=isinstance(task, CustomReward) and task.batched is not None)
    return InProcessRewards(task, cfg.reward_penalty)
