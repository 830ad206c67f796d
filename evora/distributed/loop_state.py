"""The run loop's own state, beside the strategy's: where the run is, what the base model and the
last center scored, the best center so far, the compute ledger, (full-weight strategies) the
weight snapshots to keep, and why the strategy ended the run, once it has (`Told.stop`: a resume
then runs no more generations). A checkpoint stores it as plain data (`to_saved` / `from_saved`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from evora.lora import Tensors
from evora.tracking.compute import ComputeLedger


@dataclass
class Best:
    score: float  # the fitness it was chosen by: on the selection split if there is one, else held-out
    generation: int
    adapter: Tensors
    heldout: dict[str, float]  # its held-out metrics


@dataclass
class LoopState:
    ledger: ComputeLedger
    next_generation: int = 0
    base: dict[str, float] | None = None  # the base model's held-out metrics
    last: dict[str, float] | None = None  # the latest center's held-out metrics
    best: Best | None = None
    weight_snapshots: list[int] = field(default_factory=list)
    stopped: str | None = None  # the strategy ended the run at next_generation, and why (Told.stop)

    def to_saved(self) -> dict[str, Any]:
        return {
            "next_generation": self.next_generation,
            "base": self.base,
            "last": self.last,
            "best": None if self.best is None else asdict(self.best),
            "compute": self.ledger.state(),
            "weight_snapshots": list(self.weight_snapshots),
            "stopped": self.stopped,
        }

    @classmethod
    def from_saved(cls, loop: dict[str, Any]) -> LoopState:
        return cls(
            ComputeLedger.from_state(loop["compute"]),
            loop["next_generation"],
            loop["base"],
            loop["last"],
            Best(**loop["best"]) if loop["best"] else None,
            list(loop.get("weight_snapshots", [])),
            loop.get("stopped"),  # absent from checkpoints written before strategies could stop a run
        )
