"""The machinery around generation at real models' shapes (issue 37): per candidate and per
generation, by evora's own strategy and engine code, for the models users run.

    python bench/real_shapes.py [--device cpu|cuda] [--models qwen2.5-1.5b,qwen2.5-7b,qwen3-30b-a3b]
        [--strategies es,ga,eggroll,es_full] [--populations 30,1024,16384] [--layers 1]
        [--workers 1,2] [--iteration-seconds 45] [--smoke] [--out PATH]

What is measured (the median of --repeats, on --layers decoder layers of random weights at the
model's real widths, then extrapolated to every layer: every layer has the same shapes):

  es       LoRA rank 8 on all seven projections (Qwen3-30B-A3B: attention and every expert's
           gate/up/down): `materialise` per candidate; per generation the update: the way before
           issue 37 (the driver draws every member's noise; on the CPU only) against the summed
           way (strategies/noise_sums.py): the workers' group sums, summed over workers (on the
           CPU on one thread, as the driver redrew them: the work itself), and the driver's part
           (adding the groups, the step); on the CPU the wall time of the group sums on --workers
           processes sharing this machine's threads; the checkpoint (torch.save). With --device
           cuda the candidates and the sums are drawn on the GPU, as workers draw them under
           hardware.noise_device=auto, each group's sum brought back to the host
  ga       LoRA rank 8: `materialise` of a mutated child per candidate; `tell` per generation
           (its survivors materialised on the driver)
  eggroll  rank 1: `materialise` per candidate; `apply` (the update), the checksum, and the weight
           sync (the engine's weights set from the fp32 masters) per generation
  es_full  per candidate, the perturbation set inside the transformers engine from seeds
           (`perturb_base`) and the restore (`set_base_weights` of the masters); per unit of 8
           candidates, as a worker runs them (restore once); "the paper's way" beside it (bf16
           noise drawn from one generator per matrix, added in place, then redrawn and subtracted,
           as es-at-scale's worker extension does; written here); `apply`, checksum, per generation

  limit    the time to draw the step's noise at this device's measured randn rate (fp32, the
           process's threads), plus to move its weight bytes at the measured copy bandwidth, plus
           its matrix products' FLOPs at the measured fp32 product rate (EGGROLL's update: one
           product of the stacked factors, 2 x members x rank x weights); `of_noise_limit` holds
           a step against drawing its noise alone
  share    a step's seconds per generation / (--iteration-seconds + them): 45 s is the issue's
           figure for the ES paper's code at Qwen2.5-1.5B on 2 H100s, not measured here, and
           assumed for every model size

Populations the update cannot be measured at in minutes are extrapolated from the largest
measured one, linearly in members (every member draws the same noise), and marked so.
Results: bench/results/real_shapes.json (--out), and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from evora.lora.layout import AdapterLayout, ModuleSlot
from evora.lora.noise import tensors_to
from evora.strategies.eggroll import EggrollConfig, EggrollStrategy
from evora.strategies.es import ESConfig, EvolutionStrategy
from evora.strategies.es_full import EsFullConfig, EsFullStrategy
from evora.strategies.full_weights import matrix_name
from evora.strategies.ga import GAConfig, GeneticAlgorithm
from evora.strategies.master_weights import MasterWeights
from evora.strategies.noise_sums import add_groups, member_groups
from evora.strategies.protocol import StrategyContext, fitness_results

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
SEED = 0


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    intermediate: int = 0  # dense MLP
    experts: int = 0  # a mixture: experts per layer, each of moe_intermediate
    moe_intermediate: int = 0

    def attention(self) -> dict[str, tuple[int, int]]:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "self_attn.q_proj": (q, self.hidden),
            "self_attn.k_proj": (kv, self.hidden),
            "self_attn.v_proj": (kv, self.hidden),
            "self_attn.o_proj": (self.hidden, q),
        }

    def layer(self) -> dict[str, tuple[int, int]]:
        """(out, in) of one decoder layer's matrices, by module suffix."""
        out = self.attention()
        if self.experts:
            for e in range(self.experts):
                out[f"mlp.experts.{e}.gate_proj"] = (self.moe_intermediate, self.hidden)
                out[f"mlp.experts.{e}.up_proj"] = (self.moe_intermediate, self.hidden)
                out[f"mlp.experts.{e}.down_proj"] = (self.hidden, self.moe_intermediate)
        else:
            out["mlp.gate_proj"] = (self.intermediate, self.hidden)
            out["mlp.up_proj"] = (self.intermediate, self.hidden)
            out["mlp.down_proj"] = (self.hidden, self.intermediate)
        return out


# transformers' Qwen2Config / Qwen3MoeConfig of each
MODELS = {
    "qwen2.5-1.5b": Shape(1536, 12, 2, 128, 28, intermediate=8960),
    "qwen2.5-7b": Shape(3584, 28, 4, 128, 28, intermediate=18944),
    "qwen3-30b-a3b": Shape(2048, 32, 4, 128, 48, experts=128, moe_intermediate=768),
}
SMOKE = Shape(256, 4, 2, 64, 4, intermediate=512)
LORA = ("es", "ga")  # strategies whose candidates are LoRAs of the run's rank
DRIVERS_PART = "update: driver's part"


def layout_of(shape: Shape, layers: int, rank: int) -> AdapterLayout:
    slots = tuple(
        ModuleSlot(f"model.layers.{i}.{suffix}", i, inp, out)
        for i in range(layers)
        for suffix, (out, inp) in shape.layer().items()
    )
    return AdapterLayout(slots, rank, float(rank), tuple(sorted({s.name.split(".")[-1] for s in slots})), None, "bench")


def adapter(layout: AdapterLayout) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    out = {}
    for slot in layout.modules:
        out[slot.a_key] = torch.randn(layout.rank, slot.in_features, generator=generator) * 0.01
        out[slot.b_key] = torch.randn(slot.out_features, layout.rank, generator=generator) * 0.01
    return out


def masters(layout: AdapterLayout, device: str) -> MasterWeights:
    generator = torch.Generator().manual_seed(2)
    tensors = {
        matrix_name(s.name): (torch.randn(s.out_features, s.in_features, generator=generator) * 0.02).to(device)
        for s in layout.modules
    }
    return MasterWeights(tensors)


def timed(fn: Callable[[], Any], device: str, repeats: int) -> float:
    """The median wall seconds of `repeats` calls (one when a call takes over 5 s)."""
    times: list[float] = []
    while len(times) < repeats:
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if times[-1] > 5:
            break
    return statistics.median(times)


def timed_pair(first: Callable[[], Any], second: Callable[[], Any], device: str, repeats: int) -> tuple[float, float]:
    """Two ways of one step, each called once untimed, then their calls alternated: the
    device's clocks and caches treat both alike (medians of `repeats` calls each)."""
    first(), second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, own in zip((first, second), times):
            own.append(timed(fn, device, 1))
    return statistics.median(times[0]), statistics.median(times[1])


# --- the device's limits ------------------------------------------------------------------------


def device_limits(device: str, threads: int) -> dict[str, float]:
    """randn values per second (fp32, one generator per tensor, as evora draws; on a CPU with the
    process's threads, each drawing tensors of its own), copy bandwidth (bytes read + written per
    second; the source written first: untouched pages all read one zero page, from the cache)
    and the fp32 rate of a product adding a low-rank [4096, 256] x [256, 4096] into a matrix (FLOPs per
    second)."""
    from concurrent.futures import ThreadPoolExecutor

    size = 1 << 24
    buffers = [torch.empty(size, device=device) for _ in range(max(1, threads))]

    def draw(buffer: torch.Tensor) -> None:
        torch.randn(size, generator=torch.Generator(device=device).manual_seed(7), out=buffer)

    with ThreadPoolExecutor(len(buffers)) as pool:
        drawn = timed(lambda: list(pool.map(draw, buffers)), device, 3)
    source, target = torch.ones(1 << 26, device=device), torch.zeros(1 << 26, device=device)
    copy = timed(lambda: target.copy_(source), device, 5)
    weight = torch.zeros(4096, 4096, device=device)
    left, right = source[: 4096 * 256].view(4096, 256), source[: 256 * 4096].view(256, 4096)
    product = timed(lambda: weight.addmm_(left, right), device, 5)
    return {
        "randn_per_s": len(buffers) * size / drawn,
        "bytes_per_s": 2 * source.numel() * 4 / copy,
        "flops_per_s": 2 * 256 * weight.numel() / product,
    }


def limit(limits: dict[str, float], values: float, weight_bytes: float, flops: float = 0.0) -> float:
    return values / limits["randn_per_s"] + weight_bytes / limits["bytes_per_s"] + flops / limits["flops_per_s"]


# --- rows ---------------------------------------------------------------------------------------


@dataclass
class Context:
    model: str
    shape: Shape
    args: argparse.Namespace
    limits: dict[str, float]

    @property
    def scale(self) -> float:
        """Measured layers -> the whole model."""
        return self.shape.layers / self.args.layers

    def row(
        self,
        strategy: str,
        step: str,
        seconds: float,
        values: float,
        weight_bytes: float,
        flops: float = 0.0,
        **extra: Any,
    ) -> dict:
        """A whole-model figure from one measured on --layers layers (values, bytes, FLOPs: the measured ones)."""
        whole = seconds * self.scale
        bound = limit(self.limits, values * self.scale, weight_bytes * self.scale, flops * self.scale)
        noise = values * self.scale / self.limits["randn_per_s"]
        out = {
            "model": self.model,
            "strategy": strategy,
            "step": step,
            "seconds": whole,
            "limit_seconds": bound,
            "of_limit": whole / bound if bound else None,
            "of_noise_limit": whole / noise if noise else None,  # against drawing its noise alone
            "share": whole / (self.args.iteration_seconds + whole),
            "measured_layers": self.args.layers,
        }
        return {**out, **extra}


def numel(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() for t in tensors.values())


def fitness(population: int) -> Any:
    return fitness_results(0, np.random.default_rng(population).normal(size=population))


def measured_populations(args: argparse.Namespace, draws_per_member: float) -> list[tuple[int, bool]]:
    """(population, measured) in order: those whose update draws under --max-draws values on the
    measured layers are measured, the rest extrapolated from the largest measured."""
    out, measured_one = [], False
    for population in args.populations:
        measured = population // 2 * draws_per_member <= args.max_draws or not measured_one
        measured_one |= measured
        out.append((population, measured))
    return out


def extrapolated(rows: list[dict], step: str, population: int, members: int, iteration: float) -> dict:
    """The last measured row of `step` scaled to `population`: linearly in members (every member
    draws the same noise), or for the driver's part of a summed update in its groups (one add of
    the whole adapter a group)."""
    last = [r for r in rows if r["step"] == step and not r.get("extrapolated")][-1]
    factor = members / last["members"]
    out = {**last, "population": population, "members": members, "extrapolated": True}
    if "groups" in last:
        out["groups"] = len(member_groups(members))
        factor = out["groups"] / last["groups"] if step == DRIVERS_PART else factor
    seconds = last["seconds"] * factor
    out.update(seconds=seconds, limit_seconds=last["limit_seconds"] * factor)
    return {**out, "share": seconds / (iteration + seconds)}


# --- es -----------------------------------------------------------------------------------------


def driver_redraw(es: EvolutionStrategy, state: Any, specs: list, fitness_vector: np.ndarray) -> dict:
    """Today's update before issue 37, for comparison in the same run: the driver redraws every
    member's noise, one tensor after another on one thread, into one accumulator each."""
    from evora.lora.noise import member_noise
    from evora.strategies.noise_sums import member_coefficients
    from evora.strategies.shaping import shape

    coefficient = member_coefficients(specs, shape(fitness_vector, es.cfg.shaping))
    grad = {}
    for name, value in state.theta.items():
        acc = torch.zeros_like(value)
        for member, c in enumerate(coefficient):
            if c != 0.0:
                acc.add_(member_noise(SEED, 0, member, name, tuple(value.shape)), alpha=c)
        grad[name] = acc
    return grad


_JOB: tuple[Any, Any, Any] | None = None  # (strategy, payload, sums) a worker process sums groups of


def _start_worker(job: tuple[Any, Any, Any], threads: int) -> None:
    global _JOB
    _JOB = job
    torch.set_num_threads(threads)


def _sum_group(group: int) -> dict[str, torch.Tensor]:
    assert _JOB is not None
    strategy, payload, sums = _JOB
    return strategy.group_sum(payload, sums, group)


def _ready(_: int) -> int:
    return 0


def wall_on_workers(strategy: Any, payload: Any, sums: Any, workers: int, threads: int) -> float:
    """Wall seconds of every group summed by `workers` processes (this machine's threads shared
    among them; spawned, as Ray's workers are, not forked from a process with OpenMP threads),
    the driver adding their sums in group order."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    job, share = (strategy, payload, sums), max(1, threads // workers)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(job, share)) as pool:
        list(pool.map(_ready, range(workers)))  # started before the clock
        start = time.perf_counter()
        add_groups(list(pool.map(_sum_group, range(len(sums.groups)))))
        return time.perf_counter() - start


def es_rows(context: Context) -> list[dict]:
    args = context.args
    layout = layout_of(context.shape, args.layers, 8)
    theta = adapter(layout)
    n = numel(theta)
    es = EvolutionStrategy(ESConfig(population=30), SEED)
    specs, payload = es.ask(es.start(theta), 0)
    on_device = es.payload_to(payload, args.device)  # as a worker holds it (hardware.noise_device=auto)
    seconds = timed(lambda: es.materialise(on_device, specs[0]), args.device, args.repeats)
    rows = [context.row("es", "materialise per candidate", seconds, n, 8 * n)]
    with tempfile.TemporaryDirectory() as folder:
        seconds = timed(lambda: torch.save(theta, Path(folder) / "state.pt"), "cpu", args.repeats)
    rows.append(context.row("es", "checkpoint per generation", seconds, 0, 4 * n))
    for population, measured in measured_populations(args, n):
        members = population // 2
        for step in ("update: driver redraws (before)", "update: workers' sums, summed", DRIVERS_PART):
            if not measured and any(r["step"] == step for r in rows):
                rows.append(extrapolated(rows, step, population, members, args.iteration_seconds))
        if measured:
            rows += es_update_rows(context, theta, population)
    return rows


def es_update_rows(context: Context, theta: dict, population: int) -> list[dict]:
    args, n, members = context.args, numel(theta), population // 2
    cpu = args.device == "cpu"
    es = EvolutionStrategy(ESConfig(population=population), SEED)
    state = es.start(theta)
    specs, payload = es.ask(state, 0)
    results = fitness(population)
    # The driver's redraw is the host's way (before issue 37): on a GPU machine it is not run again.
    before = timed(lambda: driver_redraw(es, state, specs, results.fitness), "cpu", args.repeats) if cpu else None
    sums, on_device = es.noise_sums(state, specs, results), es.payload_to(payload, args.device)
    parts, worker_seconds = [], 0.0
    torch.set_num_threads(1 if cpu else args.threads)  # the work itself, on one thread as the driver redrew it
    try:
        for group in range(len(sums.groups)):
            start = time.perf_counter()
            # As a worker returns it: drawn where the payload is, back on the host (a GPU's sync).
            parts.append(tensors_to(es.group_sum(on_device, sums, group), "cpu"))
            worker_seconds += time.perf_counter() - start
    finally:
        torch.set_num_threads(args.threads)
    driver = timed(lambda: es.tell_with(state, specs, results, add_groups(parts)), "cpu", args.repeats)
    walls = {
        f"wall_{w}_workers": wall_on_workers(es, payload, sums, w, args.threads) * context.scale
        for w in (args.workers if cpu else ())  # processes sharing the host's threads: a CPU figure
    }
    common = {"population": population, "members": members, "groups": len(sums.groups)}
    draws, moved = members * n, members * n * 4
    rows = (
        [] if before is None else [context.row("es", "update: driver redraws (before)", before, draws, moved, **common)]
    )
    return rows + [
        context.row("es", "update: workers' sums, summed", worker_seconds, draws, moved, **common, **walls),
        context.row("es", DRIVERS_PART, driver, 0, len(sums.groups) * n * 12, **common),
    ]


# --- ga -----------------------------------------------------------------------------------------


def ga_rows(context: Context) -> list[dict]:
    args = context.args
    layout = layout_of(context.shape, args.layers, 8)
    theta = adapter(layout)
    n = numel(theta)
    rows = []
    for population in args.populations:
        ga = GeneticAlgorithm(GAConfig(population=population, keep_top=2, parents=4), SEED)
        state = ga.start(theta)
        specs, payload = ga.ask(state, 0)
        if population == args.populations[0]:
            seconds = timed(lambda: ga.materialise(payload, specs[-1]), "cpu", args.repeats)
            rows.append(context.row("ga", "materialise per candidate", seconds, n, 8 * n))
        seconds = timed(lambda: ga.tell(state, specs, fitness(population)), "cpu", args.repeats)
        rows.append(context.row("ga", "tell per generation", seconds, 4 * n, 32 * n, population=population))
    return rows


# --- full-weight strategies: a transformers engine of real widths --------------------------------


def engine_model(shape: Shape, layers: int, folder: Path) -> str:
    """A Qwen2 of the shape's widths with `layers` layers (random weights, the tiny model's
    tokenizer and a vocabulary of its size) saved in `folder`, for the transformers engine."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[1] / "evora" / "models" / "tiny")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def hf_engine(shape: Shape, args: argparse.Namespace, folder: Path) -> Any:
    from evora.engines.base import EngineSpec
    from evora.engines.hf_engine import HFEngine

    model = engine_model(shape, args.layers, folder)
    return HFEngine(EngineSpec(model=model, dtype="bfloat16", device=args.device, cpu_threads=args.threads))


def engine_masters(engine: Any, layout: AdapterLayout, device: str) -> MasterWeights:
    names = [matrix_name(s.name) for s in layout.modules]
    return MasterWeights({k: v.to(torch.float32).to(device) for k, v in engine.base_weights(names).items()})


def replayed(apply: Callable[[MasterWeights, Any], float], master: MasterWeights, update: Any) -> Callable[[], float]:
    """`apply` again and again on the same copies (their generation set back each time)."""

    def run() -> float:
        master.generation = update.generation
        return apply(master, update)

    return run


def full_weight_common(context: Context, engine: Any, master: MasterWeights, strategy: str) -> list[dict]:
    args, n = context.args, numel(master.tensors)
    checksum = timed(master.checksum, args.device, args.repeats)
    sync = timed(lambda: engine.set_base_weights(master.tensors), args.device, args.repeats)
    return [
        context.row(strategy, "checksum per generation", checksum, 0, 4 * n),
        context.row(strategy, "weight sync per generation", sync, 0, 6 * n),
    ]


def eggroll_rows(context: Context, engine: Any) -> list[dict]:
    args = context.args
    layout = layout_of(context.shape, args.layers, 1)
    eg = EggrollStrategy(EggrollConfig(population=30, rank=1), SEED)
    state = eg.initial_state(StrategyContext(SEED, layout, "bench"))
    specs, payload = eg.ask(state, 0)
    factors = sum(s.in_features + s.out_features for s in layout.modules)
    seconds = timed(lambda: eg.materialise(payload, specs[0]), "cpu", args.repeats)
    rows = [context.row("eggroll", "materialise per candidate", seconds, factors, 8 * factors)]
    master = engine_masters(engine, layout, args.device)
    n = numel(master.tensors)
    rows += full_weight_common(context, engine, master, "eggroll")
    for population, measured in measured_populations(args, factors):
        if not measured:
            rows.append(
                extrapolated(rows, "update per generation", population, population // 2, args.iteration_seconds)
            )
            continue
        eg = EggrollStrategy(EggrollConfig(population=population, rank=1), SEED)
        state = eg.initial_state(StrategyContext(SEED, layout, "bench"))
        specs, _ = eg.ask(state, 0)
        update = eg.update_of(eg.tell(state, specs, fitness(population)).state, 0)
        seconds = timed(replayed(eg.apply, master, update), args.device, args.repeats)
        members = population // 2
        rows.append(
            context.row(
                "eggroll",
                "update per generation",
                seconds,
                members * factors,
                8 * n,  # the weights read and written once (plain SGD adds the product into them)
                2 * members * n,  # rank 1: [out, members] x [members, in]
                population=population,
                members=members,
            )
        )
    return rows


def paper_way(engine: Any, names: list[str], keys: list[int], sigma: float, device: str) -> None:
    """es-at-scale's candidate (its worker extension's perturb and restore, written here): every
    matrix's noise drawn in the engine's dtype from a generator of its own, added in place; then
    the same noise drawn again and subtracted."""
    for sign in (1.0, -1.0):
        for name, key in zip(names, keys):
            parameter = engine._base_parameter(name)
            generator = torch.Generator(device=parameter.device).manual_seed(key)
            noise = torch.randn(parameter.shape, dtype=parameter.dtype, device=parameter.device, generator=generator)
            parameter.data.add_(noise, alpha=sign * sigma)


def es_full_rows(context: Context, engine: Any) -> list[dict]:
    args = context.args
    layout = layout_of(context.shape, args.layers, 1)
    es = EsFullStrategy(EsFullConfig(population=30), SEED)
    state = es.initial_state(StrategyContext(SEED, layout, "bench"))
    specs, payload = es.ask(state, 0)
    master = engine_masters(engine, layout, args.device)
    n = numel(master.tensors)

    def candidate(spec: Any) -> None:
        engine.perturb_base(master.tensors, es.perturbation(payload, spec))

    def one() -> None:
        candidate(specs[0])
        engine.set_base_weights(master.tensors)

    def unit() -> None:  # as a worker runs a unit: candidates back to back, one restore
        for spec in specs[:8]:
            candidate(spec)
        engine.set_base_weights(master.tensors)

    terms = es.perturbation(payload, specs[0])
    names, keys = [t.name for t in terms], [t.key for t in terms]

    def papers() -> None:
        paper_way(engine, names, keys, 0.001, args.device)

    ours, theirs = timed_pair(one, papers, args.device, args.repeats)
    rows = [
        context.row("es_full", "perturb + restore per candidate", ours, n, 12 * n),
        context.row("es_full", "per candidate, in a unit of 8", timed(unit, args.device, 1) / 8, n, 6.75 * n),
        context.row("es_full", "per candidate, the paper's way", theirs, 2 * n, 8 * n),
    ]
    rows += full_weight_common(context, engine, master, "es_full")
    for population in args.populations:
        if population != args.populations[0]:
            rows.append(extrapolated(rows, "update per generation", population, population, args.iteration_seconds))
            continue
        es = EsFullStrategy(EsFullConfig(population=population), SEED)
        update = es.update_of(es.tell(state, es.ask(state, 0)[0], fitness(population)).state, 0)
        seconds = timed(replayed(es.apply, master, update), args.device, args.repeats)
        rows.append(
            context.row(
                "es_full",
                "update per generation",
                seconds,
                population * n,
                12 * n,
                population=population,
                members=population,
            )
        )
    return rows


# --- the run ------------------------------------------------------------------------------------

STRATEGIES: dict[str, Callable[..., list[dict]]] = {
    "es": es_rows,
    "ga": ga_rows,
    "eggroll": eggroll_rows,
    "es_full": es_full_rows,
}
FULL_WEIGHT = ("eggroll", "es_full")


def measure_model(model: str, shape: Shape, args: argparse.Namespace, limits: dict[str, float]) -> list[dict]:
    context = Context(model, shape, args, limits)
    rows: list[dict] = []
    for strategy in args.strategies:
        if strategy in LORA:
            rows += STRATEGIES[strategy](context)
    full_weight = [s for s in args.strategies if s in FULL_WEIGHT]
    if full_weight and not shape.experts:  # evora moves no expert weights (run_plan.model_layout)
        with tempfile.TemporaryDirectory() as folder:
            engine = hf_engine(shape, args, Path(folder))
            try:
                for strategy in full_weight:
                    rows += STRATEGIES[strategy](context, engine)
            finally:
                engine.shutdown()
    for row in rows:
        print(format_row(row), flush=True)
    return rows


def format_row(row: dict) -> str:
    population = f"N={row['population']}" if "population" in row else ""
    extra = " (extrapolated)" if row.get("extrapolated") else ""
    walls = " ".join(f"{k}={v:.3f}" for k, v in row.items() if k.startswith("wall_"))
    ratio = f"{row['of_limit']:.2f}x limit" if row.get("of_limit") else ""
    return (
        f"{row['model']:14} {row['strategy']:8} {row['step']:36} {population:8} {row['seconds']:10.4f} s "
        f"{ratio:12} share {100 * row['share']:5.1f}%{extra} {walls}"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", default="qwen2.5-1.5b,qwen2.5-7b,qwen3-30b-a3b")
    parser.add_argument("--strategies", default="es,ga,eggroll,es_full")
    parser.add_argument("--populations", default="30,1024,16384")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers measured (then extrapolated)")
    parser.add_argument("--workers", default="1,2", help="processes the summed ES update is spread over")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-draws", type=float, default=1.5e9, help="noise values an update may draw when measured")
    parser.add_argument("--iteration-seconds", type=float, default=45.0)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and populations: seconds")
    parser.add_argument("--out", default=str(RESULTS / "real_shapes.json"))
    args = parser.parse_args(argv)
    args.strategies = args.strategies.split(",")
    args.populations = [int(p) for p in args.populations.split(",")]
    args.workers = [int(w) for w in args.workers.split(",") if w]
    if args.smoke:
        args.populations, args.repeats, args.layers = [4, 8], 1, 1
        args.workers = args.workers[:1]
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    limits = device_limits(args.device, args.threads)
    print(
        f"device {args.device}, {args.threads} threads: randn {limits['randn_per_s'] / 1e6:.0f} M values/s, "
        f"copy {limits['bytes_per_s'] / 1e9:.1f} GB/s, fp32 product {limits['flops_per_s'] / 1e9:.0f} GFLOP/s",
        flush=True,
    )
    models = {"smoke": SMOKE} if args.smoke else {m: MODELS[m] for m in args.models.split(",")}
    rows = [row for model, shape in models.items() for row in measure_model(model, shape, args, limits)]
    report = {"device": args.device, "threads": args.threads, "limits": limits, "args": vars(args), "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
