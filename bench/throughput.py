"""Population-evaluation throughput on the work users run (docs/architecture.md, "Benchmarks").
Every figure is a ratio measured in this one run on this machine.

    python bench/throughput.py [--workload fixed|uneven|long] [--device cpu|cuda] [--model PATH]
                               [--no-overhead] [--no-round-trip] [--out FOLDER]
    python bench/throughput.py --smoke [--workload uneven] [--overhead] [--out FOLDER]

Workloads (every path generates exactly the same tokens, `ignore_eos`):
  fixed    16 adapters x 32 prompts x 16 tokens
  uneven   16 adapters x 16 prompts, each sequence's length drawn from a Countdown-like
           log-normal (median 150 tokens, sigma 0.6, clipped to 8..512): per-request
           max_tokens in vLLM; transformers generates each batch to its longest sequence
           and is charged for it, as batched generation is
  long     4 adapters x 8 prompts x 1,024 tokens

(--max-loras below the population: engine.units=fixed makes several calls, =whole one.)

Paths:
  evora         EngineWorker.evaluate (materialise N adapters from seeds, multi-LoRA vLLM
                generate, rewards): engine.units=fixed (max_loras a call) and, with --whole,
                =whole (one call, vLLM keeping max_loras in flight)
  seeds' way    one adapter at a time through transformers generate (PEFT), prompts batched;
                the first --seeds-way-adapters of the population (default 2 for uneven and long,
                every one for fixed), its tokens/s those adapters' tokens over their seconds
  base limit    the same vLLM engine generating the same sequences with the base model only
  overhead      share of a real `evora` generation (1 worker, the CLI) spent outside generate,
                at the workload's mean length (--no-overhead leaves this run out)

Then the adapter round trip at real models' shapes (no generation): materialising an ES
candidate, writing it to /dev/shm and vLLM's load from the file, against vLLM's load of
the same tensors from memory, for Qwen2.5-0.5B and -7B at rank 8 on all seven modules.

The in-process paths take turns, --repeats times each (default 2: the uneven workload's whole
bench took 7.6 minutes on a 2-vCPU machine, where 3 repeats and the seeds' way in full took
21 minutes); evora's ratio to the base-only limit is printed as soon as they are done, with
the share of evora's evaluate spent in evora's CPU multi-LoRA op (vllm_cpu_lora.grouped_lora_linear,
timed around each call; 0 on a GPU, where vLLM's own kernels run): where evora's time beyond
base-only goes on vLLM's CPU build.

--smoke runs every in-process path at the least size, for CI (tests/integration/test_benches.py):
2 adapters x 2 prompts x 8 tokens (uneven: median 4, shortest 2), max_loras 1 (so `fixed` makes
two calls and `whole` one), one repeat, the round trip of 2 candidates at Qwen2.5-0.5B's shapes
only, and no CLI run: starting Ray, a driver and a worker takes a minute or more on a small
machine (`--smoke --overhead` adds a 3-generation one). Its figures mean nothing; it writes to
--out, by default a new temporary folder, never over bench/results.

--previous measures evora as it was before the grouped CPU LoRA op and in-memory adapters
(the in-process paths; the CLI run only goes back to files), for before/after tables.

Without --model, a ~26M-parameter Llama with random weights (the tiny model's tokenizer)
stands in for a real model. Results: bench/results/throughput_<workload>.json, and
throughput.png (tokens/s per path and workload, from every workload's JSON there).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray  # noqa: F401  (EngineWorker.info imports it lazily; fail early if missing)
import torch
from bench_model import bench_layout, build_bench_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODULES = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"


@dataclass(frozen=True)
class Workload:
    name: str
    population: int
    prompts: int
    tokens: int  # every sequence's length; for `uneven`, the cap
    max_loras: int
    generations: int  # of the CLI run that measures the overhead
    seeds_way_adapters: int = 0  # adapters the seeds' way runs (0: every one)
    median: float = 0.0  # uneven: log-normal median and sigma of a sequence's length
    sigma: float = 0.0
    shortest: int = 8

    def length_of(self, label: str, prompt: list[int]) -> int:
        """A sequence's length: a pure function of (candidate, prompt), the same on every path and
        in every generation (a label's `g<generation>-` prefix is left out)."""
        if not self.median:
            return self.tokens
        candidate = label.split("-", 1)[-1]
        digest = hashlib.sha256(f"{candidate}|{prompt}".encode()).digest()
        u = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64
        z = math.sqrt(2) * torch.special.erfinv(torch.tensor(2 * u - 1, dtype=torch.float64)).item()
        return int(min(self.tokens, max(self.shortest, round(self.median * math.exp(self.sigma * z)))))


WORKLOADS = {
    "fixed": Workload("fixed", population=16, prompts=32, tokens=16, max_loras=16, generations=6),
    "uneven": Workload(
        "uneven", 16, prompts=16, tokens=512, max_loras=16, generations=3, seeds_way_adapters=2, median=150, sigma=0.6
    ),
    "long": Workload("long", population=4, prompts=8, tokens=1024, max_loras=4, generations=3, seeds_way_adapters=2),
}
# --smoke: the least size that still runs every in-process path, without the CLI run (--overhead
# adds it back: 3 generations give one measured span, the first being warm-up); flags given
# with --smoke still win.
SMOKE = {
    "population": 2,
    "prompts": 2,
    "tokens": 8,
    "max_loras": 1,
    "repeats": 1,
    "whole": True,
    "round_trip_candidates": 2,
    "overhead": False,
}
SMOKE_GENERATIONS, SMOKE_MEDIAN, SMOKE_SHORTEST = 3, 4.0, 2


class PerRequestLengths:
    """The worker's real engine, with each request's max_tokens set by the workload."""

    def __init__(self, engine: Any, workload: Workload):
        self.engine, self.workload = engine, workload

    def generate(self, prompts, adapters, max_tokens, *rest, **options):
        """The engine protocol's `generate` (evora/engines/base.py) with max_tokens replaced by
        the workload's; the protocol's other arguments (sampling, ...) passed on as they come."""
        labels = [a.name.split("#")[0] if a is not None else "base" for a in adapters]
        lengths = [self.workload.length_of(b, p) for b, p in zip(labels, prompts)]
        return self.engine.generate(prompts, adapters, lengths, *rest, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def overrides(model: str, args: argparse.Namespace, workload: Workload, units: str = "whole") -> list[str]:
    """`whole` also sizes vLLM's host LoRA cache for one call over the whole population."""
    device = ["hardware=gpu", "hardware.num_workers=1"] if args.device == "cuda" else ["hardware.num_workers=1"]
    return [
        *device,
        f"model.path={model}",
        f"model.dtype={args.dtype}",
        f"model.max_model_len={workload.tokens + 128}",
        f"lora.rank={args.rank}",
        "lora.alpha=16",
        "lora.layers=null",
        f"lora.target_modules={MODULES}",
        f"strategy.population={workload.population}",
        "strategy.sigma=0.01",
        "strategy.init_b_std=0.01",
        f"engine.max_loras={workload.max_loras}",
        f"engine.units={units}",
        "engine.ignore_eos=true",
        f"task.prompts_per_generation={workload.prompts}",
        f"task.max_tokens={workload.tokens}",
        f"hardware.cpu_threads_per_worker={args.threads}",
    ]


def timed(fn, repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def interleaved(paths: dict, repeats: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Median seconds of each path, the paths taking turns (a slow spell of a shared machine
    falls on all of them alike), and each path's last result."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    results: dict[str, Any] = {}
    for _ in range(repeats):
        for name, fn in paths.items():
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}, results


def start_worker(model: str, args: argparse.Namespace, workload: Workload) -> Any:
    from evora.distributed.worker import EngineWorker
    from evora.distributed.worker_spec import engine_rank, worker_spec
    from evora.engines.environment import engine_environment
    from evora.plan.compose import compose_run

    run = compose_run(overrides(model, args, workload))
    layout = bench_layout(run, model)
    spec = worker_spec(run, model, layout, "bench", max_lora_rank=engine_rank(layout))
    os.environ.update(engine_environment(spec.engine_name, spec.engine))  # what Ray gives worker actors
    worker = EngineWorker(spec, 0)
    if args.previous:
        previous_implementation(worker.engine)
    worker.engine = PerRequestLengths(worker.engine, workload)
    return worker


def previous_implementation(engine: Any) -> None:
    """evora before the grouped CPU LoRA op and in-memory adapters: vLLM's own `add_lora_linear`
    over evora's per-adapter ops (one matmul per adapter per slice), candidates as files."""
    import vllm.lora.punica_wrapper.punica_cpu as punica_cpu

    wrapper = punica_cpu.PunicaWrapperCPU
    wrapper.add_lora_linear = getattr(wrapper, "_evora_vllm_add_lora_linear", wrapper.add_lora_linear)
    engine.loads_from_memory = False


class OpClock:
    """The seconds evora's CPU multi-LoRA op takes (`vllm_cpu_lora.grouped_lora_linear`, which
    vLLM's patched punica wrapper calls by module attribute) while `timing()` is open, and the
    seconds `timing()` was open: where evora's time beyond base-only goes on vLLM's CPU build
    (the op is not used on a GPU, where this reads 0)."""

    def __init__(self) -> None:
        self.op_seconds = self.open_seconds = 0.0

    @contextmanager
    def timing(self):
        from evora.engines import vllm_cpu_lora

        op = vllm_cpu_lora.grouped_lora_linear

        def timed_op(*args: Any) -> None:
            start = time.perf_counter()
            op(*args)
            self.op_seconds += time.perf_counter() - start

        vllm_cpu_lora.grouped_lora_linear = timed_op
        opened = time.perf_counter()
        try:
            yield
        finally:
            vllm_cpu_lora.grouped_lora_linear = op
            self.open_seconds += time.perf_counter() - opened


def measure_paths(model: str, args: argparse.Namespace, workload: Workload) -> dict:
    """evora (both unit modes), the base limit and the seeds' way, on the same sequences."""
    from evora.distributed.units import search_units
    from evora.distributed.worker import WorkUnit
    from evora.lora.init import random_adapter

    worker = start_worker(model, args, workload)
    state = worker.strategy.start(random_adapter(worker.layout, 0, None, 0.01))
    prompts = tuple(range(workload.prompts))
    generations = iter(range(10**6))
    worker.engine.generate([worker.prompt_ids("train", 0)], [None], 2)  # warm-up

    clock = OpClock()

    def evora(units: str):
        specs, payload = worker.strategy.ask(state, next(generations))
        cut = search_units(specs, prompts, units, workload.max_loras, workers=1)  # the search's own cut
        with clock.timing():
            return [worker.evaluate(payload, WorkUnit(tuple(c), "train", p)) for c, p in cut]

    specs, payload = worker.strategy.ask(state, 0)
    texts = [worker.prompt_ids("train", i) for i in prompts]
    limits = [workload.length_of(s.label, t) for s in specs for t in texts]
    paths = {
        "evora": lambda: evora("fixed"),
        **({"evora_whole": lambda: evora("whole")} if args.whole and not args.previous else {}),
        "base_only": lambda: worker.engine.engine.generate(texts * len(specs), [None] * len(limits), limits),
    }
    seconds, results = interleaved(paths, args.repeats)
    tokens = int(sum(r.tokens.sum() for r in results["evora"]))
    assert tokens == sum(limits) == sum(c.num_tokens for c in results["base_only"])  # the same sequences
    assert "evora_whole" not in results or tokens == int(sum(r.tokens.sum() for r in results["evora_whole"]))
    fixed = results["evora"]
    print_first(seconds, tokens, clock.op_seconds / clock.open_seconds)
    wanted = workload.seeds_way_adapters if args.seeds_way_adapters is None else args.seeds_way_adapters
    sampled = min(len(specs), wanted or len(specs))
    seeds_seconds = seeds_way(worker, specs[:sampled], payload, texts, limits[: sampled * len(texts)], model, args)
    worker.shutdown()
    timings = {k: sum(r.timings[k] for r in fixed) for k in fixed[0].timings}
    return {
        "tokens_per_population": tokens,
        "mean_length": tokens / len(limits),
        **{f"{path}_seconds": value for path, value in seconds.items()},
        # the seeds' way ran `sampled` adapters: its seconds scaled to the population's tokens
        "seeds_way_seconds": seeds_seconds * tokens / sum(limits[: sampled * len(texts)]),
        "seeds_way_adapters": sampled,
        "evora_timings": timings,
        "materialise_share_of_evaluate": timings["materialise"] / sum(timings.values()),
        "lora_op_share_of_evaluate": clock.op_seconds / clock.open_seconds,
    }


def print_first(seconds: dict[str, float], tokens: int, op_share: float) -> None:
    """evora's ratio to the base-model-only limit, as soon as it is measured (the rest of the
    bench takes minutes more), and the CPU multi-LoRA op's share of evora's time."""
    units = {"evora": "engine.units=fixed", "evora_whole": "engine.units=whole"}
    ratios = [f"{seconds['base_only'] / seconds[path]:.3f} ({units[path]})" for path in units if path in seconds]
    print(
        f"evora / base-only limit: {', '.join(ratios)}; base-only {tokens / seconds['base_only']:,.0f} tokens/s; "
        f"the CPU multi-LoRA op {op_share:.1%} of evora's time",
        flush=True,
    )


def seeds_way(worker: Any, specs, payload, texts, limits, model: str, args: argparse.Namespace) -> float:
    """transformers + PEFT, one adapter at a time, its prompts batched (generated to the batch's longest)."""
    from evora.engines import EngineSpec, create_engine
    from evora.strategies.protocol import materialise

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    hf = create_engine(
        "hf",
        EngineSpec(
            model=model,
            dtype=args.dtype,
            max_num_seqs=len(texts),
            cpu_threads=args.threads,
            ignore_eos=True,
            device=args.device,
        ),
    )

    def run() -> int:
        total = 0
        for row, spec in enumerate(specs):
            ref = worker.scratch.write(spec.label, materialise(worker.strategy, payload, spec), worker.layout, dtype)
            own = limits[row * len(texts) : (row + 1) * len(texts)]
            total += sum(c.num_tokens for c in hf.generate(texts, [ref] * len(texts), own))
            hf.release([ref])
            worker.scratch.remove([ref])
        return total

    seconds, tokens = timed(run, max(1, args.repeats - 1) if args.workload == "fixed" else 1)  # the slowest path
    assert tokens == sum(limits)
    hf.shutdown()
    return seconds


def measure_overhead(model: str, args: argparse.Namespace, workload: Workload, mean_length: float) -> dict:
    """A real run through the CLI (Ray, driver actor, object store, checkpoints), one worker."""
    out = Path(tempfile.mkdtemp(prefix="evora-bench-"))
    cli_workload = replace(workload, tokens=max(1, round(mean_length)))
    cmd = [
        sys.executable,
        "-m",
        "evora",
        *overrides(model, args, cli_workload, units="fixed"),
        *(["engine.adapters_in_memory=false"] if args.previous else []),
        f"generations={workload.generations}",
        "eval_every=0",
        "task.eval_size=8",
        f"tracking.out_dir={out}",
        "tracking.progress=false",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"the CLI run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    run_dir = next(out.iterdir())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # A generation is the wall-clock time between consecutive records (dispatch, evaluation,
    # update, metrics, checkpoint: everything). Skip the first (warm-up) and the last (held-out eval).
    spans = [
        (b["time"] - a["time"], b["seconds_generate"], b["tokens"])
        for a, b in zip(records[1:], records[2:])
        if "heldout_reward" not in b
    ]
    shutil.rmtree(out)
    return {
        "overhead_share": statistics.median(1 - generate / span for span, generate, _ in spans),
        "generation_seconds": statistics.median(span for span, _, _ in spans),
        "cli_tokens_per_second_per_worker": statistics.median(tokens / span for span, _, tokens in spans),
        "generations_measured": len(spans),
    }


# --- the adapter round trip at real models' shapes ----------------------------------------

REAL_SHAPES = {  # Qwen2.5 configs: hidden, intermediate, layers, attention heads, key-value heads
    "Qwen2.5-0.5B": (896, 4864, 24, 14, 2),
    "Qwen2.5-7B": (3584, 18944, 28, 28, 4),
}


def real_layout(name: str, rank: int) -> Any:
    """The adapter layout of a real model at `rank` on all seven modules, from its config alone."""
    from transformers import Qwen2Config

    from evora.lora.layout import build_layout
    from evora.lora.modules import adaptable_modules

    hidden, intermediate, layers, heads, kv_heads = REAL_SHAPES[name]
    folder = Path(tempfile.mkdtemp(prefix="evora-bench-config-"))
    Qwen2Config(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=1024,  # the embedding holds no LoRA here
    ).save_pretrained(folder)
    shapes = adaptable_modules(str(folder))
    shutil.rmtree(folder)
    targets = MODULES.strip("[]").split(",")
    return build_layout(shapes, rank=rank, alpha=2 * rank, target_modules=targets, layers=None, base_model=name)


def round_trip(name: str, args: argparse.Namespace) -> dict:
    """Per candidate: materialise (ES: mean + sigma x seeded noise), write to /dev/shm (bf16),
    vLLM's load from that folder, and vLLM's load of the same tensors from memory."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    from evora.engines.adapter_store import AdapterScratch
    from evora.lora.init import random_adapter
    from evora.lora.peft_io import adapter_config
    from evora.strategies import get_strategy
    from evora.strategies.es import ESConfig

    layout = real_layout(name, args.rank)
    strategy = get_strategy("es").build(ESConfig(population=args.round_trip_candidates), 0)
    specs, payload = strategy.ask(strategy.start(random_adapter(layout, 0, None, 0.01)), 0)
    scratch = AdapterScratch("/dev/shm", "bench-round-trip")
    expected = {m.strip() for m in MODULES.strip("[]").split(",")}
    phases: dict[str, list[float]] = {"materialise": [], "write": [], "load_file": [], "load_memory": []}
    for spec in specs:
        marks = [time.perf_counter()]
        tensors = strategy.materialise(payload, spec)
        marks.append(time.perf_counter())
        ref = scratch.write(spec.label, tensors, layout, torch.bfloat16)
        marks.append(time.perf_counter())
        helper = PEFTHelper.from_local_dir(ref.path, 4096)
        LoRAModel.from_local_checkpoint(
            ref.path, expected, helper, lora_model_id=ref.lora_id, device="cpu", dtype=torch.bfloat16
        )
        marks.append(time.perf_counter())
        memory = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
        LoRAModel.from_lora_tensors(
            ref.lora_id, memory, PEFTHelper.from_dict(adapter_config(layout)), device="cpu", dtype=torch.bfloat16
        )
        marks.append(time.perf_counter())
        scratch.remove([ref])
        for phase, start, end in zip(phases, marks, marks[1:]):
            phases[phase].append(end - start)
    scratch.cleanup()
    parameters = layout.rank * sum(slot.in_features + slot.out_features for slot in layout.modules)
    return {
        "adapter_parameters": parameters,
        "adapter_mib_bf16": 2 * parameters / 2**20,
        **{f"{phase}_ms": 1000 * statistics.median(values) for phase, values in phases.items()},
    }


# --- report ------------------------------------------------------------------------------

PATHS = {  # measured key -> table row
    "evora": "evora, engine.units=fixed (the default)",
    "evora_whole": "evora, engine.units=whole",
    "seeds_way": "seeds' way (transformers, one adapter at a time)",
    "base_only": "base-model-only limit (same vLLM engine)",
}


def report_of(workload: Workload, args: argparse.Namespace, parameters: int | None, measured: dict) -> dict:
    tokens = measured["tokens_per_population"]
    tps = {path: tokens / measured[f"{path}_seconds"] for path in PATHS if f"{path}_seconds" in measured}
    ratios = {
        f"{path}_vs_{name}": tps[path] / tps[other]
        for path in ("evora", "evora_whole")
        if path in tps
        for other, name in (("seeds_way", "seeds_way"), ("base_only", "base_only_limit"))
    }
    per_worker = dict(tps)
    if "overhead_share" in measured:  # not with --no-overhead
        ratios["overhead_share_of_generation"] = measured["overhead_share"]
        per_worker["cli_run"] = measured["cli_tokens_per_second_per_worker"]
    return {
        "workload": {**workload.__dict__},
        "setup": {**vars(args), "model_parameters": parameters, "engine_workers": 1},
        "measured": measured,
        "tokens_per_second": tps,
        # One engine worker ran every in-process path; the CLI run's figure is per worker too.
        "tokens_per_second_per_worker": per_worker,
        "ratios": ratios,
        "targets": {
            "evora_vs_seeds_way": ">= 3 (uneven)",
            "evora_vs_base_only_limit": ">= 0.85 (uneven)",
            "overhead_share_of_generation": "<= 0.05 (uneven)",
        },
    }


def print_tables(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    w, s, tps, ratios = report["workload"], report["setup"], report["tokens_per_second"], report["ratios"]
    measured = report["measured"]
    lengths = f"{measured['mean_length']:.0f} tokens on average" + (f" (cap {w['tokens']})" if w["median"] else "")
    size = f"{s['model_parameters'] / 1e6:.1f}M-parameter model" if s["model_parameters"] else s["model"]
    table = Table(
        title=f"{w['name']}: {w['population']} adapters x {w['prompts']} prompts, {lengths}, {size}, "
        f"rank {s['rank']}, max_loras {w['max_loras']}, {s['device']}"
    )
    for column in ("path", "tokens/s", "per worker", "ratio"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for path, row in PATHS.items():
        if path not in tps:
            continue  # engine.units=whole: with --whole (the previous implementation had none)
        if path.startswith("evora"):
            seeds, limit = ratios[f"{path}_vs_seeds_way"], ratios[f"{path}_vs_base_only_limit"]
            ratio = f"{seeds:.2f}x seeds' way, {limit:.2f} of the limit"
        else:
            ratio = ""
        if path == "seeds_way" and measured["seeds_way_adapters"] < w["population"]:
            row += f", {measured['seeds_way_adapters']} of the {w['population']} adapters run"
        table.add_row(row, f"{tps[path]:,.0f}", f"{tps[path]:,.0f}", ratio)
    share = ratios.get("overhead_share_of_generation")
    shown = "not measured (--no-overhead)" if share is None else f"{share:.1%}"
    table.add_row("share of a CLI generation outside generate", "", "", shown)
    table.add_row("materialise share of evora's evaluate", "", "", f"{measured['materialise_share_of_evaluate']:.1%}")
    op_share = measured["lora_op_share_of_evaluate"]
    table.add_row("CPU multi-LoRA op's share of evora's evaluate", "", "", f"{op_share:.1%}")
    console = Console(width=150)
    console.print(table)
    if report.get("round_trip"):
        console.print(round_trip_table(report["round_trip"], s["round_trip_population"]))


def round_trip_table(figures: dict, population: int) -> Any:
    from rich.table import Table

    table = Table(
        title=f"adapter round trip per candidate (rank {next(iter(figures.values()))['rank']}, "
        f"seven modules, bf16), and for a population of {population}"
    )
    for column in (
        "model",
        "adapter",
        "materialise",
        "write /dev/shm",
        "vLLM load (file)",
        "vLLM load (memory)",
        f"file way x {population}",
        f"memory way x {population}",
    ):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, f in figures.items():
        by_file = f["materialise_ms"] + f["write_ms"] + f["load_file_ms"]
        by_memory = f["materialise_ms"] + f["load_memory_ms"]
        table.add_row(
            name,
            f"{f['adapter_mib_bf16']:.1f} MiB",
            f"{f['materialise_ms']:.0f} ms",
            f"{f['write_ms']:.0f} ms",
            f"{f['load_file_ms']:.0f} ms",
            f"{f['load_memory_ms']:.0f} ms",
            f"{population * by_file / 1000:.2f} s",
            f"{population * by_memory / 1000:.2f} s",
        )
    return table


def plot(results: Path) -> Path:
    """tokens/s per path and workload, from every workload's JSON in `results`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = [
        json.loads((results / f"throughput_{name}.json").read_text())
        for name in WORKLOADS
        if (results / f"throughput_{name}.json").is_file()
    ]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(PATHS)
    for i, (path, label) in enumerate(PATHS.items()):
        ax.bar(
            [x + i * width for x in range(len(reports))],
            [r["tokens_per_second"].get(path, 0.0) for r in reports],
            width,
            label=label,
        )
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(reports))], [r["workload"]["name"] for r in reports])
    ax.set_ylabel("tokens/s (one engine worker)")
    ax.set_title("population evaluation throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = results / "throughput.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="fixed")
    parser.add_argument("--population", type=int, help="adapters (default: the workload's)")
    parser.add_argument("--prompts", type=int, help="prompts per adapter (default: the workload's)")
    parser.add_argument("--tokens", type=int, help="tokens per sequence; uneven: the cap (default: the workload's)")
    parser.add_argument("--max-loras", type=int, help="adapters in flight (default: the workload's)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", help="a model folder or hub id (default: the ~26M random-weight bench model)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 on cpu, bfloat16 on cuda")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each engine")
    parser.add_argument("--repeats", type=int, default=2, help="timings of each in-process path (the median)")
    parser.add_argument(
        "--whole",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also engine.units=whole (one call over the whole population; default: no, --smoke: yes)",
    )
    parser.add_argument(
        "--seeds-way-adapters", type=int, help="adapters the slow seeds' way runs (default: the workload's; 0: all)"
    )
    parser.add_argument("--round-trip-population", type=int, default=30)
    parser.add_argument("--round-trip-candidates", type=int, default=4, help="candidates timed per real shape")
    parser.add_argument("--no-round-trip", action="store_true", help="skip the real-shape adapter round trip")
    parser.add_argument(
        "--overhead",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the CLI run that measures the overhead share (default: yes; --smoke: no)",
    )
    parser.add_argument(
        "--previous",
        action="store_true",
        help="evora before the grouped CPU LoRA op and in-memory adapters (CPU), for before/after tables",
    )
    parser.add_argument(
        "--out", help="folder for the JSON and the plot (default: bench/results; --smoke: in a temporary folder)"
    )
    parser.add_argument("--smoke", action="store_true", help="every in-process path at the least size (CI)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    args.out = args.out or (tempfile.mkdtemp(prefix="evora-bench-smoke-") if args.smoke else str(RESULTS))
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    return args


def main() -> None:
    args = parse_args()
    preset = WORKLOADS[args.workload]
    if args.smoke:
        preset = replace(
            preset,
            generations=SMOKE_GENERATIONS,
            median=min(preset.median, SMOKE_MEDIAN),
            shortest=min(preset.shortest, SMOKE_SHORTEST),
        )
    workload = replace(
        preset,
        population=args.population or preset.population,
        prompts=args.prompts or preset.prompts,
        tokens=args.tokens or preset.tokens,
        max_loras=args.max_loras or preset.max_loras,
    )
    folder = None
    if args.model is None:
        folder = Path(tempfile.mkdtemp(prefix="evora-bench-model-"))
        parameters: int | None = build_bench_model(folder)
        model = str(folder)
    else:
        parameters, model = None, args.model
    measured = measure_paths(model, args, workload)
    if args.overhead:
        measured.update(measure_overhead(model, args, workload, measured["mean_length"]))
    if folder is not None:
        shutil.rmtree(folder)
    args.model = args.model or "bench model"
    report = report_of(workload, args, parameters, measured)
    if not args.no_round_trip:
        shapes = list(REAL_SHAPES)[:1] if args.smoke else list(REAL_SHAPES)
        report["round_trip"] = {name: {"rank": args.rank, **round_trip(name, args)} for name in shapes}
    print_tables(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"throughput_{workload.name}{'_previous' if args.previous else ''}.json"
    (out / name).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out / name} and {plot(out)}")


if __name__ == "__main__":
    main()
