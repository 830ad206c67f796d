"""A generation (or evaluation) whose every reward failed stops in one line naming the reward, how
its calls failed and the key to change, whatever the reward; a judge's budget stops it earlier;
failures short of those are counted and the run goes on (issue 54, point 6)."""

from __future__ import annotations

import numpy as np
import pytest

from evora.config.schema import JudgeConfig
from evora.distributed.reward_failures import check_reward_failures, failure_budget
from evora.distributed.worker import UnitResult
from evora.errors import RunError
from evora.tasks import build_task, task_config
from evora.tasks.base import Example
from evora.tasks.reward_pool import RewardPool, reward_scorer
from evora.tasks.scores import ERROR, INVALID, TIMEOUT, Outcome, RewardCounts, Scores


def unit(counts: RewardCounts) -> UnitResult:
    """A work unit's result holding `counts` (one candidate row over its calls)."""
    row = np.zeros((1, counts.calls))
    return UnitResult([0], row, row > 0, row.astype(int), counts, {}, 0, 0.0)


def counted(*failures: str | None, message: str = "it failed") -> RewardCounts:
    """The counts of a unit whose calls ended as `failures` (None: scored)."""
    outcomes = [Outcome(1.0) if f is None else Outcome(failure=f, message=message) for f in failures]
    return Scores.of(outcomes, None).counts(sum(f is not None for f in failures))


def stop_line(task, *units: RewardCounts, what: str = "generation 2") -> str:
    with pytest.raises(RunError) as stopped:
        check_reward_failures([unit(u) for u in units], failure_budget(task), what)
    line = str(stopped.value)
    assert "\n" not in line
    return line


def test_a_user_reward_that_always_times_out_stops_naming_it_and_its_deadline():
    """The issue's reward, through the real reward processes: every call passes its deadline."""
    task = task_config("addition", reward="hostile_rewards:sleeps_forever", reward_timeout_s=0.5)
    examples = build_task(task, 0).splits().heldout[:2]
    pool = RewardPool(task, 0)
    try:
        scores = pool.score(["1", "2"], examples)
    finally:
        pool.close()
    line = stop_line(task, scores.counts(2), what="heldout evaluation after generation 0")
    assert line.startswith(
        "heldout evaluation after generation 0: all 2 rewards from task.reward=hostile_rewards:sleeps_forever "
        "failed (2 timeouts); the first: past 0.5 s. Look at task.reward_timeout_s=0.5, each call's deadline"
    )
    assert "strategy." not in line and "evora resume=" in line


def test_every_kind_of_failure_is_counted_and_each_names_its_key():
    task = task_config("addition", reward="mypkg.rewards:score", reward_memory_mb=512, reward_penalty=0.0)
    line = stop_line(task, counted(TIMEOUT, TIMEOUT, ERROR), counted(ERROR, message="ValueError: a reward bug"))
    assert "all 4 rewards from task.reward=mypkg.rewards:score failed (2 timeouts, 2 errors)" in line
    assert "the first: it failed" in line
    assert "task.reward_timeout_s=10, each call's deadline (the timeouts)" in line
    assert "the reward's code, or task.reward_memory_mb=512 if it ran out of memory (the errors)" in line


def test_a_share_short_of_all_is_counted_and_the_run_goes_on():
    task = task_config("addition", reward="mypkg.rewards:score")
    check_reward_failures([unit(counted(TIMEOUT, None)), unit(counted(ERROR, ERROR))], failure_budget(task), "g")
    check_reward_failures([unit(RewardCounts())], failure_budget(task), "g")  # no calls: nothing failed


def test_a_task_class_by_import_path_is_named_by_its_name():
    task = task_config("evora.tasks.builtin.addition:AdditionTask")
    assert "from task.name=evora.tasks.builtin.addition:AdditionTask failed (1 errors)" in stop_line(
        task, counted(ERROR)
    )


def test_a_built_in_reward_that_always_raises_names_the_task():
    task = task_config("countdown")
    broken = Example("2 + 2", "4")  # no numbers or target: the countdown reward raises on it
    scores = reward_scorer(build_task(task, 0), task, 0).score(["<answer>4</answer>"], [broken])
    line = stop_line(task, scores.counts(1))
    assert "all 1 rewards from task=countdown's reward failed (1 errors); the first: KeyError: 'numbers'" in line
    assert "the task's reward: a bug" in line


def test_a_judge_over_its_budget_stops_and_names_its_keys():
    judge = JudgeConfig(url="http://judge:8000/v1", model="judge", max_error_rate=0.25, timeout_s=30.0)
    task = task_config("addition", reward="judge", judge=judge)
    line = stop_line(task, counted(TIMEOUT, INVALID, None, None), what="generation 3")
    assert line.startswith(
        "generation 3: 2 of 4 rewards from judge at http://judge:8000/v1 failed "
        "(50%; task.judge.max_error_rate=0.25; 1 timeouts, 1 invalid scores)"
    )
    timeouts = "task.judge.timeout_s=30 a request, task.judge.call_timeout_s=600 a unit's requests (the timeouts)"
    assert timeouts in line and "task.judge.score_pattern" in line
    check_reward_failures([unit(counted(TIMEOUT, None, None, None))], failure_budget(task), "g")  # 25%: within


def test_every_reward_failing_stops_a_judge_whose_budget_allows_all():
    judge = JudgeConfig(url="http://judge:8000/v1", model="judge", max_error_rate=1.0)
    task = task_config("addition", reward="judge", judge=judge)
    line = stop_line(task, counted(ERROR, ERROR, message="http://judge:8000/v1: ConnectError: refused"))
    assert (
        "all 2 rewards from judge at http://judge:8000/v1 failed (100%; task.judge.max_error_rate=1; 2 errors)" in line
    )
    assert "task.judge.url: does the judge answer there? (the errors)" in line


def test_an_evaluation_without_a_budget_is_not_checked():
    """`evora eval` passes none: it reports what it measured."""
    check_reward_failures([unit(counted(ERROR, ERROR))], None, "heldout evaluation")


def test_counts_by_kind():
    assert counted(TIMEOUT, ERROR, ERROR, INVALID, None).by_kind() == {TIMEOUT: 1, ERROR: 2, INVALID: 1}


def test_held_out_means_are_over_the_examples_every_op_scored_and_failures_are_counted():
    """Base and center on 4 held-out examples, the judge failing on the base's 0 and the center's 3:
    both means are over examples 1 and 2 (identical weights then score identically), and each op
    reports the 2 it left out (metrics.jsonl's heldout_reward_failed)."""
    from evora.distributed.evaluate import SplitOutcome, paired_scored

    rewards = np.array([[np.nan, 4.0, 6.0, 8.0], [4.0, 4.0, 6.0, np.nan]])
    evaluated = np.isfinite(rewards)
    result = UnitResult([0, 1], rewards, evaluated, np.ones_like(rewards, dtype=int), RewardCounts(), {}, 0, 0.0,
                        evaluated=evaluated)  # fmt: skip
    paired = paired_scored([result], 2)
    assert paired.tolist() == [False, True, True, False]
    metrics = [
        SplitOutcome(rewards[row], evaluated[row], np.ones(4), None, None, scored=paired).metrics() for row in (0, 1)
    ]
    assert [m["reward"] for m in metrics] == [5.0, 5.0] and [m["reward_failed"] for m in metrics] == [2, 2]
    assert "reward_failed" not in SplitOutcome(rewards[0], evaluated[0], np.ones(4), None, None).metrics(kept=paired)


def test_a_candidate_with_no_scored_reward_is_counted_not_spread_as_nan():
    from evora.distributed.search import population_stats
    from evora.strategies.protocol import GenerationResults

    rewards = np.array([[1.0, 3.0], [np.nan, np.nan], [5.0, 7.0]])
    evaluated = np.isfinite(rewards)
    results = GenerationResults(0, (0, 1), rewards, evaluated, np.ones((3, 2)), None, np.zeros(3), evaluated)
    stats = population_stats(results, with_fitness=False)
    assert stats["reward_mean"] == 4.0 and stats["reward_min"] == 2.0 and stats["candidates_unscored"] == 1
    assert all(np.isfinite(v) for v in stats.values())
