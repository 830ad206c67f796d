"""The LoRALab-style hyperparameter search: members, initial sampling, and the
explore step applied when a member is cloned. Pure: no Ray here.

Explore changes each hyperparameter with probability `mutation_probability`:
- rank: half the time a neighbour in the list, else a random value from it;
- learning rate: half the time scaled by one of `lr_factors` and clamped to
  [lr_min, lr_max], else a random value from the list;
- dropout, alpha multiplier, target modules: a random value from their lists.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from evora.strategies.pbt.config import PBTConfig

KEYS = ("rank", "alpha_multiplier", "learning_rate", "dropout", "target_modules")


def module_sets(space: PBTConfig) -> list[str]:
    """The target-module options as "q_proj,v_proj" strings (Ray Tune takes list values for
    nested search spaces, so a set of modules travels as one string)."""
    return [",".join(modules) for modules in space.target_modules]


def modules_of(option: str) -> list[str]:
    return option.split(",")


def member_id(config: dict[str, Any], generation: int) -> str:
    """LoRALab's variant id: r{rank}_lr{learning rate}_d{dropout}_g{generation}."""
    rate = f"{config['learning_rate']:.2g}".replace("e-0", "e-").replace("e+0", "e+")
    return f"r{config['rank']}_lr{rate}_d{config['dropout']}_g{generation}"


def sample(space: PBTConfig, rng: random.Random) -> dict[str, Any]:
    return {
        "rank": rng.choice(space.ranks),
        "alpha_multiplier": rng.choice(space.alpha_multipliers),
        "learning_rate": rng.choice(space.learning_rates),
        "dropout": rng.choice(space.dropouts),
        "target_modules": rng.choice(module_sets(space)),
    }


def _neighbour(values: list, current: Any, rng: random.Random) -> Any:
    if current not in values:
        return rng.choice(values)
    at = values.index(current) + rng.choice((-1, 1))
    return values[min(max(at, 0), len(values) - 1)]


def explore(config: dict[str, Any], space: PBTConfig, rng: random.Random) -> tuple[dict[str, Any], dict[str, str]]:
    """A mutated copy of `config`, and what happened to each key that changed."""
    new, operations = dict(config), {}
    for key in KEYS:
        if rng.random() >= space.mutation_probability:
            continue
        fresh = rng.random() < space.resample_probability
        if key == "rank":
            new[key] = rng.choice(space.ranks) if fresh else _neighbour(space.ranks, config[key], rng)
        elif key == "learning_rate" and not fresh:
            factor = rng.choice(space.lr_factors)
            new[key] = min(max(config[key] * factor, space.lr_min), space.lr_max)
            operations[key] = f"x{factor}"
            continue
        else:
            options: dict[str, Sequence[Any]] = {
                "alpha_multiplier": space.alpha_multipliers,
                "learning_rate": space.learning_rates,
                "dropout": space.dropouts,
                "target_modules": module_sets(space),
            }
            new[key] = rng.choice(options[key])
        operations[key] = "resample" if fresh or key != "rank" else "neighbour"
    return new, operations
