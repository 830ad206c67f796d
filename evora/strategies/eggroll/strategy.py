"""EGGROLL: evolution strategies over full weight matrices with low-rank perturbations
("Evolution Strategies at the Hyperscale", arXiv 2511.16652).

Member m of generation g perturbs every selected matrix W (out x in) by

    E_m = B_m A_m / sqrt(r),   B_m ~ N(0, I) out x r,   A_m ~ N(0, I) r x in

drawn from (run seed, generation, member, module); candidate i is W + sign_i sigma E_m, a
rank-r LoRA on the engine's current weights, so a whole population is one multi-LoRA batch.
The update is full rank:

    W <- W + lr / (N sigma) sum_i w_i sign_i E_m(i) - lr * weight_decay * (W - A)     (SGD; Adam optional)

(A = 0, or the model's own weights under weight_decay_anchor=start)

`distribution=snes` (not the paper's) gives each matrix j a sigma of its own, adapted after each
generation by SNES's rule (Schaul et al. 2011) for a sigma that the matrix's weights share:

    sigma_j <- sigma_j exp(eta / 2 sum_k u_k (q_kj - 1)),   q_kj = |E_k,j|_F^2 / (out_j in_j)

(u the shaped fitness / N, q the squared standardised noise averaged over the matrix; eta, by
default SNES's (3 + ln d) / (5 sqrt d), d the matrices). A sigma per weight would not fit: sigma
times a low-rank E elementwise is no longer low rank, so no longer a LoRA, and it would cost
another fp32 copy of every matrix, the memory EGGROLL exists to save.

with w the shaped fitness. The driver keeps only the fitness of each generation; every
worker applies the same update to its own fp32 master copies (`MasterWeights`) from the run
seed and that fitness, so no weights cross the network and any worker can rebuild the
weights of any generation from a snapshot and the fitness that followed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar, Mapping

import numpy as np
import torch

from evora.lora import Tensors
from evora.lora.layout import AdapterLayout, ModuleSlot
from evora.lora.noise import gaussian, in_parallel, noise_generation, noise_key, runs_by_cost
from evora.strategies import separable
from evora.strategies.eggroll.config import EggrollConfig
from evora.strategies.full_weights import decays_to_start, with_fitness
from evora.strategies.master_weights import MasterWeights, start_copies
from evora.strategies.noise_sums import member_coefficients
from evora.strategies.protocol import CandidateSpec, GenerationResults, StrategyContext, Told
from evora.strategies.shaping import shape
from evora.strategies.snes.strategy import paper_sigma_lr


@dataclass
class EggrollState:
    STATE_VERSION: ClassVar[int] = 1
    modules: list[str]  # the perturbed modules, in the layout's order
    shapes: list[list[int]]  # [out, in] of each
    scale: float  # the candidates' LoRA scale (alpha / rank)
    # per generation: the population's fitness (shaping=per_prompt: its per-prompt normalised means)
    fitness: list[list[float]] = field(default_factory=list)
    # distribution=snes: per generation, the sigma of each module (generation g draws with sigmas[g]);
    # empty under distribution=fixed, whose sigma is strategy.sigma throughout
    sigmas: list[list[float]] = field(default_factory=list)


@dataclass(frozen=True)
class EggrollPayload:
    generation: int
    modules: tuple[tuple[str, int, int], ...]  # (module, out, in)
    scale: float
    sigmas: tuple[float, ...]  # the generation's sigma of each module, in the modules' order


@dataclass(frozen=True)
class WeightUpdate:
    """What every worker applies after a generation: a pure function of the fitness."""

    generation: int
    step: int  # 1-based: Adam's bias correction
    coefficients: tuple[float, ...]  # per member: sum over its candidates of shaped fitness x sign
    population: int
    sigmas: Mapping[str, float]  # module -> the generation's sigma


class EggrollStrategy:
    state_type: ClassVar[type] = EggrollState  # kind=full_weight: the loop syncs the engines' weights after each tell

    def __init__(self, cfg: EggrollConfig, run_seed: int):
        self.cfg = cfg
        self.run_seed = run_seed

    @property
    def perturbation_rank(self) -> int:
        return self.cfg.rank

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

    def factors(
        self, generation: int, member: int, module: str, out_features: int, in_features: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B [out, r], A [r, in]) of member's perturbation of a module."""
        b_key, a_key = self.factor_keys(generation, member, module)
        return gaussian(b_key, (out_features, self.cfg.rank)), gaussian(a_key, (self.cfg.rank, in_features))

    def factor_keys(self, generation: int, member: int, module: str) -> tuple[int, int]:
        """The generator seeds of member's B and A for a module (under noise reuse, those of the
        generation that drew them)."""
        key = (self.run_seed, "eggroll", noise_generation(generation, self.cfg.noise_reuse), member, module)
        return noise_key(*key, "B"), noise_key(*key, "A")

    # --- ask / tell -------------------------------------------------------------------

    def initial_state(self, context: StrategyContext) -> EggrollState:
        slots = context.layout.modules
        adapted = [[self.cfg.sigma] * len(slots)] if self.cfg.distribution == "snes" else []
        shapes = [[s.out_features, s.in_features] for s in slots]
        return EggrollState([s.name for s in slots], shapes, context.layout.scale, sigmas=adapted)

    def sigmas_of(self, state: EggrollState, generation: int) -> tuple[float, ...]:
        """The sigma of each module in `generation`."""
        if not state.sigmas:  # distribution=fixed
            return (self.cfg.sigma,) * len(state.modules)
        return tuple(state.sigmas[generation])

    def population(self, generation: int) -> list[CandidateSpec]:
        return [
            CandidateSpec(generation, i, member=i // 2, sign=1 if i % 2 == 0 else -1)
            for i in range(self.cfg.population)
        ]

    def ask(self, state: EggrollState, generation: int) -> tuple[list[CandidateSpec], EggrollPayload]:
        modules = tuple((name, out, in_) for name, (out, in_) in zip(state.modules, state.shapes))
        return self.population(generation), EggrollPayload(
            generation, modules, state.scale, self.sigmas_of(state, generation)
        )

    def materialise(self, payload: EggrollPayload, spec: CandidateSpec) -> Tensors:
        """The candidate's LoRA: scale * lora_B @ lora_A = sign sigma E_m."""
        factor = spec.sign / (math.sqrt(self.cfg.rank) * payload.scale)
        out: Tensors = {}
        for (name, out_features, in_features), sigma in zip(payload.modules, payload.sigmas):
            slot = ModuleSlot(name, None, in_features, out_features)
            b, a = self.factors(spec.generation, spec.member, name, out_features, in_features)
            out[slot.a_key] = a
            out[slot.b_key] = b * (sigma * factor)
        return out

    def tell(self, state: EggrollState, specs: list[CandidateSpec], results: GenerationResults) -> Told:
        state = with_fitness(state, specs, results, self.cfg.shaping)
        coefficients = self.update_of(state, specs[0].generation).coefficients
        # Pairs whose + and - candidates tie move nothing (greedy decoding ties often).
        stats = {"pairs_tied": float(sum(c == 0.0 for c in coefficients) / len(coefficients))}
        if state.sigmas:  # distribution=snes
            state = self.adapted(state, specs[0].generation)
            sigmas = state.sigmas[-1]
            stats |= {"sigma_mean": float(np.mean(sigmas)), "sigma_min": min(sigmas), "sigma_max": max(sigmas)}
        return Told(state, stats)

    def adapted(self, state: EggrollState, generation: int) -> EggrollState:
        """The state with the next generation's sigmas, by SNES's rule per matrix (the module's
        docstring): sum_k u_k (q_kj - 1) = sum_m U_m q_mj - sum_k u_k, U_m the sum of the member's
        two candidates' u (its + and - perturbations have the same norm)."""
        fitness = np.asarray(state.fitness[generation], dtype=np.float64)
        utilities = shape(fitness, self.cfg.shaping) / len(fitness)
        per_member = np.asarray(separable.per_member(self.population(generation), utilities)[1])
        live = [m for m in range(len(per_member)) if per_member[m] != 0.0]
        gradient = per_member[live] @ self.squared_noise(state, generation, live) - float(np.sum(utilities))
        eta = self.cfg.sigma_lr if self.cfg.sigma_lr is not None else paper_sigma_lr(len(state.modules))
        sigmas = [s * math.exp(eta / 2 * float(g)) for s, g in zip(state.sigmas[generation], gradient)]
        return replace(state, sigmas=[*state.sigmas, sigmas])

    def squared_noise(self, state: EggrollState, generation: int, members: list[int]) -> np.ndarray:
        """q [members, modules]: |E_m|_F^2 / (out in) of each member's perturbation of each module,
        in float64, from |B A|_F^2 = sum((B^T B) * (A A^T)) (r x r: no out x in product)."""

        def of(item: tuple[str, list[int]]) -> list[float]:
            name, (out_features, in_features) = item
            values = self.cfg.rank * out_features * in_features
            row = []
            for member in members:
                b, a = (f.double() for f in self.factors(generation, member, name, out_features, in_features))
                row.append(float(((b.T @ b) * (a @ a.T)).sum()) / values)
            return row

        modules = list(zip(state.modules, state.shapes))
        columns = in_parallel(of, modules, cost=lambda item: sum(item[1]))
        return np.asarray(columns, dtype=np.float64).reshape(len(modules), len(members)).T

    def center(self, state: EggrollState) -> Tensors:
        return {}  # no adapter: the engines' own (updated) weights are the center

    # --- the weight update, on every worker --------------------------------------------

    def update_of(self, state: EggrollState, generation: int) -> WeightUpdate:
        """The update that follows `generation` (0-based), from its fitness."""
        fitness = np.asarray(state.fitness[generation], dtype=np.float64)
        coefficients = member_coefficients(self.population(generation), shape(fitness, self.cfg.shaping))
        sigmas = dict(zip(state.modules, self.sigmas_of(state, generation)))
        return WeightUpdate(generation, generation + 1, coefficients, len(fitness), sigmas)

    def master_bytes(self, layout: AdapterLayout) -> int:
        """Host memory of one worker's master copies (and Adam's two moments, and the decay's
        anchor under weight_decay_anchor=start): 4 bytes a weight each."""
        weights = sum(slot.out_features * slot.in_features for slot in layout.modules)
        return 4 * weights * ((3 if self.cfg.optimizer == "adam" else 1) + self.anchored)

    def start_master(self, tensors: Tensors, transposed: frozenset[str] = frozenset()) -> MasterWeights:
        """fp32 copies as the checkpoint stores them; `transposed`: those stored [in, out]."""
        master = start_copies(tensors, transposed, self.anchored)
        if self.cfg.optimizer == "adam":
            master.adam_m = {k: torch.zeros_like(v) for k, v in master.tensors.items()}
            master.adam_v = {k: torch.zeros_like(v) for k, v in master.tensors.items()}
        return master

    def gradient(
        self, update: WeightUpdate, module: str, out_features: int, in_features: int, device: str | torch.device = "cpu"
    ) -> torch.Tensor:
        """1/(N sigma) sum_m c_m E_m, dense [out, in]: the product of `update_factors`."""
        left, right = self.update_factors(update, module, out_features, in_features, device)
        return left @ right

    def update_factors(
        self, update: WeightUpdate, module: str, out_features: int, in_features: int, device: str | torch.device = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(L [out, K], R [K, in]), K = live members x r, with L R = 1/(N sigma) sum_m c_m E_m:
        the members' B scaled by their coefficients and stacked, and their A stacked, members in
        order. The factors are drawn on the CPU, as the candidates' LoRAs are (their stream is the
        promise), members at once over the process's threads, straight into one buffer per side;
        they are moved to `device`, where the master copies are. (A member at a time, with a tensor
        each and a concatenation, grew faster than linearly in M and spent more than the draw:
        bench/eggroll_update.py.)"""
        live = [(m, c) for m, c in enumerate(update.coefficients) if c != 0.0]
        rank = self.cfg.rank
        bs = torch.empty(len(live), out_features, rank)  # the i-th live member's B [out, r] at bs[i]
        as_ = torch.empty(len(live) * rank, in_features)  # its A [r, in] at rows i r .. (i + 1) r

        def draw(chunk: list[int]) -> None:  # each member's factors have streams of their own
            stream = torch.Generator()  # re-seeded for each: bitwise a generator each (gaussian)
            for i in chunk:
                b_key, a_key = self.factor_keys(update.generation, live[i][0], module)
                bs[i].normal_(generator=stream.manual_seed(b_key))
                as_[i * rank : (i + 1) * rank].normal_(generator=stream.manual_seed(a_key))

        in_parallel(draw, runs_by_cost([1.0] * len(live), torch.get_num_threads()))  # consecutive runs
        scale = 1.0 / (update.population * update.sigmas[module] * math.sqrt(self.cfg.rank))
        bs *= torch.tensor([c * scale for _, c in live], dtype=torch.float32).view(-1, 1, 1)
        stacked = bs.to(device).permute(1, 0, 2).reshape(out_features, len(live) * rank)  # torch.cat(B_m, dim=1)
        return stacked, as_.to(device)

    def apply(self, master: MasterWeights, update: WeightUpdate) -> float:
        """Apply one update to the master copies in place; returns the update's norm. Plain SGD
        (the paper's) adds each matrix's low-rank update as one product into the weights
        (`add_low_rank`): no dense gradient exists."""
        if update.generation != master.generation:
            raise ValueError(f"update of generation {update.generation} on weights of generation {master.generation}")
        cfg, squares = self.cfg, 0.0
        for name, weight in master.tensors.items():
            module, (rows, cols) = name.rsplit(".", 1)[0], weight.shape
            if name in master.transposed:  # stored [in, out]: the [out, in] update, transposed
                left, right = self.update_factors(update, module, cols, rows, weight.device)
                left, right = right.T, left.T
            else:
                left, right = self.update_factors(update, module, rows, cols, weight.device)
            if cfg.optimizer == "sgd" and not cfg.weight_decay:
                squares += add_low_rank(weight, left * cfg.lr, right)
                continue
            grad = left @ right
            direction = grad if cfg.optimizer == "sgd" else self._adam(master, name, grad, update.step)
            delta = cfg.lr * direction
            if cfg.weight_decay:
                delta -= master.decay(name, cfg.lr * cfg.weight_decay)
            weight += delta
            squares += float(torch.linalg.vector_norm(delta, dtype=torch.float64)) ** 2
        master.generation += 1
        return math.sqrt(squares)

    def _adam(self, master: MasterWeights, name: str, grad: torch.Tensor, step: int) -> torch.Tensor:
        if master.adam_m is None or master.adam_v is None:
            raise ValueError("optimizer=adam: the master weights have no Adam moments")
        b1, b2, eps = self.cfg.beta1, self.cfg.beta2, self.cfg.eps
        m, v = master.adam_m[name], master.adam_v[name]
        m.mul_(b1).add_(grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        return (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps)


def add_low_rank(weight: torch.Tensor, left: torch.Tensor, right: torch.Tensor) -> float:
    """weight += left @ right in place; returns |left @ right|_F^2. Where the factors are smaller
    than the matrix (K (out + in) < out in), one product adds into the weights (no full-size
    temporary: a fresh one costs its page faults, several times the product at small K) and the
    norm comes from the two K x K Grams, sum((L^T L) * (R R^T)); otherwise through the product."""
    k = left.shape[1]
    rows, cols = weight.shape
    if k * (rows + cols) >= rows * cols:
        delta = left @ right
        weight += delta
        return float(torch.linalg.vector_norm(delta, dtype=torch.float64)) ** 2
    weight.addmm_(left, right)
    return max(0.0, float(((left.T @ left) * (right @ right.T)).sum(dtype=torch.float64)))
