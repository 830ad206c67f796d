"""A generation's episodes (`strategy.py`): which train examples it plays, which organelle
each is routed to (the specs `ask` returns), and their settlement in `tell`: every served
episode's earnings and cost, then every organelle's upkeep."""

from __future__ import annotations

from typing import Any

import numpy as np

from evora.lora.keys import noise_key
from evora.strategies.ecology.config import EcologyConfig
from evora.strategies.ecology.economy import Organelle, Prices, record
from evora.strategies.ecology.routing import route
from evora.strategies.ecology.state import PROBE, SERVE, EcologyState, EcoSpec
from evora.strategies.protocol import GenerationResults


def pick_episodes(run_seed: int, state: EcologyState, generation: int) -> list[int]:
    """The generation's train examples: a pure function of (seed, generation)."""
    rng = np.random.default_rng(noise_key(run_seed, "ecology-episodes", generation))
    picked = rng.choice(len(state.train_families), size=state.episodes_per_generation, replace=False)
    return [int(i) for i in picked]


def routed_specs(
    cfg: EcologyConfig,
    run_seed: int,
    state: EcologyState,
    organelles: list[Organelle],
    episodes: list[int],
    generation: int,
    probes: int,
) -> list[EcoSpec]:
    """One serve spec per organelle that got episodes, on exactly those prompts, then its
    `probes` antithetic probe pairs on the same prompts."""
    rng = np.random.default_rng(noise_key(run_seed, "ecology-route", generation))
    picks = route(organelles, [state.train_families[i] for i in episodes], cfg.router, cfg.exploration, rng)
    served: dict[int, list[int]] = {}  # organelle position -> its episodes
    for episode, position in zip(episodes, picks):
        served.setdefault(position, []).append(episode)
    specs: list[EcoSpec] = []
    for position in sorted(served):
        prompts = tuple(sorted(served[position]))
        specs.append(EcoSpec(generation, len(specs), SERVE, position, prompts))
        for member in range(probes):
            for sign in (1, -1):
                specs.append(EcoSpec(generation, len(specs), PROBE, position, prompts, member, sign))
    return specs


def settle(
    prices: Prices,
    window: int,
    state: EcologyState,
    organelles: list[Organelle],
    specs: list[EcoSpec],
    results: GenerationResults,
) -> list[dict[str, Any]]:
    """Book every served episode; returns one record per episode."""
    column = {p: j for j, p in enumerate(results.prompt_indices)}
    episodes = []
    for spec in specs:
        if spec.op != SERVE:
            continue
        organelle = organelles[spec.organelle]
        for prompt in spec.prompts:
            reward = float(results.rewards[spec.index, column[prompt]])
            reward = reward if np.isfinite(reward) else 0.0
            tokens = int(results.tokens[spec.index, column[prompt]])
            family = state.train_families[prompt]
            earned, cost = prices.settle(reward, tokens)
            record(organelle, family, reward, earned, cost, window)
            state.earned += earned
            state.spent += cost
            state.episodes += 1
            episodes.append(
                {"organelle": organelle.id, "family": family, "example": prompt, "reward": reward,
                 "tokens": tokens, "earned": earned / 1e6, "cost": cost / 1e6, "roi": (earned - cost) / 1e6}
            )  # fmt: skip
    return episodes


def charge_upkeep(upkeep: int, state: EcologyState, organelles: list[Organelle]) -> None:
    """Every living organelle pays `upkeep` (micro-units) for the generation."""
    for organelle in organelles:
        organelle.energy -= upkeep
        state.spent += upkeep
        state.upkeep_paid += upkeep
