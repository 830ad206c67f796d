"""Compute budgets for gradient baselines: stop when the search has spent so many FLOPs,
tokens or seconds, or as much as another run did (`match=<run dir>`, the compute-matched
baseline of the ecology work). Measured as the run's ledger measures it (search only,
held-out evaluation apart; evora/tracking/compute.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from evora.config.checks import choice, fail, require

MEASURES = ("flops", "tokens", "seconds")


@dataclass(frozen=True)
class BudgetFields:
    """Config fields of a strategy that can run to a budget (at most one of the four)."""

    budget_flops: Optional[float] = None  # search FLOPs (2 x P x tokens inferred, 6 x P x tokens trained)
    budget_tokens: Optional[int] = None  # search tokens: prompt + generated + scored + trained
    budget_seconds: Optional[float] = None  # search wall-clock seconds
    match: Optional[str] = None  # a finished run folder: spend what its search spent, by match_by
    match_by: str = "flops"  # flops | tokens | seconds


@dataclass(frozen=True)
class Budget:
    measure: str  # flops | tokens | seconds
    limit: float
    source: str  # the key it came from, for messages and the summary

    def spent(self, usage: Mapping[str, float]) -> bool:
        return usage[self.measure] >= self.limit


def matched_run(cfg: Any) -> str | None:
    """The run folder a strategy config matches (`strategy.match`), if it runs to budgets."""
    return cfg.match if isinstance(cfg, BudgetFields) else None


def check_budget(cfg: BudgetFields) -> None:
    given = [k for k in ("budget_flops", "budget_tokens", "budget_seconds", "match") if vars(cfg)[k] is not None]
    if len(given) > 1:
        second = given[1]
        raise fail(f"strategy.{second}", vars(cfg)[second], f"one budget at a time; strategy.{given[0]} is set too")
    for key in ("budget_flops", "budget_tokens", "budget_seconds"):
        value = vars(cfg)[key]
        require(value is None or value > 0, f"strategy.{key}", value, "must be > 0, or null")
    choice("strategy.match_by", cfg.match_by, MEASURES)


def budget_of(cfg: Any, matched: Mapping[str, float] | None = None) -> Budget | None:
    """The budget a strategy config sets; `matched`: the search usage of the strategy.match run."""
    if not isinstance(cfg, BudgetFields):
        return None
    for measure in MEASURES:
        value = vars(cfg)[f"budget_{measure}"]
        if value is not None:
            return Budget(measure, float(value), f"strategy.budget_{measure}")
    if cfg.match is None:
        return None
    assert matched is not None, "strategy.match needs the matched run's usage"
    return Budget(cfg.match_by, float(matched[cfg.match_by]), f"strategy.match={cfg.match}")
