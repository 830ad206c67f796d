"""The run plan as the launcher hands it to the driver actor: a reference to it in Ray's
object store."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

if TYPE_CHECKING:
    from evora.plan.run_plan import RunPlan


@dataclass(frozen=True)
class PlanRef:
    """The run plan in Ray's object store, which the launcher owns for the run's life: a
    reference held inside a small argument is not resolved by Ray, so `run`'s arguments stay
    inline."""

    ref: Any

    def get(self) -> RunPlan:
        return ray.get(self.ref)
