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

The parts: specs, payload and state (`state.py`), episodes and their settlement
(`episodes.py`), the ES probes and steps (`plasticity.py`), births and deaths
(`lifecycle.py`), and what a generation reports (`reports.py`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

import evora.strategies.ecology.archive as qd
from evora.lora.init import random_adapter
from evora.lora.keys import noise_key
from evora.strategies.adapter_init import noise_scales
from evora.strategies.ecology.config import EcologyConfig
from evora.strategies.ecology.economy import Organelle, Prices, units
from evora.strategies.ecology.episodes import charge_upkeep, pick_episodes, routed_specs, settle
from evora.strategies.ecology.lifecycle import Lifecycle
from evora.strategies.ecology.plasticity import learn, probed
from evora.strategies.ecology.reports import (
    archive_record,
    generation_records,
    generation_stats,
    lineage,
    run_details,
)
from evora.strategies.ecology.selftrain import self_train, successes
from evora.strategies.ecology.state import (
    PROBE,
    SERVE,
    EcologyPayload,
    EcologyState,
    EcoSpec,
    living,
    total_energy,
    training_families,
)
from evora.strategies.protocol import GenerationResults, StrategyContext, Tensors, Told, TrainingContext

__all__ = ["PROBE", "SERVE", "EcoSpec", "Ecology", "EcologyPayload", "EcologyState", "living", "total_energy"]


class Ecology:
    state_type: ClassVar[type] = EcologyState
    routing_confidence: float  # PortfolioStrategy's: set from the config

    def __init__(self, cfg: EcologyConfig, run_seed: int):
        self.cfg = cfg
        self.run_seed = run_seed
        self.prices = Prices(cfg.reward_price, cfg.episode_fee, cfg.token_price)
        self.full = cfg.condition == "full"
        self.plastic = cfg.condition != "frozen" and cfg.plasticity == "es"
        self.self_training = cfg.condition != "frozen" and cfg.plasticity == "sft"
        self.routing_confidence = cfg.routing_confidence
        self.lifecycle = Lifecycle(cfg, run_seed)

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
        default = self.train_routing(state)["default"]
        return next(Organelle(**o) for o in state.organelles if o["id"] == default).adapter

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
        return run_details(self.cfg, self.full, state)

    def training_families(self, state: EcologyState) -> list[str]:
        return training_families(state)

    # --- ask ------------------------------------------------------------------------

    def episodes(self, state: EcologyState, generation: int) -> list[int]:
        return pick_episodes(self.run_seed, state, generation)

    def ask(self, state: EcologyState, generation: int) -> tuple[list[EcoSpec], EcologyPayload]:
        organelles = living(state)
        episodes = self.episodes(state, generation)
        probes = self.cfg.probes if self.plastic else 0
        specs = routed_specs(self.cfg, self.run_seed, state, organelles, episodes, generation, probes)
        payload = EcologyPayload(
            generation, tuple(o.adapter for o in organelles), tuple(o.id for o in organelles), state.noise_scales
        )
        return specs, payload

    def materialise(self, payload: EcologyPayload, spec: EcoSpec) -> Tensors:
        if spec.op == SERVE:
            return payload.adapters[spec.organelle]
        return probed(self.run_seed, self.cfg.sigma, payload, spec)

    # --- tell -----------------------------------------------------------------------

    def tell(self, state: EcologyState, specs: list[EcoSpec], results: GenerationResults) -> Told:
        generation = specs[0].generation if specs else results.generation
        organelles = living(state)
        new = EcologyState(**{**state.__dict__, "archive": dict(state.archive)})
        episodes = settle(self.prices, self.cfg.window, new, organelles, specs, results)
        served = [(organelles[s.organelle].id, s.index, s.prompts) for s in specs if s.op == SERVE]
        new.sft_batch = successes(served, results, self.cfg.sft_min_reward) if self.self_training else []
        charge_upkeep(units(self.cfg.upkeep) if self.full else 0, new, organelles)  # no economy outside full
        steps = self._learn(new, organelles, specs, results) if self.plastic else {}
        events = self._select(new, organelles, generation) if self.full else []
        new.organelles = [o.as_fields() for o in organelles]
        records = generation_records(organelles, episodes, events, generation)
        if self.full:
            records["archive.jsonl"] = [archive_record(self.cfg, new, generation)]
        stats = generation_stats(self.cfg, self.full, new, episodes, steps)
        return Told(new, stats, lineage(events, generation), records=records)

    def _learn(
        self, state: EcologyState, organelles: list[Organelle], specs: list[EcoSpec], results: GenerationResults
    ) -> dict[str, float]:
        """Each probed organelle's antithetic ES step (`plasticity.py`); its step norm by id."""
        return learn(self.run_seed, self.cfg.sigma, self.cfg.lr, state, organelles, specs, results)

    def _select(self, state: EcologyState, organelles: list[Organelle], generation: int) -> list[dict[str, Any]]:
        """The full ecology's births and deaths (`lifecycle.py`), the archive's update between them."""
        events: list[dict[str, Any]] = []
        events += self.lifecycle.retire(state, organelles, generation)
        events += self.lifecycle.reproduce(state, organelles, generation)
        qd.update(state.archive, organelles, self.training_families(state), list(self.cfg.cost_bins))
        events += self.lifecycle.fill_niches(state, organelles, generation)
        return events
