"""The reward failure budget: a judge that is down, or that answers garbage, stops the run rather
than train it on rewards nobody gave (docs/tasks.md, "Judges and reward models").

Below the budget, failed rewards are counted (`reward_errors`, `reward_timeouts`,
`reward_invalid`; `reward_failed`: the cells left out) and their cells left out of the fitness.
Above it, the generation (or the held-out evaluation) raises before it is checkpointed, so the
last checkpoint is the last good generation's and `evora resume=<run>` continues from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from evora.config.schema import TaskConfig
from evora.distributed.worker import UnitResult
from evora.errors import RunError
from evora.tasks.scores import RewardCounts


@dataclass(frozen=True)
class FailureBudget:
    rate: float  # the largest failed share of a generation's rewards
    key: str  # the setting that holds it
    source: str  # what serves the rewards (a judge's URL)


def _judge(task: TaskConfig) -> FailureBudget:
    return FailureBudget(task.judge.max_error_rate, "task.judge.max_error_rate", f"judge at {task.judge.url}")


# task.reward -> its budget; rewards not listed have none (a user's reward: failures are counted and left out)
BUDGETS: dict[str, Callable[[TaskConfig], FailureBudget]] = {"judge": _judge}


def failure_budget(task: TaskConfig) -> FailureBudget | None:
    return BUDGETS[task.reward](task) if task.reward in BUDGETS else None


def check_reward_failures(results: list[UnitResult], budget: FailureBudget | None, what: str) -> None:
    """One line naming the source, the share and the first failure, when the share passes the budget."""
    counts = RewardCounts.total([r.reward for r in results])
    calls, failures, first = counts.calls, counts.failures, counts.message
    if budget is None or calls == 0 or failures / calls <= budget.rate:
        return
    raise RunError(
        f"{what}: {failures} of {calls} rewards from the {budget.source} failed ({failures / calls:.0%}; "
        f"{budget.key}={budget.rate:g}); the first: {first.rstrip('.')}. The run stops at its last good generation's "
        "checkpoint: evora resume=<run folder> goes on from there"
    )
