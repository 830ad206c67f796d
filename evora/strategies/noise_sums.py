"""Updates computed where the noise is (docs/architecture.md, "Summed updates").

An ES-type update needs sum_m c_m eps_m for every tensor: the members' noise weighted by their
shaped fitness. Redrawn on the driver it costs as much noise as the whole population drew; a
strategy registered with `summed=True` (`SummedStrategy`) has the workers draw it instead, in
groups of members fixed by the population alone, and the driver adds the groups' sums in group
order, so 1 and N workers (and a resumed run) give bitwise the same update:

    sums = strategy.noise_sums(state, specs, results)         # driver: the coefficients, the groups
    part = strategy.group_sum(payload, sums, group)           # a worker: that group's sum per tensor
    told = strategy.tell_with(state, specs, results, total)   # driver: total = add_groups(parts)

`tell` itself is `tell_with` over the groups summed in this process (`summed_locally`), the same
numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from evora.lora import Tensors
from evora.strategies.protocol import CandidateSpec, GenerationResults, Strategy, Told


@dataclass(frozen=True)
class NoiseSums:
    """What the workers sum: each member's coefficient and the fixed member groups."""

    generation: int
    coefficients: tuple[float, ...]  # per member (0: left out)
    groups: tuple[tuple[int, int], ...]  # [start, stop) member ranges, a pure function of the member count
    # Per member, the coefficient of its squared noise, for updates that take sum_m d_m eps_m^2 too
    # (SNES's and PGPE's sigma: separable.moment_group_sum); () for ES.
    squares: tuple[float, ...] = ()


def member_coefficients(specs: Sequence[CandidateSpec], weights: np.ndarray) -> tuple[float, ...]:
    """Per member: the sum over its candidates of shaped fitness x sign (mirrored pairs share a member)."""
    coefficients = [0.0] * (max(spec.member for spec in specs) + 1)
    for spec, w in zip(specs, weights):
        coefficients[spec.member] += float(w) * spec.sign
    return tuple(coefficients)


def member_groups(members: int) -> tuple[tuple[int, int], ...]:
    """ceil(sqrt(members)) groups of consecutive members: enough groups to keep many workers
    busy, few enough that the driver's part (one add of a whole adapter per group) stays
    small beside the workers' (one noise draw of a whole adapter per member)."""
    if members <= 0:
        return ()
    size = math.ceil(members / math.ceil(math.sqrt(members)))
    return tuple((start, min(start + size, members)) for start in range(0, members, size))


def add_groups(parts: list[Tensors]) -> Tensors:
    """The groups' sums added in group order (bitwise the same wherever they were computed)."""
    total = {name: value.clone() for name, value in parts[0].items()}
    for part in parts[1:]:
        for name, value in part.items():
            total[name] += value
    return total


class SummedStrategy(Strategy, Protocol):
    """Registered with summed=True (see the module's docstring)."""

    def noise_sums(self, state: Any, specs: list[Any], results: GenerationResults) -> NoiseSums: ...

    def group_sum(self, payload: Any, sums: NoiseSums, group: int) -> Tensors:
        """sum over the group's members of c_m eps_m, per tensor, fp32 (on the CPU: LoRA tensors)."""

    def tell_with(self, state: Any, specs: list[Any], results: GenerationResults, total: Tensors) -> Told: ...


def summed_locally(strategy: SummedStrategy, payload: Any, sums: NoiseSums) -> Tensors:
    """Every group summed in this process, added in order: what the workers' sums add up to."""
    return add_groups([strategy.group_sum(payload, sums, g) for g in range(len(sums.groups))])
