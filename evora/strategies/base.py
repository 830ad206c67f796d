"""The protocol every strategy follows, and the candidate spec that crosses the network.

A candidate is never sent as weights: it is a spec a worker rebuilds exactly from the
generation's payload (ES: the mean adapter) with `materialise`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

Tensors = dict[str, torch.Tensor]

PERTURB = "perturb"  # payload + seeded noise
CENTER = "center"  # the payload's own adapter (ES mean)
BASE = "base"  # no adapter: the base model


@dataclass(frozen=True)
class CandidateSpec:
    generation: int
    index: int  # position in the population; fitness is reported in this order
    member: int = 0  # noise member id (the pair index when antithetic)
    sign: int = 1
    op: str = PERTURB

    @property
    def label(self) -> str:
        if self.op != PERTURB:
            return f"g{self.generation}-{self.op}"
        return f"g{self.generation}-c{self.index}{'+' if self.sign > 0 else '-'}"


class Strategy(Protocol):
    """Payloads are dicts whose "theta" is the adapter a CENTER spec stands for."""

    center_name: str  # what the center adapter is called in the run folder (mean, elite)

    def initial_state(self, adapter: Tensors) -> dict[str, Any]:
        """Plain-data state (tensors, numbers) that a checkpoint stores as it is."""

    def ask(self, state: dict[str, Any], generation: int) -> tuple[list[CandidateSpec], Any]:
        """The generation's candidate specs and its payload (sent once, via the object store)."""

    def tell(self, state: dict[str, Any], specs: list[CandidateSpec], fitness: np.ndarray
             ) -> tuple[dict[str, Any], dict[str, float]]:
        """The next state, and scalar statistics for logging hooks."""

    def materialise(self, payload: Any, spec: CandidateSpec) -> Tensors:
        """A PERTURB candidate's adapter tensors (fp32)."""

    def center(self, state: dict[str, Any]) -> Tensors:
        """The adapter the state stands for (ES: the mean), for evaluation and export."""


def materialise(strategy: Strategy, payload: dict[str, Any], spec: CandidateSpec) -> Tensors | None:
    """Any spec's adapter: None for BASE, the payload's theta for CENTER, else the strategy's."""
    if spec.op == BASE:
        return None
    if spec.op == CENTER:
        return payload["theta"]
    return strategy.materialise(payload, spec)
