"""The reward failure budget: a judge that is down, or that answers garbage, stops the run rather
than train it on rewards nobody gave (docs/tasks.md, "Judges and reward models"); and whatever
the reward, a generation or an evaluation whose every reward failed stops it too, in one line
naming the reward, how its calls failed and what to change (not the strategy's settings: the
fitness it would have had is nobody's).

Below the budget, failed rewards are counted (`reward_errors`, `reward_timeouts`,
`reward_invalid`; `reward_failed`: the cells left out) and their cells left out of the fitness.
Above it, the generation (or the held-out evaluation) raises before it is checkpointed, so the
last checkpoint is the last good generation's and `evora resume=<run>` continues from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from evora.config.schema import TaskConfig
from evora.distributed.worker import UnitResult
from evora.errors import RunError
from evora.tasks.registry import isolated_reward
from evora.tasks.scores import ERROR, INVALID, TIMEOUT, RewardCounts

# What to change, by how a reward's calls failed, for each kind of reward (formatted with the task config).
Fixes = Mapping[str, str]
USER_FIXES: Fixes = {
    TIMEOUT: "task.reward_timeout_s={task.reward_timeout_s:g}, each call's deadline",
    ERROR: "the reward's code, or task.reward_memory_mb={task.reward_memory_mb} if it ran out of memory",
    INVALID: "the reward's return values",
}
BUILT_IN_FIXES: Fixes = {ERROR: "the task's reward: a bug, the first failure says where"}
JUDGE_FIXES: Fixes = {
    TIMEOUT: "task.judge.timeout_s={task.judge.timeout_s:g} a request, "
    "task.judge.call_timeout_s={task.judge.call_timeout_s:g} a unit's requests",
    ERROR: "task.judge.url: does the judge answer there?",
    INVALID: "task.judge.template and task.judge.score_pattern: no score in task.judge.score_range",
}
REWARD_MODEL_FIXES: Fixes = {
    ERROR: "task.reward_model.path",
    INVALID: "task.reward_model.dtype={task.reward_model.dtype}: its scores were not finite",
}
KIND_NAMES = {TIMEOUT: "timeouts", ERROR: "errors", INVALID: "invalid scores"}


@dataclass(frozen=True)
class FailureBudget:
    source: str  # what gives the rewards: "task.reward=mypkg:score", "judge at <url>"
    fixes: dict[str, str]  # failure kind -> what to change
    rate: float | None = None  # the largest failed share of a generation's rewards; None: any, short of all
    key: str = ""  # the setting that holds `rate`

    def exceeded(self, counts: RewardCounts) -> bool:
        if counts.calls == 0:
            return False
        if counts.failures == counts.calls:  # no reward at all: nothing to learn from, whatever the budget
            return True
        return self.rate is not None and counts.failures / counts.calls > self.rate


def _budget(source: str, table: Fixes, task: TaskConfig, rate: float | None = None, key: str = "") -> FailureBudget:
    return FailureBudget(source, {kind: fix.format(task=task) for kind, fix in table.items()}, rate, key)


def _judge(task: TaskConfig) -> FailureBudget:
    rate = task.judge.max_error_rate
    return _budget(f"judge at {task.judge.url}", JUDGE_FIXES, task, rate, "task.judge.max_error_rate")


def _reward_model(task: TaskConfig) -> FailureBudget:
    return _budget(f"reward model task.reward_model.path={task.reward_model.path}", REWARD_MODEL_FIXES, task)


# task.reward -> its budget; a user's reward and a task's own have none short of every reward failing
BUDGETS: dict[str, Callable[[TaskConfig], FailureBudget]] = {"judge": _judge, "reward_model": _reward_model}


def failure_budget(task: TaskConfig) -> FailureBudget:
    if task.reward in BUDGETS:
        return BUDGETS[task.reward](task)
    if isolated_reward(task):
        return _budget(f"task.reward={task.reward}" if task.reward else f"task.name={task.name}", USER_FIXES, task)
    return _budget(f"task={task.name}'s reward", BUILT_IN_FIXES, task)


def check_reward_failures(results: list[UnitResult], budget: FailureBudget | None, what: str) -> None:
    """One line naming the reward, its failures by kind, the first failure and what to change,
    when every reward failed or the failed share passes the budget (`budget` None: no check)."""
    counts = RewardCounts.total([r.reward for r in results])
    if budget is None or not budget.exceeded(counts):
        return
    calls, failures = counts.calls, counts.failures
    share = "all" if failures == calls else f"{failures} of"
    held = f"{failures / calls:.0%}; {budget.key}={budget.rate:g}; " if budget.key else ""
    failed = {kind: n for kind, n in counts.by_kind().items() if n}
    kinds = ", ".join(f"{n} {KIND_NAMES[kind]}" for kind, n in failed.items())
    fixes = "; ".join(f"{budget.fixes.get(kind, 'the reward')} (the {KIND_NAMES[kind]})" for kind in failed)
    raise RunError(
        f"{what}: {share} {calls} rewards from {budget.source} failed ({held}{kinds}); the first: "
        f"{counts.message.rstrip('.') or 'no message'}. Look at {fixes}. The run stops before this is "
        "checkpointed: evora resume=<run folder> goes on from its last checkpoint (or its start)"
    )
