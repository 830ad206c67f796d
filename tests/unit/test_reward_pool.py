"""User rewards run in reward processes with a deadline: hanging, crashing, exiting and
memory-eating rewards fail (or score the penalty where one is set), are counted, and the pool
goes on; a batched reward is called once per batch."""

from __future__ import annotations

import math
import time

import pytest

from evora.tasks import build_task, task_config
from evora.tasks.reward_pool import InProcessRewards, RewardPool, reward_scorer
from evora.tasks.scores import TIMEOUT, Outcome, Scores


def pool_for(reward: str, **task) -> tuple[RewardPool, tuple]:
    cfg = task_config(
        "addition",
        reward=f"hostile_rewards:{reward}",
        reward_penalty=-1.0,
        reward_timeout_s=2.0,
        reward_memory_mb=512,
        **task,
    )
    examples = build_task(cfg, 0).splits().heldout[:4]
    return RewardPool(cfg, 0), examples


@pytest.mark.parametrize(
    ("reward", "errors", "timeouts"),
    [("sleeps_forever", 0, 3), ("segfaults", 3, 0), ("exits", 3, 0), ("eats_memory", 3, 0), ("raises", 3, 0)],
)
def test_a_hostile_reward_scores_the_penalty_and_the_pool_recovers(reward, errors, timeouts):
    pool, examples = pool_for(reward)
    try:
        started = time.monotonic()
        scores = pool.score(["x"] * 3, examples[:3])
        assert (scores.errors, scores.timeouts) == (errors, timeouts)
        assert scores.rewards == [-1.0] * 3 and scores.correct == [False] * 3
        # Bounded: the reward sleeps for an hour; deadlines end it in seconds (a loaded machine
        # may take a while to start the reward processes, hence the wide margin).
        assert time.monotonic() - started < 300
    finally:
        pool.close()


def test_the_pool_scores_like_the_task_and_keeps_order():
    cfg = task_config("addition", reward="hostile_rewards:mixed", reward_timeout_s=2.0, reward_memory_mb=512)
    task = build_task(cfg, 0)
    examples = [e for e in task.splits().heldout if int(e.answer) % 23 != 0][:12]
    completions = [e.answer if i % 3 else "wrong" for i, e in enumerate(examples)]
    pool = RewardPool(cfg, 0)
    try:
        scores = pool.score(completions, examples)
    finally:
        pool.close()
    assert scores.rewards == [0.0 if i % 3 == 0 else 1.0 for i in range(12)]
    assert scores.correct == [i % 3 != 0 for i in range(12)]
    assert (scores.errors, scores.timeouts) == (0, 0)


def test_the_pool_replaces_dead_processes_and_goes_on():
    cfg = task_config("addition", reward="hostile_rewards:mixed", reward_timeout_s=2.0, reward_memory_mb=512)
    task = build_task(cfg, 0)
    pool_examples = task.splits().train
    hostile = [e for e in pool_examples if int(e.answer) % 23 == 0]
    by_kind = {(int(e.answer) // 23) % 4: e for e in hostile}
    fair = [e for e in pool_examples if int(e.answer) % 23 != 0][:8]
    examples = [by_kind[k] for k in range(4)] + fair
    pool = RewardPool(cfg, 0)
    try:
        scores = pool.score([e.answer for e in examples], examples)
    finally:
        pool.close()
    assert scores.timeouts == 1  # sleeps forever
    assert scores.errors == 3  # segfault, os._exit, MemoryError
    assert scores.rewards[4:] == [1.0] * 8  # answered by replacement processes


def test_built_in_rewards_stay_in_process():
    cfg = task_config("addition")
    assert isinstance(reward_scorer(build_task(cfg, 0), cfg, 0), InProcessRewards)
    user = task_config("addition", reward="custom_example:shout_score")
    scorer = reward_scorer(build_task(user, 0), user, 0)
    try:
        assert isinstance(scorer, RewardPool)
    finally:
        scorer.close()
    task_class = task_config("custom_example:EvenSumsTask")
    scorer = reward_scorer(build_task(task_class, 0), task_class, 0)
    try:
        assert isinstance(scorer, RewardPool)
    finally:
        scorer.close()


def test_a_pool_broken_between_calls_is_rebuilt_and_scores_like_a_fresh_one():
    """Reward processes that die while pebble runs no call of theirs break the whole pool (pebble:
    "All workers expired"; under load, a crash before pebble marked its call as running does the
    same). The next call rebuilds the pool and scores as a fresh pool does."""
    import os
    import signal

    pool, examples = pool_for("its_pid")
    try:
        pids = {int(r) for r in pool.score(["x"] * 8, examples[:4] * 2).rewards}
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while pool.pool.active and time.monotonic() < deadline:  # pebble notices within its poll
            time.sleep(0.05)
        assert not pool.pool.active
        scores = pool.score(["x"] * 4, examples[:4])
        assert (scores.errors, scores.timeouts) == (0, 0)
        assert all(r > 0 and int(r) not in pids for r in scores.rewards)  # the new pool's processes
    finally:
        pool.close()


def test_a_batch_reward_is_called_per_batch_and_a_failed_batch_fails_its_cells_only():
    """@evora.batch_reward: one call per task.reward_batch_size completions (each call in some reward
    process, so a batch shares one pid); a batch that raises fails exactly its cells, which are
    NaN and marked failed (task.reward_penalty null), while the other batches score."""
    cfg = task_config("addition", reward="hostile_rewards:batch_pids", reward_batch_size=4, reward_workers=2)
    examples = build_task(cfg, 0).splits().train[:10]
    pool = reward_scorer(build_task(cfg, 0), cfg, 0)
    try:
        assert isinstance(pool, RewardPool) and pool.batch == 4
        pids = pool.score(["x"] * 10, examples).rewards
    finally:
        pool.close()
    assert len(set(pids[0:4])) == len(set(pids[4:8])) == len(set(pids[8:10])) == 1  # one call each

    cfg = task_config("addition", reward="hostile_rewards:batch_raising_on_23", reward_batch_size=3)
    train = build_task(cfg, 0).splits().train
    hostile = next(e for e in train if int(e.answer) % 23 == 0)
    fair = [e for e in train if int(e.answer) % 23 != 0][:5]
    examples = [fair[0], hostile, fair[1], fair[2], fair[3], fair[4]]  # batches [0, 1, 2] and [3, 4, 5]
    pool = RewardPool(cfg, 0, batched=True)
    try:
        scores = pool.score([e.answer for e in examples], examples)
    finally:
        pool.close()
    assert scores.failed == [True] * 3 + [False] * 3 and scores.errors == 3
    assert all(math.isnan(r) for r in scores.rewards[:3]) and scores.rewards[3:] == [1.0] * 3
    assert scores.correct == [False] * 3 + [True] * 3 and "divisible by 23" in scores.message


def test_a_failed_reward_is_left_out_unless_a_penalty_scores_it():
    outcomes = [Outcome(0.5, False), Outcome(failure=TIMEOUT, message="late"), Outcome(1.0, True)]
    left_out = Scores.of(outcomes, None)
    assert left_out.failed == [False, True, False] and math.isnan(left_out.rewards[1])
    assert (left_out.timeouts, left_out.counts(1).failures, left_out.message) == (1, 1, "late")
    scored = Scores.of(outcomes, -1.0)
    assert scored.failed == [False] * 3 and scored.rewards == [0.5, -1.0, 1.0] and scored.timeouts == 1
