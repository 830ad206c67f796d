"""The events a run streams to its console (`evora.tracking.progress`): typed where their keys
are fixed. A generation's event is its metrics record (open-ended: strategies add their own
statistics) with `kind`, `generations` and `pool_events`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, NotRequired, TypedDict, Union


@dataclass(frozen=True)
class WorkerLost:
    """An engine worker died, or gave no result in `hung_s` seconds and was killed; its units are
    rerun on the others (the results do not change)."""

    worker: int
    hung_s: float | None = None


@dataclass(frozen=True)
class WorkerReplaced:
    worker: int
    node: str  # the Ray node it started on


PoolEvent = Union[WorkerLost, WorkerReplaced]  # what the worker pool reports between generations


class StartEvent(TypedDict):
    kind: Literal["start"]
    strategy: str
    generations: int | None  # None: the run ends on a budget
    start: int  # the first generation this session runs (a resume's is past 0)
    workers: int
    base_heldout: float | None  # the base model's held-out reward; None where a job has none
    resumed: bool
    adapter_parameters: int | None  # per candidate; None where candidates are no adapters
    setup_seconds: float
    population: NotRequired[int]  # a job whose members report themselves: no generation bar
    full_weights: NotRequired[int]  # a full-weight strategy: the weights it moves
    master_bytes: NotRequired[int]  # ... and the memory of its master copies, per worker
    master_device: NotRequired[str]  # ... where they live: cuda (beside the engine) | cpu (the host)
    units: NotRequired[int]  # the work units a generation is cut into (engine.units, hardware.min_units)
    device_change: NotRequired[str]  # a resume drawing its noise on another device class: one line


class FinalEvent(TypedDict):
    kind: Literal["final"]
    summary: dict[str, Any]  # eval/summary.json
    run_dir: str


Event = Mapping[str, Any]  # any of them, as the console takes it
OnEvent = Callable[[Event], None]
