"""Births and deaths in the full ecology (`strategy.py`): the bankrupt retire, organelles
that clear the uplift threshold reproduce (a mutated copy, or a merge of two), and a
training family no archive cell covers gets a mutated copy of the nearest elite."""

from __future__ import annotations

import random
from typing import Any

import evora.strategies.ecology.archive as qd
from evora.lora.noise import gaussian, noise_key
from evora.strategies.ecology.config import EcologyConfig
from evora.strategies.ecology.economy import Organelle, endow, units
from evora.strategies.ecology.merge import merge_adapters
from evora.strategies.ecology.state import EcologyState, training_families
from evora.strategies.protocol import Tensors, clone_tensors


class Lifecycle:
    """The births and deaths of one run's organelles (its config and seed); every method
    changes the state's counters and the list of living organelles in place."""

    def __init__(self, cfg: EcologyConfig, run_seed: int):
        self.cfg = cfg
        self.run_seed = run_seed

    def retire(self, state: EcologyState, organelles: list[Organelle], generation: int) -> list[dict[str, Any]]:
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

    def eligible(self, organelles: list[Organelle]) -> list[Organelle]:
        cfg, floor, endowment = self.cfg, units(self.cfg.energy_floor), units(self.cfg.endowment)
        ready = [
            o
            for o in organelles
            if len(o.recent) >= cfg.window and o.mean_roi() >= cfg.uplift_threshold and o.energy - endowment > floor
        ]
        return sorted(ready, key=lambda o: -o.mean_roi())  # stable: ties keep birth order

    def reproduce(self, state: EcologyState, organelles: list[Organelle], generation: int) -> list[dict[str, Any]]:
        """Births: a merge of the two best eligible organelles (merge_rate), else a mutated copy of the best."""
        cfg = self.cfg
        rng = random.Random(noise_key(self.run_seed, "ecology-birth", generation))
        eligible: list[Organelle] = self.eligible(organelles)
        events: list[dict[str, Any]] = []
        while eligible and len(organelles) < cfg.max_population and len(events) < cfg.max_births:
            if len(eligible) >= 2 and rng.random() < cfg.merge_rate:
                parents, origin = eligible[:2], "merge"
                adapter = merge_adapters(parents[0].adapter, parents[1].adapter)
                state.merges += 1
            else:
                parents, origin = eligible[:1], "mutate"
                adapter = self.mutated(parents[0].adapter, state, generation)
            eligible = eligible[len(parents) :]
            for parent in parents:
                parent.recent = []  # it must earn its uplift again before it reproduces again
            events.append(self.birth(state, organelles, adapter, parents, origin, generation))
        return events

    def mutated(self, adapter: Tensors, state: EcologyState, generation: int) -> Tensors:
        key, scale = (self.run_seed, "ecology-mutate", generation, state.next_id), self.cfg.mutation_scale
        return {
            k: v + scale * state.noise_scales.get(k, 1.0) * gaussian(noise_key(*key, k), tuple(v.shape))
            for k, v in adapter.items()
        }

    def birth(
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

    def fill_niches(self, state: EcologyState, organelles: list[Organelle], generation: int) -> list[dict[str, Any]]:
        """A training family no archive cell covers gets a mutated copy of the nearest elite, if that
        elite still lives and can pay the endowment."""
        cfg, families, bins = self.cfg, training_families(state), list(self.cfg.cost_bins)
        if not cfg.fill_niches or not state.archive:
            return []
        floor, endowment, events = units(cfg.energy_floor), units(cfg.endowment), []
        for family in families:
            if any(cell.startswith(f"{family}|") for cell in state.archive) or len(organelles) >= cfg.max_population:
                continue
            nearest = qd.nearest_filled(state.archive, f"{family}|0", families, bins)
            assert nearest is not None  # the archive holds at least one cell of these families and bins
            source = state.archive[nearest]
            parent = next((o for o in organelles if o.id == source["id"]), None)
            if parent is None or parent.energy - endowment <= floor:
                continue
            adapter = self.mutated(source["adapter"], state, generation)
            events.append(self.birth(state, organelles, adapter, [parent], "niche", generation))
        return events
