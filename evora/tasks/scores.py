"""A reward's outcome per completion, and a batch's scores: what every scorer returns (built-in
rewards, a user's reward in its processes, a judge, a reward model)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

from evora.tasks.base import Example

# Why a reward failed: it raised or its process died | it passed its deadline | it gave no valid score
ERROR, TIMEOUT, INVALID = "error", "timeout", "invalid"


@dataclass(frozen=True)
class Outcome:
    """One completion's reward, or why there is none."""

    reward: float = math.nan
    correct: bool = False
    failure: Optional[str] = None  # ERROR | TIMEOUT | INVALID; None: scored
    message: str = ""  # what went wrong, for the one line that stops a run


FAILED = Outcome(failure=ERROR)


@dataclass(frozen=True)
class Scores:
    rewards: list[float]  # NaN where the reward failed (unless task.reward_penalty scores it)
    correct: list[bool]
    failed: list[bool]  # rewards left out of the fitness and the metrics
    errors: int = 0  # calls that raised, failed to reach a judge, or whose reward process died
    timeouts: int = 0  # calls past their deadline
    invalid: int = 0  # answers that gave no valid score (a judge's reply)
    message: str = ""  # the first failure's

    def counts(self, failed_cells: int) -> RewardCounts:
        return RewardCounts(len(self.rewards), self.errors, self.timeouts, self.invalid, failed_cells, self.message)

    @classmethod
    def of(cls, outcomes: Sequence[Outcome], penalty: float | None) -> Scores:
        """`penalty` None: failed rewards are NaN and marked failed; a number: they score it."""
        failed = [o.failure is not None for o in outcomes]
        unscored = math.nan if penalty is None else penalty
        return cls(
            rewards=[unscored if bad else float(o.reward) for o, bad in zip(outcomes, failed)],
            correct=[o.correct and not bad for o, bad in zip(outcomes, failed)],
            failed=[bad and penalty is None for bad in failed],
            errors=sum(o.failure == ERROR for o in outcomes),
            timeouts=sum(o.failure == TIMEOUT for o in outcomes),
            invalid=sum(o.failure == INVALID for o in outcomes),
            message=next((o.message for o in outcomes if o.failure is not None and o.message), ""),
        )


@dataclass(frozen=True)
class RewardCounts:
    """A unit's (or a generation's) failed rewards, for metrics.jsonl and the failure budget."""

    calls: int = 0  # rewards asked for (every sample's)
    errors: int = 0
    timeouts: int = 0
    invalid: int = 0
    failed: int = 0  # cells left out because a reward of theirs failed
    message: str = ""  # the first failure's

    @property
    def failures(self) -> int:
        return self.errors + self.timeouts + self.invalid

    def by_kind(self) -> dict[str, int]:
        """Failed calls by how they failed (TIMEOUT, ERROR, INVALID)."""
        return {TIMEOUT: self.timeouts, ERROR: self.errors, INVALID: self.invalid}

    def record(self) -> dict[str, int]:
        """The keys metrics.jsonl holds."""
        return {"reward_errors": self.errors, "reward_timeouts": self.timeouts, "reward_invalid": self.invalid,
                "reward_failed": self.failed}  # fmt: skip

    @classmethod
    def total(cls, parts: Sequence[RewardCounts]) -> RewardCounts:
        return cls(
            calls=sum(p.calls for p in parts),
            errors=sum(p.errors for p in parts),
            timeouts=sum(p.timeouts for p in parts),
            invalid=sum(p.invalid for p in parts),
            failed=sum(p.failed for p in parts),
            message=next((p.message for p in parts if p.message), ""),
        )


class Scorer(Protocol):
    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> Scores: ...

    def close(self) -> None: ...


def failure_message(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]
