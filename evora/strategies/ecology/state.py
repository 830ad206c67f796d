"""The ecology's specs, payload and state (`strategy.py`), and the views of a state the
other parts share: working copies of its living organelles, its energy, its families."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from evora.strategies.ecology.economy import Organelle
from evora.strategies.protocol import Tensors

SERVE, PROBE = "serve", "probe"


@dataclass(frozen=True)
class EcoSpec:
    generation: int
    index: int
    op: str  # serve | probe
    organelle: int  # position in the payload
    prompts: tuple[int, ...]  # its episodes: the train examples routed to it
    member: int = 0  # probe pair
    sign: int = 1

    @property
    def label(self) -> str:
        if self.op == SERVE:
            return f"g{self.generation}-o{self.organelle}"
        return f"g{self.generation}-o{self.organelle}-p{self.member}{'+' if self.sign > 0 else '-'}"


@dataclass(frozen=True)
class EcologyPayload:
    generation: int
    adapters: tuple[Tensors, ...]
    ids: tuple[str, ...]
    noise_scales: dict[str, float]


@dataclass
class EcologyState:
    STATE_VERSION: ClassVar[int] = 1
    organelles: list[dict[str, Any]]  # Organelle.as_fields() of the living, in order of birth
    train_families: list[str]  # the family of each train example
    episodes_per_generation: int
    initial_energy: int  # total at the start (micro-units)
    next_id: int
    archive: dict[str, dict[str, Any]] = field(default_factory=dict)  # cell -> {id, roi, adapter}
    noise_scales: dict[str, float] = field(default_factory=dict)
    earned: int = 0  # micro-units, over the run
    spent: int = 0  # episode costs and upkeep
    upkeep_paid: int = 0
    retired_energy: int = 0  # what retired organelles took with them
    episodes: int = 0
    births: int = 0
    merges: int = 0
    retirements: int = 0
    # plasticity=sft: the last tell's successful episodes ({"organelle", "example", "completion"}), which the
    # refine that follows trains on and empties
    sft_batch: list[dict[str, Any]] = field(default_factory=list)


def living(state: EcologyState) -> list[Organelle]:
    """Working copies of the living organelles (the state's own lists and dicts are never changed)."""
    return [
        Organelle(
            **{
                **fields,
                "parents": list(fields["parents"]),
                "recent": list(fields["recent"]),
                "families": {k: list(v) for k, v in fields["families"].items()},
            }
        )
        for fields in state.organelles
    ]


def total_energy(state: EcologyState) -> int:
    return sum(o["energy"] for o in state.organelles)


def training_families(state: EcologyState) -> list[str]:
    return sorted(set(state.train_families))
