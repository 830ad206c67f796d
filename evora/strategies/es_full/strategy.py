"""The ES paper's algorithm over full weights ("Evolution Strategies at Scale: LLM Fine-Tuning
Beyond Reinforcement Learning", Qiu et al. 2025).

Member m of generation g perturbs every selected matrix W (by checkpoint name, fp32, in the
shape the checkpoint stores it) by dense iid Gaussian noise

    eps_m[W] ~ N(0, I),  drawn from (run seed, "es_full", g, m, W's name)

and candidate i is W + sign_i sigma eps_m(i) (sign_i = +1; or +/- pairs with antithetic). A
worker evaluates it on the engine's own weights, set to `perturbed(...)`, and restores them
from the master copies afterwards. With z the shaped fitness, the update is

    W <- W + lr / N sum_i z_i sign_i eps_m(i) - lr * weight_decay * (W - A)

(A = 0, or the model's own weights under weight_decay_anchor=start: decay towards the start)

THE PAPER'S UPDATE: it is not divided by sigma (unlike the textbook ES gradient estimate
1 / (N sigma) sum_i z_i eps_i, and unlike strategy=eggroll), so `lr` is the paper's alpha and
the step's size does not grow as sigma shrinks. As with EGGROLL the driver keeps only each
generation's fitness; every worker regenerates the noise and applies the same update to its
own fp32 `MasterWeights`.

Transposed matrices (GPT-2's Conv1D, stored [in, out], `MasterWeights.transposed`): dense
iid noise has no orientation, so it is drawn in the stored shape directly; `perturbed` and
`apply` both index the noise by the stored name and shape, so they agree with each other and
nothing is ever transposed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from evora.lora import Tensors
from evora.lora.layout import AdapterLayout
from evora.lora.noise import DenseNoise, gaussian, in_parallel, noise_key, perturbed_on, weighted_sum
from evora.strategies.es_full.config import EsFullConfig
from evora.strategies.full_weights import decays_to_start, matrix_name, with_fitness
from evora.strategies.master_weights import MasterWeights, start_copies
from evora.strategies.noise_sums import member_coefficients
from evora.strategies.protocol import CandidateSpec, GenerationResults, StrategyContext, Told
from evora.strategies.shaping import shape


@dataclass
class EsFullState:
    STATE_VERSION: ClassVar[int] = 1
    modules: list[str]  # the perturbed modules, in the layout's order
    shapes: list[list[int]]  # [out, in] of each
    # per generation: the population's fitness (shaping=per_prompt: its per-prompt normalised means)
    fitness: list[list[float]] = field(default_factory=list)


@dataclass(frozen=True)
class EsFullPayload:
    generation: int
    modules: tuple[str, ...]  # the perturbed modules; their matrices are matrix_name(module)


@dataclass(frozen=True)
class EsFullUpdate:
    """What every worker applies after a generation: a pure function of the fitness."""

    generation: int
    coefficients: tuple[float, ...]  # per member: sum over its candidates of shaped fitness x sign
    population: int  # N, the candidates (the update's divisor)


class EsFullStrategy:
    state_type: ClassVar[type] = EsFullState  # kind=full_weight: the loop syncs the engines' weights after each tell

    def __init__(self, cfg: EsFullConfig, run_seed: int):
        self.cfg = cfg
        self.run_seed = run_seed

    @property
    def perturbation_rank(self) -> int:
        """Candidates are not LoRAs; the run plan sizes the engines' LoRA slots from this (1: the least)."""
        return 1

    @property
    def snapshot_every(self) -> int:
        return self.cfg.snapshot_every

    @property
    def delta_rank(self) -> int:
        return self.cfg.delta_rank

    @property
    def anchored(self) -> bool:
        return decays_to_start(self.cfg.weight_decay, self.cfg.weight_decay_anchor)

    # --- noise ------------------------------------------------------------------------

    def noise_key(self, generation: int, member: int, name: str) -> int:
        return noise_key(self.run_seed, "es_full", generation, member, name)

    def noise(
        self, generation: int, member: int, name: str, shape_: tuple[int, ...], device: str | torch.device = "cpu"
    ) -> torch.Tensor:
        """eps of member's perturbation of matrix `name` (checkpoint name), fp32, in its stored
        shape, drawn on `device` (the master copies' device: each draws its own numbers)."""
        return gaussian(self.noise_key(generation, member, name), shape_, device)

    # --- ask / tell -------------------------------------------------------------------

    def initial_state(self, context: StrategyContext) -> EsFullState:
        slots = context.layout.modules
        return EsFullState([s.name for s in slots], [[s.out_features, s.in_features] for s in slots])

    def population(self, generation: int) -> list[CandidateSpec]:
        """Candidate i: member i, sign +1; antithetic: member i // 2, signs +, -."""
        if self.cfg.antithetic:
            return [
                CandidateSpec(generation, i, member=i // 2, sign=1 if i % 2 == 0 else -1)
                for i in range(self.cfg.population)
            ]
        return [CandidateSpec(generation, i, member=i, sign=1) for i in range(self.cfg.population)]

    def ask(self, state: EsFullState, generation: int) -> tuple[list[CandidateSpec], EsFullPayload]:
        return self.population(generation), EsFullPayload(generation, tuple(state.modules))

    def materialise(self, payload: EsFullPayload, spec: CandidateSpec) -> Tensors:
        """Not a LoRA: strategy=es_full registers in_place=True, and its candidates are the
        engine's own weights set to `perturbed(master, payload, spec)`."""
        raise TypeError(
            f"strategy=es_full: candidate {spec.label} is not a LoRA; a worker evaluates it in place, "
            "on the engine's weights set to strategy.perturbed(master, payload, spec)"
        )

    def perturbation(self, payload: EsFullPayload, spec: CandidateSpec) -> tuple[DenseNoise, ...]:
        """The candidate as seeds: each matrix's noise key and scale (sign sigma). An engine sets
        its weights to master + scale * eps itself, on its device (`Engine.perturb_base`)."""
        if spec.generation != payload.generation:
            raise ValueError(f"candidate of generation {spec.generation} with the payload of {payload.generation}")
        factor = spec.sign * self.cfg.sigma
        return tuple(
            DenseNoise(matrix_name(m), self.noise_key(payload.generation, spec.member, matrix_name(m)), factor)
            for m in payload.modules
        )

    def perturbed(self, master: MasterWeights, payload: EsFullPayload, spec: CandidateSpec) -> Tensors:
        """The candidate's weights, by checkpoint name, fp32, as stored: master + sign sigma eps,
        fresh tensors (the master copies are not touched): what `perturbation` sets, in fp32."""
        if master.generation != payload.generation:
            raise ValueError(
                f"candidate of generation {payload.generation} on weights of generation {master.generation}"
            )
        out: Tensors = {}
        for term in self.perturbation(payload, spec):
            if term.name not in master.tensors:
                raise KeyError(f"strategy=es_full: the master weights hold no matrix named {term.name}")
            out[term.name] = perturbed_on(master.tensors[term.name], term)  # the engines' own arithmetic
        return out

    def tell(self, state: EsFullState, specs: list[CandidateSpec], results: GenerationResults) -> Told:
        state = with_fitness(state, specs, results, self.cfg.shaping)
        coefficients = self.update_of(state, specs[0].generation).coefficients
        # Members whose coefficient is 0 move nothing (ties: greedy decoding ties often).
        return Told(state, {"members_tied": float(sum(c == 0.0 for c in coefficients) / len(coefficients))})

    def center(self, state: EsFullState) -> Tensors:
        return {}  # no adapter: the engines' own (updated) weights are the center

    # --- the weight update, on every worker --------------------------------------------

    def update_of(self, state: EsFullState, generation: int) -> EsFullUpdate:
        """The update that follows `generation` (0-based), from its fitness."""
        fitness = np.asarray(state.fitness[generation], dtype=np.float64)
        specs = self.population(generation)
        if len(fitness) != len(specs):
            raise ValueError(f"generation {generation} has {len(fitness)} fitness values for {len(specs)} candidates")
        return EsFullUpdate(generation, member_coefficients(specs, shape(fitness, self.cfg.shaping)), len(fitness))

    def master_bytes(self, layout: AdapterLayout) -> int:
        """Memory of one worker's master copies, 4 bytes a weight (candidates are set from seeds
        inside the engine, a piece at a time; the update holds one matrix's step a thread), and
        as much again for the decay's anchor under weight_decay_anchor=start."""
        weights = sum(slot.out_features * slot.in_features for slot in layout.modules)
        return 4 * weights * (1 + self.anchored)

    def start_master(self, tensors: Tensors, transposed: frozenset[str] = frozenset()) -> MasterWeights:
        """fp32 copies as the checkpoint stores them; `transposed`: those stored [in, out]
        (the noise is drawn in the stored shape, so they need nothing else)."""
        return start_copies(tensors, transposed, self.anchored)

    def direction(
        self, update: EsFullUpdate, name: str, shape_: tuple[int, ...], device: str | torch.device = "cpu"
    ) -> torch.Tensor:
        """sum_m c_m eps_m of matrix `name`, fp32, on `device`, members in ascending order (those
        with c_m = 0 skipped)."""
        terms = [(self.noise_key(update.generation, m, name), c) for m, c in enumerate(update.coefficients) if c != 0.0]
        return weighted_sum(terms, shape_, device)

    def apply(self, master: MasterWeights, update: EsFullUpdate) -> float:
        """Apply one update to the master copies in place, on their device (on the CPU, matrices
        at once over the process's threads; each has its own streams, so bitwise one thread's);
        returns the update's norm (the matrices' squares added in name order)."""
        if update.generation != master.generation:
            raise ValueError(f"update of generation {update.generation} on weights of generation {master.generation}")
        cfg = self.cfg
        step = cfg.lr / update.population  # the paper's alpha / N: no division by sigma

        def one(name: str) -> float:
            weight = master.tensors[name]
            delta = self.direction(update, name, tuple(weight.shape), weight.device).mul_(step)
            if cfg.weight_decay:
                delta -= master.decay(name, cfg.lr * cfg.weight_decay)
            weight += delta
            return float(torch.linalg.vector_norm(delta, dtype=torch.float64)) ** 2

        squares = in_parallel(
            one, sorted(master.tensors), master.device, cost=lambda name: master.tensors[name].numel()
        )
        master.generation += 1
        return math.sqrt(sum(squares))
