"""The ecology's organelles and their energy, in whole micro-units so that every sum is exact.

An episode (one example served by one organelle) earns reward x reward_price and costs
episode_fee + token_price x generated tokens; its ROI is the difference. Every living
organelle also pays an upkeep each generation (a cost). Energy only moves by episodes and
upkeep (earnings - costs), by endowments (a parent's energy becomes its child's: a
transfer) and by retirement (a retired organelle takes its balance with it), so

    total energy now - total energy at start == earned - spent - retired

holds exactly, as integers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from evora.lora import Tensors

MICRO = 1_000_000  # energy units per unit


def units(energy: float) -> int:
    return round(energy * MICRO)


@dataclass
class Organelle:
    """One LoRA adapter with an energy balance, and what it has done."""

    id: str
    adapter: Tensors  # fp32
    energy: int  # micro-units
    born: int  # the generation it was born after (0: a founder)
    parents: list[str] = field(default_factory=list)
    origin: str = "founder"  # founder | mutate | merge | niche
    episodes: int = 0
    recent: list[float] = field(default_factory=list)  # ROI of its last `window` episodes
    families: dict[str, list[float]] = field(default_factory=dict)  # family -> [episodes, ROI, reward, cost] sums

    def as_fields(self) -> dict[str, Any]:
        """Plain data for the checkpoint (tensors, numbers, strings, lists, dicts)."""
        return {f.name: vars(self)[f.name] for f in dataclasses.fields(self)}

    def mean_roi(self, family: str | None = None) -> float:
        if family is None:
            return sum(self.recent) / len(self.recent) if self.recent else float("-inf")
        n, roi, _, _ = self.families.get(family, (0, 0.0, 0.0, 0.0))
        return roi / n if n else float("-inf")

    def cost_per_episode(self) -> float:
        n = sum(s[0] for s in self.families.values())
        return sum(s[3] for s in self.families.values()) / n if n else 0.0


@dataclass(frozen=True)
class Prices:
    reward: float
    fee: float
    token: float

    def settle(self, reward: float, tokens: int) -> tuple[int, int]:
        """(earnings, cost) of one episode, in micro-units."""
        return units(reward * self.reward), units(self.fee + self.token * tokens)


def record(organelle: Organelle, family: str, reward: float, earned: int, cost: int, window: int) -> None:
    """Book one episode on the organelle: energy, its recent ROI window, its family sums."""
    roi = (earned - cost) / MICRO
    organelle.energy += earned - cost
    organelle.episodes += 1
    organelle.recent = [*organelle.recent, roi][-window:]
    n, total_roi, total_reward, total_cost = organelle.families.get(family, [0, 0.0, 0.0, 0.0])
    organelle.families[family] = [n + 1, total_roi + roi, total_reward + reward, total_cost + cost / MICRO]


def endow(child: Organelle, parents: list[Organelle], endowment: int) -> None:
    """The child's energy, paid by its parents in equal integer shares (the first pays the remainder)."""
    share = endowment // len(parents)
    for i, parent in enumerate(parents):
        paid = share + (endowment - share * len(parents) if i == 0 else 0)
        parent.energy -= paid
        child.energy += paid
