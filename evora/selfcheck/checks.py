"""What a self-check is, and the registry `evora doctor --run` and bench/gpu_check.py read.

A check has a name, one line on what passing it proves, a test of whether it can run on this
node (`skip`: the reason it cannot, or None) and the function that runs it. A check that cannot
run says "skipped: <why>", never "passed"; one that raises has failed, and the others still run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from evora.config.schema import RunConfig
from evora.engines.base import EngineSpec

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True)
class Node:
    """Where and at what sizes the checks run."""

    device: str  # cuda | cpu: where the checks' tensors and engines go
    size: int  # the width of the numeric checks' matrices
    prompts: int  # prompts per candidate in the engine checks
    engine: str  # the engine the engine checks build, by its registered name
    spec: EngineSpec  # what that engine is built from (the run's model, dtype, sizes)
    overrides: tuple[str, ...] = ()  # the user's `evora doctor --run` overrides: a check's run uses them
    run: RunConfig | None = None  # the run those overrides compose (None: checks that need it skip)


@dataclass(frozen=True)
class Finding:
    passed: bool
    detail: str  # what was measured, in one line
    fix: str = ""  # for a failure: the key or package to change


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # passed | failed | skipped
    detail: str
    seconds: float
    fix: str = ""


def runs_anywhere(node: Node) -> str | None:
    return None


@dataclass(frozen=True)
class Check:
    name: str
    proves: str  # one line: what passing it shows
    run: Callable[[Node], Finding]
    skip: Callable[[Node], str | None] = runs_anywhere  # why it cannot run on this node, or None


CHECKS: dict[str, Check] = {}  # in registration order: the report's


def register_check(check: Check) -> Check:
    if check.name in CHECKS:
        raise ValueError(f"self-check {check.name!r} is registered twice")
    CHECKS[check.name] = check
    return check


def run_check(check: Check, node: Node) -> CheckResult:
    reason = check.skip(node)
    if reason is not None:
        return CheckResult(check.name, SKIPPED, reason, 0.0)
    start = time.perf_counter()
    try:
        finding = check.run(node)
    except Exception as error:  # a check that breaks has failed; the others still run
        finding = Finding(False, f"{type(error).__name__}: {error}")
    status = PASSED if finding.passed else FAILED
    return CheckResult(check.name, status, finding.detail, time.perf_counter() - start, finding.fix)
