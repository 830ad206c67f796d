"""An ecology of LoRA organelles in an energy economy (Evolora), on the shared run loop.

Each generation (`ask`): the generation's episodes (train examples, a pure function of
(seed, generation)) are routed to organelles by a bandit per family; every organelle that
got episodes is one MEMBER-like `serve` candidate evaluated on exactly those prompts, and,
with plasticity=es, a few antithetic `probe` pairs around it on the same prompts (seeds
only). All of them run as one multi-LoRA batch on the workers. `tell` settles the episodes
(energy, ROI, the bandit's statistics), charges every organelle its upkeep, takes each
organelle's ES step from its probes (plasticity=sft instead keeps its successful episodes'
completions, and `refine` trains it on them on the driver: `selftrain.py`), retires the
bankrupt, lets organelles that clear the uplift threshold reproduce (a mutated copy, or a
merge of two), updates the MAP-Elites archive and fills empty family niches.

Conditions (the ecology work's three): `frozen` is one zero adapter (the base model) that
never changes; `single` one adapter with plasticity and no ecology; `full` everything.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from evora.lora.init import random_adapter
from evora.lora.noise import gaussian, noise_key
from evora.strategies.adapter_init import noise_scales
from evora.strategies.ecology import archive as qd
from evora.strategies.ecology.config import EcologyConfig
from evora.strategies.ecology.economy import Organelle, Prices, endow, record, units
from evora.strategies.ecology.merge import merge_adapters
from evora.strategies.ecology.routing import route
from evora.strategies.ecology.selftrain import self_train, successes
from evora.strategies.protocol import (
    GenerationResults,
    StrategyContext,
    Tensors,
    Told,
    TrainingContext,
    clone_tensors,
)
from evora.strategies.shaping import zscore

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


class Ecology:
    state_type = EcologyState

    def __init__(self, cfg: EcologyConfig, run_seed: int):
        self.cfg = cfg
        self.run_seed = run_seed
        self.prices = Prices(cfg.reward_price, cfg.episode_fee, cfg.token_price)
        self.full = cfg.condition == "full"
        self.plastic = cfg.condition != "frozen" and cfg.plasticity == "es"
        self.self_training = cfg.condition != "frozen" and cfg.plasticity == "sft"
        self.routing_confidence = cfg.routing_confidence

    @property
    def keeps_texts(self) -> bool:
        """plasticity=sft: the loop returns the completions' texts (GenerationResults.texts)."""
        return self.self_training

    @property
    def refines(self) -> bool:
        """plasticity=sft: the loop gives it a TrainingContext and calls `refine` after each tell."""
        return self.self_training

    def refine(self, state: EcologyState, generation: int, context: TrainingContext) -> Told | None:
        """Each organelle's self-training on its successes of the generation (`selftrain.py`)."""
        if not self.self_training:
            return None
        return self_train(self.cfg, self.run_seed, state, generation, context)

    # --- state ----------------------------------------------------------------------

    def initial_state(self, context: StrategyContext) -> EcologyState:
        founders = self.cfg.organelles if self.full else 1
        organelles = [
            Organelle(f"o{i}", self._founder(context, i), units(self.cfg.initial_energy), 0) for i in range(founders)
        ]
        return EcologyState(
            organelles=[o.as_fields() for o in organelles],
            train_families=list(context.train_families),
            episodes_per_generation=context.prompts_per_generation,
            initial_energy=sum(o.energy for o in organelles),
            next_id=founders,
            noise_scales=noise_scales(self.cfg, context),
        )

    def _founder(self, context: StrategyContext, i: int) -> Tensors:
        """Founders differ in A (B = 0 by default: each starts as the base model); frozen: all zeros."""
        cfg = self.cfg
        adapter = random_adapter(context.layout, noise_key(context.seed, "founder", i), cfg.init_a_std, cfg.init_b_std)
        if cfg.condition == "frozen":
            return {k: torch.zeros_like(v) for k, v in adapter.items()}
        return adapter

    def center(self, state: EcologyState) -> Tensors:
        """The best single organelle: the highest mean ROI over its recent episodes (ties: the oldest)."""
        return next(Organelle(**o) for o in state.organelles if o["id"] == self.train_routing(state)["default"]).adapter

    def members(self, state: EcologyState) -> tuple[list[str], list[Tensors]]:
        """The living organelles' ids and adapters: the routed portfolio's candidates."""
        organelles = living(state)
        return [o.id for o in organelles], [o.adapter for o in organelles]

    def train_routing(self, state: EcologyState) -> dict[str, str]:
        """family -> the organelle with the best mean episode ROI on it; "default": the center's."""
        organelles = living(state)
        best = max(range(len(organelles)), key=lambda i: (organelles[i].mean_roi(), -i))
        routing = {
            f: organelles[max(range(len(organelles)), key=lambda i: (organelles[i].mean_roi(f), -i))].id
            for f in self.training_families(state)
        }
        return {**routing, "default": organelles[best].id}

    def details(self, state: EcologyState) -> dict[str, Any]:
        """The ecology's run totals, as the ecology work's conditions table reports them."""
        episode_roi = state.earned - (state.spent - state.upkeep_paid)
        return {
            "condition": self.cfg.condition,
            "episodes": state.episodes,
            "mean_roi": episode_roi / 1e6 / state.episodes if state.episodes else 0.0,
            "births": state.births,
            "merges": state.merges,
            "retirements": state.retirements,
            "population": len(state.organelles),
            "qd_coverage": qd.coverage(state.archive, self.training_families(state), list(self.cfg.cost_bins))
            if self.full
            else 0.0,
            "energy": {
                "start": state.initial_energy / 1e6,
                "end": total_energy(state) / 1e6,
                "earned": state.earned / 1e6,
                "spent": state.spent / 1e6,
                "retired": state.retired_energy / 1e6,
            },
        }

    def training_families(self, state: EcologyState) -> list[str]:
        return sorted(set(state.train_families))

    # --- ask ------------------------------------------------------------------------

    def episodes(self, state: EcologyState, generation: int) -> list[int]:
        rng = np.random.default_rng(noise_key(self.run_seed, "ecology-episodes", generation))
        picked = rng.choice(len(state.train_families), size=state.episodes_per_generation, replace=False)
        return [int(i) for i in picked]

    def ask(self, state: EcologyState, generation: int) -> tuple[list[EcoSpec], EcologyPayload]:
        organelles = living(state)
        episodes = self.episodes(state, generation)
        rng = np.random.default_rng(noise_key(self.run_seed, "ecology-route", generation))
        picks = route(
            organelles, [state.train_families[i] for i in episodes], self.cfg.router, self.cfg.exploration, rng
        )
        specs: list[EcoSpec] = []
        for position in range(len(organelles)):
            prompts = tuple(sorted(e for e, p in zip(episodes, picks) if p == position))
            if not prompts:
                continue
            specs.append(EcoSpec(generation, len(specs), SERVE, position, prompts))
            for member in range(self.cfg.probes if self.plastic else 0):
                for sign in (1, -1):
                    specs.append(EcoSpec(generation, len(specs), PROBE, position, prompts, member, sign))
        payload = EcologyPayload(
            generation, tuple(o.adapter for o in organelles), tuple(o.id for o in organelles), state.noise_scales
        )
        return specs, payload

    def _noise(self, generation: int, organelle_id: str, member: int, name: str, shape: tuple[int, ...]):
        return gaussian(noise_key(self.run_seed, "ecology-probe", generation, organelle_id, member, name), shape)

    def materialise(self, payload: EcologyPayload, spec: EcoSpec) -> Tensors:
        adapter = payload.adapters[spec.organelle]
        if spec.op == SERVE:
            return adapter
        organelle_id, sigma = payload.ids[spec.organelle], self.cfg.sigma
        return {
            k: v
            + (spec.sign * sigma * payload.noise_scales.get(k, 1.0))
            * self._noise(spec.generation, organelle_id, spec.member, k, tuple(v.shape))
            for k, v in adapter.items()
        }

    # --- tell -----------------------------------------------------------------------

    def tell(self, state: EcologyState, specs: list[EcoSpec], results: GenerationResults) -> Told:
        generation = specs[0].generation if specs else results.generation
        organelles = living(state)
        new = EcologyState(**{**state.__dict__, "archive": dict(state.archive)})
        episodes = self._settle(new, organelles, specs, results)
        served = [(organelles[s.organelle].id, s.index, s.prompts) for s in specs if s.op == SERVE]
        new.sft_batch = successes(served, results, self.cfg.sft_min_reward) if self.self_training else []
        self._charge_upkeep(new, organelles)
        steps = self._learn(new, organelles, specs, results) if self.plastic else {}
        events: list[dict[str, Any]] = []
        if self.full:
            events += self._retire(new, organelles, generation)
            events += self._reproduce(new, organelles, generation)
            qd.update(new.archive, organelles, self.training_families(new), list(self.cfg.cost_bins))
            events += self._fill_niches(new, organelles, generation)
        new.organelles = [o.as_fields() for o in organelles]
        records = self._records(organelles, episodes, events, generation)
        if self.full:
            records["archive.jsonl"] = [self._archive_record(new, generation)]
        return Told(new, self._stats(new, episodes, steps), self._lineage(events, generation), records=records)

    def _settle(
        self, state: EcologyState, organelles: list[Organelle], specs: list[EcoSpec], results: GenerationResults
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
                earned, cost = self.prices.settle(reward, tokens)
                record(organelle, family, reward, earned, cost, self.cfg.window)
                state.earned += earned
                state.spent += cost
                state.episodes += 1
                episodes.append(
                    {"organelle": organelle.id, "family": family, "example": prompt, "reward": reward,
                     "tokens": tokens, "earned": earned / 1e6, "cost": cost / 1e6, "roi": (earned - cost) / 1e6}
                )  # fmt: skip
        return episodes

    def _charge_upkeep(self, state: EcologyState, organelles: list[Organelle]) -> None:
        upkeep = units(self.cfg.upkeep) if self.full else 0  # no economy outside the full ecology
        for organelle in organelles:
            organelle.energy -= upkeep
            state.spent += upkeep
            state.upkeep_paid += upkeep

    def _learn(
        self, state: EcologyState, organelles: list[Organelle], specs: list[EcoSpec], results: GenerationResults
    ) -> dict[str, float]:
        """Each probed organelle's antithetic ES step, 1/(N sigma) sum_i w_i sign_i eps_i (w: z-scored fitness)."""
        norms = {}
        for position, organelle in enumerate(organelles):
            probes = [s for s in specs if s.op == PROBE and s.organelle == position]
            if not probes:
                continue
            weights = zscore(np.array([results.fitness[s.index] for s in probes]))
            step = {}
            for name, value in organelle.adapter.items():
                grad = torch.zeros_like(value)
                for spec, w in zip(probes, weights):
                    if w != 0.0:
                        noise = self._noise(spec.generation, organelle.id, spec.member, name, tuple(value.shape))
                        grad.add_(noise, alpha=float(w) * spec.sign)
                scale = self.cfg.sigma * state.noise_scales.get(name, 1.0)
                step[name] = (self.cfg.lr / (len(probes) * scale)) * grad
            organelle.adapter = {k: v + step[k] for k, v in organelle.adapter.items()}
            norms[organelle.id] = float(torch.sqrt(sum((t.double() ** 2).sum() for t in step.values())))
        return norms

    def _retire(self, state: EcologyState, organelles: list[Organelle], generation: int) -> list[dict[str, Any]]:
        """Organelles at the energy floor retire, taking their balance with them; the richest always stays."""
        floor = units(self.cfg.energy_floor)
        richest = max(range(len(organelles)), key=lambda i: (organelles[i].energy, -i))
        events = []
        for i in sorted(range(len(organelles)), reverse=True):
            organelle = organelles[i]
            if organelle.energy <= floor and i != richest:
                state.retired_energy += organelle.energy
                state.retirements += 1
                events.append({"event": "retire", "id": organelle.id, "energy": organelle.energy / 1e6})
                del organelles[i]
        return events

    def _eligible(self, organelles: list[Organelle]) -> list[Organelle]:
        cfg, floor, endowment = self.cfg, units(self.cfg.energy_floor), units(self.cfg.endowment)
        ready = [
            o
            for o in organelles
            if len(o.recent) >= cfg.window and o.mean_roi() >= cfg.uplift_threshold and o.energy - endowment > floor
        ]
        return sorted(ready, key=lambda o: -o.mean_roi())  # stable: ties keep birth order

    def _reproduce(self, state: EcologyState, organelles: list[Organelle], generation: int) -> list[dict[str, Any]]:
        """Births: a merge of the two best eligible organelles (merge_rate), else a mutated copy of the best."""
        cfg = self.cfg
        rng = random.Random(noise_key(self.run_seed, "ecology-birth", generation))
        eligible, events = self._eligible(organelles), []
        while eligible and len(organelles) < cfg.max_population and len(events) < cfg.max_births:
            if len(eligible) >= 2 and rng.random() < cfg.merge_rate:
                parents, origin = eligible[:2], "merge"
                adapter = merge_adapters(parents[0].adapter, parents[1].adapter)
                state.merges += 1
            else:
                parents, origin = eligible[:1], "mutate"
                adapter = self._mutated(parents[0].adapter, state, generation)
            eligible = eligible[len(parents) :]
            for parent in parents:
                parent.recent = []  # it must earn its uplift again before it reproduces again
            events.append(self._birth(state, organelles, adapter, parents, origin, generation))
        return events

    def _mutated(self, adapter: Tensors, state: EcologyState, generation: int) -> Tensors:
        key, scale = (self.run_seed, "ecology-mutate", generation, state.next_id), self.cfg.mutation_scale
        return {
            k: v + scale * state.noise_scales.get(k, 1.0) * gaussian(noise_key(*key, k), tuple(v.shape))
            for k, v in adapter.items()
        }

    def _birth(
        self,
        state: EcologyState,
        organelles: list[Organelle],
        adapter: Tensors,
        parents: list[Organelle],
        origin: str,
        generation: int,
    ) -> dict[str, Any]:
        ids = [p.id for p in parents]
        child = Organelle(f"o{state.next_id}", clone_tensors(adapter), 0, generation + 1, ids, origin)
        endow(child, parents, units(self.cfg.endowment))
        organelles.append(child)
        state.next_id += 1
        state.births += 1
        return {"event": "birth", "id": child.id, "parents": ids, "origin": origin, "energy": child.energy / 1e6}

    def _fill_niches(self, state: EcologyState, organelles: list[Organelle], generation: int) -> list[dict[str, Any]]:
        """A training family no archive cell covers gets a mutated copy of the nearest elite, if that
        elite still lives and can pay the endowment."""
        cfg, families, bins = self.cfg, self.training_families(state), list(self.cfg.cost_bins)
        if not cfg.fill_niches or not state.archive:
            return []
        floor, endowment, events = units(cfg.energy_floor), units(cfg.endowment), []
        for family in families:
            if any(cell.startswith(f"{family}|") for cell in state.archive) or len(organelles) >= cfg.max_population:
                continue
            source = state.archive[qd.nearest_filled(state.archive, f"{family}|0", families, bins)]
            parent = next((o for o in organelles if o.id == source["id"]), None)
            if parent is None or parent.energy - endowment <= floor:
                continue
            adapter = self._mutated(source["adapter"], state, generation)
            events.append(self._birth(state, organelles, adapter, [parent], "niche", generation))
        return events

    # --- what a generation reports --------------------------------------------------

    def _stats(self, state: EcologyState, episodes: list[dict[str, Any]], steps: dict[str, float]) -> dict[str, float]:
        families, bins = self.training_families(state), list(self.cfg.cost_bins)
        return {
            "population": float(len(state.organelles)),
            "total_energy": total_energy(state) / 1e6,
            "episodes_total": float(state.episodes),
            "roi_mean": float(np.mean([e["roi"] for e in episodes])) if episodes else 0.0,
            "births_total": float(state.births),
            "merges_total": float(state.merges),
            "retirements_total": float(state.retirements),
            "qd_coverage": qd.coverage(state.archive, families, bins) if self.full else 0.0,
            "plasticity_step_norm": float(np.mean(list(steps.values()))) if steps else 0.0,
        }

    @staticmethod
    def _lineage(events: list[dict[str, Any]], generation: int) -> list[dict[str, Any]]:
        """The family tree (lineage.jsonl): every birth with its parents and how it was made."""
        return [
            {"generation": generation + 1, "id": e["id"], "parents": e["parents"], "op": e["origin"]}
            for e in events
            if e["event"] == "birth"
        ]

    def _archive_record(self, state: EcologyState, generation: int) -> dict[str, Any]:
        """archive.jsonl: the MAP-Elites grid after the generation, each filled cell's elite and ROI."""
        return {
            "generation": generation + 1,
            "families": self.training_families(state),
            "cost_bins": list(self.cfg.cost_bins),
            "cells": {cell: {"id": elite["id"], "roi": elite["roi"]} for cell, elite in sorted(state.archive.items())},
        }

    @staticmethod
    def _records(
        organelles: list[Organelle],
        episodes: list[dict[str, Any]],
        events: list[dict[str, Any]],
        generation: int,
    ) -> dict[str, list[dict[str, Any]]]:
        """episodes.jsonl: one line per episode; organelles.jsonl: births, retirements, and every
        living organelle's energy after the generation."""
        done = generation + 1
        snapshot = [
            {"event": "alive", "id": o.id, "energy": o.energy / 1e6, "episodes": o.episodes, "born": o.born}
            for o in organelles
        ]
        return {
            "episodes.jsonl": [{"generation": done, **e} for e in episodes],
            "organelles.jsonl": [{"generation": done, **e} for e in [*events, *snapshot]],
        }
