"""The driver as the launcher creates it: a Ray actor whose run loop (`driver.Driver`, torch
and the strategies' code) is imported inside the actor's own process, so that the CLI that
launches a run imports no torch."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from evora.distributed.plan_ref import PlanRef


class DriverActor:
    """`driver.Driver` behind the launcher's calls. Restartable (max_restarts): its constructor
    takes no object-store reference, which Ray warns a restart could lose; the plan comes with
    `run`, which the launcher calls again after a restart."""

    def __init__(self, run_dir: str):
        from evora.distributed.driver import Driver

        self.driver = Driver(run_dir)

    def run(self, plan_ref: PlanRef) -> Iterator[Mapping[str, Any]]:
        """The run's events, streamed (the launcher calls it with num_returns="streaming")."""
        yield from self.driver.run(plan_ref)
