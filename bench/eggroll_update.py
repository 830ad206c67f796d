"""EGGROLL's weight update at real models' shapes (issue 28): the time of one `EggrollStrategy.apply`
(the real code on real `MasterWeights`) over every selected matrix of Qwen2.5-1.5B and -7B, by
population, and its share of a generation.

    python bench/eggroll_update.py [--models qwen2.5-1.5b,qwen2.5-7b] [--populations 30,1024,16384]
        [--layers 1] [--matrices mlp.down_proj,...] [--rank 1] [--threads 2] [--device cpu|cuda]
        [--generation-seconds 60] [--append] [--out FILE]
    python bench/eggroll_update.py --smoke [--out FILE]

  (what fits a shared 2-core CPU in minutes: the three populations of -1.5B on one layer, -7B's
  30 and 1,024 on one layer, then --append -7B's 1,024 and 16,384 on k_proj + down_proj only)

  measured     one update of --layers decoder layers' seven matrices (q, k, v, o, gate, up, down),
               fp32 masters with random weights, fitness drawn at random (zscore shaping: every
               member live); the median of --repeats when one apply takes under 2 s
  noise draw   the same members' factors (B, A) drawn alone, as `gradient` draws them: the rest
               of the update (cat, product, the in-place add and its norm) is measured - draw
  extrapolated to the whole model, matrix after matrix as apply goes (every layer has the same
               shapes): the noise draw x (sum of out + in, model / measured), the rest x (sum of
               out x in, model / measured); --matrices measures fewer than a layer's seven
  growth       log(t2 / t1) / log(N2 / N1) between consecutive populations: 1 is linear
  share        update / (generation + update), with --generation-seconds the evaluation part of
               a generation (no published per-iteration time was found for arXiv 2511.16652's
               LLM runs: it is an assumption, stated in the results; one value, or one per
               population); "gen. s for 10%": the evaluation time at which the update is 10%

Peak memory: the resident set's growth over the apply (cpu), or torch's peak allocation (cuda).
The CPU is often shared with other jobs: wall seconds are upper bounds; the process's CPU seconds
(all its threads: about threads x wall on an idle machine) are measured and extrapolated alongside. Results:
bench/results/eggroll_update.json.

--smoke (CI: tests/integration/test_benches.py) measures both models at populations 2 and 4 (so
a growth exponent too), one layer's k_proj only (the smallest matrix), one repeat. Its figures
mean nothing; it writes to --out, by default a file in a new temporary folder, never over
bench/results.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import psutil
import torch

from evora.strategies.eggroll import EggrollConfig, EggrollState, EggrollStrategy
from evora.strategies.master_weights import MasterWeights

MATRICES = tuple(f"self_attn.{m}_proj" for m in "qkvo") + tuple(f"mlp.{m}_proj" for m in ("gate", "up", "down"))
RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"

# --smoke: both models, two populations (a growth exponent), the smallest matrix, one repeat
SMOKE = {"populations": "2,4", "matrices": "self_attn.k_proj", "layers": 1, "repeats": 1}

# (hidden, intermediate, attention heads, KV heads, head_dim, layers): transformers' Qwen2Config of each
MODELS = {
    "qwen2.5-1.5b": (1536, 8960, 12, 2, 128, 28),
    "qwen2.5-7b": (3584, 18944, 28, 4, 128, 28),
}


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(out, in) of one decoder layer's seven matrices, by module suffix."""
    hidden, inter, heads, kv_heads, head_dim, _ = MODELS[model]
    q, kv = heads * head_dim, kv_heads * head_dim
    return {
        "self_attn.q_proj": (q, hidden),
        "self_attn.k_proj": (kv, hidden),
        "self_attn.v_proj": (kv, hidden),
        "self_attn.o_proj": (hidden, q),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
    }


def build_master(model: str, layers: int, matrices: list[str], device: str) -> MasterWeights:
    generator = torch.Generator().manual_seed(0)
    tensors = {
        f"model.layers.{i}.{suffix}.weight": torch.empty(shape).normal_(0, 0.02, generator=generator).to(device)
        for i in range(layers)
        for suffix, shape in layer_shapes(model).items()
        if suffix in matrices
    }
    return MasterWeights(tensors)


def to_model(model: str, layers: int, matrices: list[str]) -> tuple[float, float]:
    """Factors from the measured matrices to the whole model: (noise draws: by sum of (out + in),
    the rest: by sum of out x in), both per member; every layer has the same shapes."""
    shapes = layer_shapes(model)
    measured = [shapes[m] for m in matrices]
    draws = sum(o + i for o, i in shapes.values()) / sum(o + i for o, i in measured)
    rest = sum(o * i for o, i in shapes.values()) / sum(o * i for o, i in measured)
    scale = MODELS[model][5] / layers
    return draws * scale, rest * scale


class PeakMemory:
    """Peak memory above the start while the block runs: host RSS sampled every 5 ms, or torch's on cuda."""

    def __init__(self, device: str):
        self.device, self.peak, self._stop = device, 0, threading.Event()

    def __enter__(self) -> "PeakMemory":
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = psutil.Process().memory_info().rss
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, process.memory_info().rss - self.base)

    def __exit__(self, *exc: object) -> None:
        if self.device == "cuda":
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self._stop.set()
            self._thread.join()


def timed(fn: Callable[[], object], device: str) -> tuple[float, float]:
    """(wall, this process's CPU) seconds of fn."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(model: str, population: int, master: MasterWeights, args: argparse.Namespace) -> dict:
    eggroll = EggrollStrategy(EggrollConfig(population=population, rank=args.rank), run_seed=0)
    modules = [name.rsplit(".", 1)[0] for name in master.tensors]
    shapes = [list(t.shape) for t in master.tensors.values()]
    fitness = np.random.default_rng(population).normal(size=population).tolist()
    update = eggroll.update_of(EggrollState(modules, shapes, 1.0, [fitness]), 0)

    def apply() -> None:
        master.generation = 0
        eggroll.apply(master, update)

    def draw() -> None:
        for module, (rows, cols) in zip(modules, shapes):
            for member in range(len(update.coefficients)):
                eggroll.factors(0, member, module, rows, cols)

    with PeakMemory(args.device) as memory:
        times = [timed(apply, args.device)]
    while times[0][0] < 2.0 and len(times) < args.repeats:
        times.append(timed(apply, args.device))
    seconds, cpu_seconds = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
    draw_seconds, draw_cpu_seconds = timed(draw, "cpu")
    rest = max(seconds - draw_seconds, 0.0)
    draws_scale, rest_scale = to_model(model, args.layers, args.matrices)
    whole = draw_seconds * draws_scale + rest * rest_scale
    return {
        "model": model,
        "population": population,
        "members": len(update.coefficients),
        "layers_measured": args.layers,
        "matrices_measured": len(master.tensors),
        "matrices": "all" if len(args.matrices) == len(MATRICES) else "+".join(args.matrices),
        "seconds_measured": seconds,
        "cpu_seconds_measured": cpu_seconds,
        "repeats": len(times),
        "draw_seconds_measured": draw_seconds,
        "draw_cpu_seconds_measured": draw_cpu_seconds,
        "cpu_seconds_model_extrapolated": draw_cpu_seconds * draws_scale
        + max(cpu_seconds - draw_cpu_seconds, 0.0) * rest_scale,
        "rest_seconds_measured": rest,
        "seconds_model_extrapolated": whole,
        "draw_seconds_model_extrapolated": draw_seconds * draws_scale,
        "ms_per_member_model": 1e3 * whole / len(update.coefficients),
        "peak_memory_bytes": memory.peak,
    }


def growth(previous: dict | None, row: dict, key: str) -> float | None:
    """log(t2 / t1) / log(N2 / N1) from the row before (same model and matrices): 1 is linear."""
    if previous is None or (previous["model"], previous["matrices"]) != (row["model"], row["matrices"]):
        return None
    return math.log(row[key] / previous[key]) / math.log(row["population"] / previous["population"])


def add_growth_and_share(rows: list[dict], generation_seconds: dict[int, float]) -> None:
    for previous, row in zip([None, *rows], rows):
        row["growth_exponent"] = growth(previous, row, "seconds_measured")
        row["growth_exponent_cpu"] = growth(previous, row, "cpu_seconds_measured")
        generation = generation_seconds[row["population"]]
        update = row["seconds_model_extrapolated"]
        row["generation_seconds_assumed"] = generation
        row["share_of_generation"] = update / (generation + update)
        row["generation_seconds_for_10pct_share"] = 9 * update  # evaluation time at which update = 10%


def appended(previous: dict, report: dict) -> dict:
    """--append: the earlier rows of other (model, population, matrices) kept before this run's."""
    keys = {(r["model"], r["population"], r["matrices"]) for r in report["rows"]}
    kept = [r for r in previous["rows"] if (r["model"], r["population"], r["matrices"]) not in keys]
    return {**report, "runs": [*previous.get("runs", []), *report["runs"]], "rows": kept + report["rows"]}


def parse_generation_seconds(text: str, populations: list[int]) -> dict[int, float]:
    values = [float(v) for v in text.split(",")]
    if len(values) == 1:
        values = values * len(populations)
    if len(values) != len(populations):
        raise SystemExit("--generation-seconds: one value, or one per --populations entry")
    return dict(zip(populations, values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen2.5-1.5b,qwen2.5-7b", help=f"comma-separated, of {sorted(MODELS)}")
    parser.add_argument("--populations", default="30,1024,16384", help="candidates per generation (even)")
    parser.add_argument("--layers", type=int, default=1, help="decoder layers measured (then extrapolated)")
    parser.add_argument(
        "--matrices", default=",".join(MATRICES), help="module suffixes measured in each layer (default: all seven)"
    )
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="of applies that take under 2 s")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the masters live")
    parser.add_argument(
        "--generation-seconds",
        default="60",
        help="ASSUMED evaluation seconds of a generation (one value, or one per population)",
    )
    parser.add_argument(
        "--out", help="the results file (default: bench/results/eggroll_update.json; --smoke: in a temporary folder)"
    )
    parser.add_argument("--append", action="store_true", help="keep --out's rows of other models/populations/matrices")
    parser.add_argument("--smoke", action="store_true", help="both models at the least size, in seconds (CI)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.out is None:
        folder = Path(tempfile.mkdtemp(prefix="evora-bench-smoke-")) if args.smoke else RESULTS
        args.out = str(folder / "eggroll_update.json")
    torch.set_num_threads(args.threads)
    args.matrices = args.matrices.split(",")
    if not set(args.matrices) <= set(MATRICES):
        raise SystemExit(f"--matrices: of {MATRICES}")
    models, populations = args.models.split(","), [int(p) for p in args.populations.split(",")]
    generation_seconds = parse_generation_seconds(args.generation_seconds, populations)
    rows = []
    for model in models:
        master = build_master(model, args.layers, args.matrices, args.device)
        for population in populations:
            rows.append(measure(model, population, master, args))
            print(f"measured {model} N={population}: {rows[-1]['seconds_measured']:.2f} s", flush=True)
        del master
    add_growth_and_share(rows, generation_seconds)
    setup = {**vars(args), "torch": torch.__version__, "cpu_count": psutil.cpu_count()}
    report = {"setup": setup, "runs": [setup], "rows": rows}
    if args.append and Path(args.out).exists():
        report = appended(json.loads(Path(args.out).read_text()), report)
    print_table(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    s = report["setup"]
    table = Table(
        title=f"one EGGROLL update (apply), rank {s['rank']}, {s['device']}, {s['threads']} threads: "
        f"measured on {s['layers']} layer(s), extrapolated to the whole model"
    )
    columns = (
        "model",
        "population",
        "measured",
        "measured s (CPU s)",
        "of it noise draw s",
        "whole model s (CPU s), extrap.",
        "ms / member",
        "growth exp. (CPU)",
        "peak memory",
        "share of generation",
        "gen. s for 10%",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "model" else "right")
    for r in report["rows"]:
        growth = "" if r["growth_exponent"] is None else f"{r['growth_exponent']:.2f} ({r['growth_exponent_cpu']:.2f})"
        table.add_row(
            r["model"],
            f"{r['population']:,} ({r['members']:,} pairs)",
            f"{r['layers_measured']} layer(s), {r['matrices']}",
            f"{r['seconds_measured']:.2f} ({r['cpu_seconds_measured']:.2f})",
            f"{r['draw_seconds_measured']:.2f}",
            f"{r['seconds_model_extrapolated']:.1f} ({r['cpu_seconds_model_extrapolated']:.1f})",
            f"{r['ms_per_member_model']:.2f}",
            growth,
            f"{r['peak_memory_bytes'] / 2**30:.2f} GiB",
            f"{r['share_of_generation']:.1%} of {r['generation_seconds_assumed']:g} s + update",
            f"{r['generation_seconds_for_10pct_share']:,.0f}",
        )
    Console(width=220).print(table)


if __name__ == "__main__":
    main()
