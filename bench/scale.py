"""Scale: orchestration cost per generation against population and workers (not a test;
docs/architecture.md, "Benchmarks"; issue 28).

    python bench/scale.py [--strategies es,ga,eggroll,ecology] [--populations 32,256,1024,4096,16384]
                          [--workers 2,8,16,32,64] [--grid sweep|full] [--generations 3] [--out FILE]
                          [overrides ...]
    python bench/scale.py --smoke [--out FILE]

The real driver, pool, strategies, checkpoints and Ray actors, with a bench-only engine
(`scale_engine.BenchEngine`) that answers every request with one precomputed completion in
constant time, so orchestration is all that is measured: each generation's seconds split into
ask, dispatch (payload put + units + the pool's round trip), results (the units' results as the
generation's matrices), tell (+ EGGROLL's weight sync), checkpoint and the rest; the object
store's bytes just after the workers answered, the driver's RSS, the checkpoint's size, the
workers' RSS. Workers share the machine's CPUs (hardware.cpus_per_worker = CPUs / workers).
The first `--warmup` generations are left out; of the others, the results file keeps each
part's median (`ask`, ...) and least (`ask_min`, ...), and the table, the growth exponents and
the plots use the least: on a shared machine, the closest to the code's own cost. `worker_busy`
is the workers' own seconds inside `evaluate`, summed over units (candidates materialised, the
constant-time answers, rewards): the part of dispatch that is work, not messaging.
`workers_with_cells` (table: w/cells) is the fewest workers that evaluated cells in a kept
generation, and `busy_share_min` (min shr) the least busy worker's own seconds over the
generation's evaluation, at hardware.min_units=--min-units (8, hardware=gpu's default):
`--strategies es --populations 30 --workers 8 --grid full` is the ES paper's population on a node.

--grid sweep (default): every population at `--at-workers`, and every worker count at
`--at-population`; --grid full: every pair. A configuration is skipped when the memory its
workers would take (measured per worker at the first configuration) would leave under
`--keep-free-gib` available. Writes bench/results/scale.json, scale_population.png and
scale_workers.png, and prints a table per strategy.

--smoke (CI: tests/integration/test_benches.py): one configuration, eggroll (a population
strategy, with the bench engine's weight hooks and the weight sync in tell) at population 8 on
one worker, 2 generations (one left out as warm-up), a 0.5 GiB object store and 1 GiB kept
free: 30 s or more on a small machine, mostly Ray and its actors starting (`--smoke
--strategies eggroll,ecology` adds the ecology's own overrides, another such run). Its figures
mean nothing; it writes to --out, by default a file in a new temporary folder, never over
bench/results.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import psutil
import ray

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
PARTS = ("ask", "dispatch", "results", "tell", "checkpoint", "other", "total")
MEASURES = ("store_bytes", "driver_rss", "checkpoint_bytes")
GOAL_S = 1.0  # the whole orchestration at the largest configuration, per generation
GiB = 2**30
# --smoke: one small configuration of the strategy that runs the most of the bench's own code
SMOKE = {
    "strategies": "eggroll",
    "populations": [8],
    "workers": [1],
    "at_workers": 1,
    "at_population": 8,
    "generations": 2,
    "warmup": 1,
    "object_store_gib": 0.5,
    "keep_free_gib": 1.0,
}


def strategy_overrides(strategy: str, population: int, prompts: int) -> list[str]:
    """The strategy at `population` candidates per generation. The ecology: `population / 5`
    organelles and as many episodes a generation (its prompts), so that each is served once and
    probed by 2 antithetic pairs on its episode, about `population` specs in all."""
    if strategy == "ecology":
        organelles = max(2, population // 5)
        return [
            f"strategy.organelles={organelles}",
            f"strategy.max_population={organelles}",
            f"task.prompts_per_generation={organelles}",
            f"task.train_size={max(2048, 2 * organelles)}",
        ]
    return [f"strategy.population={population}", f"task.prompts_per_generation={prompts}"]


def start_ray(cpus: int, object_store_gib: float) -> None:
    """A private local Ray: every worker process runs `scale_engine.setup_process` (the bench engine)."""
    from evora.distributed.ray_session import NAMESPACE, loopback_only

    path = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH", "")) if p)
    loopback_only()
    ray.init(
        address="local",
        num_cpus=cpus,
        object_store_memory=int(object_store_gib * GiB),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        namespace=NAMESPACE,
        runtime_env={"env_vars": {"PYTHONPATH": path}, "worker_process_setup_hook": "scale_engine.setup_process"},
    )


def worker_memory(tag: str) -> list[tuple[int, int]]:
    """(RSS, USS) of each engine worker: USS, the memory only it holds, is what another worker adds."""
    alive = [a for a in ray._private.state.actors().values() if a["State"] == "ALIVE"]
    pids = [a["Pid"] for a in alive if (a["Name"] or "").startswith(f"evora-worker-{tag}-")]
    out = []
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_full_info()
            out.append((info.rss, info.uss))
        except psutil.NoSuchProcess:
            pass
    return out


def run_one(strategy: str, population: int, workers: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from scale_driver import BenchDriverActor

    import evora.distributed.launch as launch_module
    from evora.plan.compose import compose_run
    from evora.plan.run_plan import build_plan
    from evora.tracking.run_dir import run_tag

    launch_module.DriverActor = BenchDriverActor  # type: ignore[misc]  # the timed driver, started as the product starts its own
    overrides = [
        f"strategy={strategy}",
        *strategy_overrides(strategy, population, args.prompts),
        "engine=hf",  # validated as the product's; every Ray process of the bench runs BenchEngine under it
        f"engine.units={args.units}",
        f"engine.max_loras={args.max_loras}",
        f"hardware.min_units={args.min_units}",
        f"hardware.num_workers={workers}",
        f"hardware.cpus_per_worker={args.cpus / workers:.6g}",
        "hardware.driver_restarts=0",
        "hardware.worker_replacements=0",
        f"generations={args.generations}",
        "eval_every=0",
        f"task.max_tokens={args.max_tokens}",
        "task.eval_size=8",
        "task.selection_size=0",
        f"tracking.out_dir={out}",
        "tracking.progress=false",
        *args.overrides,
    ]
    run = compose_run(overrides)
    run_dir = out / f"{strategy}-{population}-{workers}"
    run_dir.mkdir()
    tag = run_tag(str(run_dir))
    rows: list[dict[str, Any]] = []
    seen: dict[str, Any] = {}

    def on_event(event: Mapping[str, Any]) -> None:
        if event["kind"] == "start":
            seen["setup_s"] = event.get("setup_seconds")
        if event["kind"] == "generation" and "bench" in event:
            # The workers' own seconds inside `evaluate`, summed over units (candidates built, the
            # engine's constant-time answers, rewards): the part of dispatch that is not messaging.
            worker = sum(event.get(f"seconds_{k}", 0.0) for k in ("materialise", "generate", "reward", "perplexity"))
            rows.append({**event["bench"], "worker_busy": worker, **busy_shares(event, workers)})
            if "worker_memory" not in seen:
                seen["worker_memory"] = worker_memory(tag)
            b = event["bench"]
            print(
                f"  {strategy} N={population} W={workers} gen {event['generation']}: "
                + " ".join(f"{k}={b[k]:.3f}" for k in PARTS),
                file=sys.stderr,
            )

    started = time.perf_counter()
    launch_module.launch(build_plan(run), str(run_dir), on_event)
    wall = time.perf_counter() - started
    kept = rows[args.warmup :] or rows[-1:]
    result: dict[str, Any] = {
        "strategy": strategy,
        "population": population,
        "workers": workers,
        "specs": kept[-1]["specs"],
        "units": kept[-1]["units"],
        # Every generation's least: the workers that evaluated cells, and the least busy one's share.
        "workers_with_cells": min(r["workers_with_cells"] for r in kept),
        "busy_share_min": min(r["busy_share_min"] for r in kept),
        **{k: statistics.median(r[k] for r in kept) for k in (*PARTS, "worker_busy")},
        # The least over the kept generations: on a shared machine, the closest to the code's own cost.
        **{f"{k}_min": min(r[k] for r in kept) for k in (*PARTS, "worker_busy")},
        **{k: max(r[k] for r in kept) for k in MEASURES},
        "worker_rss_mean": statistics.mean(m[0] for m in seen.get("worker_memory") or [(0, 0)]),
        "worker_uss_mean": statistics.mean(m[1] for m in seen.get("worker_memory") or [(0, 0)]),
        "setup_s": seen.get("setup_s"),
        "wall_s": wall,
        "generations": rows,
    }
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def busy_shares(event: Mapping[str, Any], workers: int) -> dict[str, Any]:
    """How many of the `workers` evaluated cells in a generation, and each one's busy share: its
    own seconds in its units over the generation's evaluation (0 for a worker given no unit)."""
    busy = event.get("seconds_busy_by_worker") or {}
    seconds = max(event.get("seconds_evaluate", 0.0), 1e-9)
    shares = sorted(busy.get(str(w), 0.0) / seconds for w in range(workers))
    return {"workers_with_cells": len(busy), "busy_share_min": shares[0], "busy_shares": shares}


def with_minima(result: dict[str, Any], warmup: int) -> dict[str, Any]:
    """The least of each part over the kept generations (results files written without them)."""
    kept = result["generations"][warmup:] or result["generations"][-1:]
    return {**result, **{f"{k}_min": min(g[k] for g in kept) for k in (*PARTS, "worker_busy") if k in kept[0]}}


def configurations(args: argparse.Namespace) -> list[tuple[int, int]]:
    if args.grid == "full":
        return [(p, w) for p in args.populations for w in args.workers]
    pairs = [(p, args.at_workers) for p in args.populations] + [(args.at_population, w) for w in args.workers]
    pairs.append((max(args.populations), max(args.workers)))
    return sorted(set(pairs), key=lambda pw: (pw[1], pw[0]))


def fits(workers: int, per_worker: float, keep_free: float) -> bool:
    return psutil.virtual_memory().available - workers * per_worker > keep_free


def exponent(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(value) on log(x): the growth exponent."""
    points = [(x, y) for x, y in points if x > 0 and y > 0]
    if len(points) < 2:
        return None
    xs, ys = [math.log(x) for x, _ in points], [math.log(y) for _, y in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None


def growth(results: list[dict[str, Any]], at_workers: int) -> dict[str, dict[str, float | None]]:
    """Per strategy and measure: the exponent against population at `at_workers` workers."""
    out: dict[str, dict[str, float | None]] = {}
    for strategy in sorted({r["strategy"] for r in results}):
        rows = [r for r in results if r["strategy"] == strategy and r["workers"] == at_workers]
        out[strategy] = {k: exponent([(r["population"], r[f"{k}_min"]) for r in rows]) for k in PARTS}
        out[strategy].update({k: exponent([(r["population"], r[k]) for r in rows]) for k in MEASURES})
        top = sorted(rows, key=lambda r: r["population"])[-2:]  # between the two largest populations
        out[strategy].update({f"{k}_top": exponent([(r["population"], r[f"{k}_min"]) for r in top]) for k in PARTS})
    return out


def table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'strategy':<8} {'N':>6} {'W':>3} {'units':>5} "
        + " ".join(f"{k:>9}" for k in PARTS)
        + f" {'wrk busy':>9} {'w/cells':>7} {'min shr':>7}"
        + f" {'store MB':>9} {'drv MB':>7} {'ckpt KB':>9} {'wrk RSS':>7} {'wrk USS':>7}"
    )
    lines = [head]
    for r in sorted(results, key=lambda r: (r["strategy"], r["workers"], r["population"])):
        lines.append(
            f"{r['strategy']:<8} {r['population']:>6} {r['workers']:>3} {r['units']:>5} "
            + " ".join(f"{r[f'{k}_min']:>9.4f}" for k in PARTS)
            + f" {r['worker_busy_min']:>9.4f}"
            + f" {r.get('workers_with_cells', 0):>3}/{r['workers']:<3} {r.get('busy_share_min', 0.0):>7.2f}"
            + f" {r['store_bytes'] / 2**20:>9.2f} {r['driver_rss'] / 2**20:>7.0f}"
            + f" {r['checkpoint_bytes'] / 1024:>9.1f} {r['worker_rss_mean'] / 2**20:>7.0f}"
            + f" {r['worker_uss_mean'] / 2**20:>7.0f}"
        )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], by: str, fixed: str, at: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = (*PARTS, "worker_busy")
    measures = [*timed, "store_bytes", "driver_rss", "checkpoint_bytes"]
    strategies = sorted({r["strategy"] for r in results})
    cols = 5
    rows_of_plots = math.ceil(len(measures) / cols)
    fig, axes = plt.subplots(rows_of_plots, cols, figsize=(4 * cols, 3.3 * rows_of_plots))
    for ax, measure in zip(axes.flat, measures):
        for strategy in strategies:
            rows = sorted((r for r in results if r["strategy"] == strategy and r[fixed] == at), key=lambda r: r[by])
            if rows:
                key = f"{measure}_min" if measure in timed else measure
                ax.plot([r[by] for r in rows], [max(r[key], 1e-6) for r in rows], marker="o", label=strategy)
        if measure == "total":
            ax.axhline(GOAL_S, color="grey", linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(measure + (" (s, least)" if measure in timed else " (bytes)"), fontsize=9)
        ax.set_xlabel(by, fontsize=8)
    for ax in list(axes.flat)[len(measures) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"orchestration per generation against {by} ({fixed} = {at})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default="es,ga,eggroll,ecology")
    parser.add_argument("--populations", type=ints, default=[32, 256, 1024, 4096, 16384])
    parser.add_argument("--workers", type=ints, default=[2, 8, 16, 32, 64])
    parser.add_argument("--grid", choices=("sweep", "full"), default="sweep")
    parser.add_argument("--at-workers", type=int, default=8, help="--grid sweep: workers of the population sweep")
    parser.add_argument("--at-population", type=int, default=4096, help="--grid sweep: population of the workers sweep")
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="first generations left out")
    parser.add_argument("--prompts", type=int, default=2, help="task.prompts_per_generation")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--units", choices=("fixed", "whole"), default="fixed", help="engine.units")
    parser.add_argument("--max-loras", type=int, default=8, help="engine.max_loras: candidates per unit (fixed)")
    parser.add_argument(
        "--min-units", type=int, default=8, help="hardware.min_units (8: hardware=gpu's default, a node's GPUs)"
    )
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="Ray CPUs the workers share")
    parser.add_argument("--object-store-gib", type=float, default=2.0)
    parser.add_argument("--keep-free-gib", type=float, default=6.0)
    parser.add_argument(
        "--out", type=Path, help="the results file (default: bench/results/scale.json; --smoke: in a temporary folder)"
    )
    parser.add_argument("--merge", type=Path, nargs="+", help="no runs: merge these results files into --out")
    parser.add_argument("--smoke", action="store_true", help="one small configuration (CI)")
    parser.add_argument("overrides", nargs="*", help="more evora config overrides")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.out is None:
        folder = Path(tempfile.mkdtemp(prefix="evora-bench-smoke-")) if args.smoke else RESULTS
        args.out = folder / "scale.json"
    if args.merge:
        parts = [json.loads(path.read_text()) for path in args.merge]
        merged = [with_minima(r, args.warmup) for part in parts for r in part["results"]]
        report(args, merged, [s for part in parts for s in part["skipped"]])
        return

    sys.path.insert(0, str(BENCH))
    from evora.plan.compose import setup

    setup()
    start_ray(args.cpus, args.object_store_gib)
    out = Path(tempfile.mkdtemp(prefix="evora-scale-"))
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    per_worker = 400 * 2**20  # until measured
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for strategy in args.strategies.split(","):
            for population, workers in configurations(args):
                if not fits(workers, per_worker, args.keep_free_gib * GiB):
                    why = f"{workers} workers x {per_worker / 2**20:.0f} MB would leave under {args.keep_free_gib} GiB"
                    skipped.append({"strategy": strategy, "population": population, "workers": workers, "why": why})
                    print(f"skip {strategy} N={population} W={workers}: {why}", file=sys.stderr)
                    continue
                try:
                    result = run_one(strategy, population, workers, args, out)
                except Exception as error:  # one configuration's failure is reported, the bench goes on
                    skipped.append(
                        {"strategy": strategy, "population": population, "workers": workers, "why": repr(error)[:400]}
                    )
                    print(f"FAILED {strategy} N={population} W={workers}: {error!r}", file=sys.stderr)
                    continue
                if result["worker_uss_mean"]:  # what one more worker takes, with a margin
                    per_worker = max(per_worker if results else 0, result["worker_uss_mean"] * 1.25)
                results.append(result)
                print(table([result]).splitlines()[1], file=sys.stderr)
                save(args, results, skipped)
    finally:
        ray.shutdown()
        shutil.rmtree(out, ignore_errors=True)
    report(args, results, skipped)


def report(args: argparse.Namespace, results: list[dict[str, Any]], skipped: list[dict[str, Any]]) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(args, results, skipped)
    print(table(results))
    for strategy, row in growth(results, args.at_workers).items():
        shown = " ".join(f"{k}={v:.2f}" for k, v in row.items() if v is not None)
        print(f"growth exponent vs population at {args.at_workers} workers, {strategy}: {shown}")
    for strategy in sorted({r["strategy"] for r in results}):  # its largest configuration reached
        r = max((r for r in results if r["strategy"] == strategy), key=lambda r: (r["population"], r["workers"]))
        verdict = "under" if r["total"] < GOAL_S else "OVER"
        where = f"N={r['population']} W={r['workers']}"
        least = r.get("total_min", r["total"])
        seconds = f"{r['total']:.3f} s/generation (median; least {least:.3f})"
        print(f"{r['strategy']} at {where}: {seconds}, {verdict} {GOAL_S} s")
    for s in skipped:
        print(f"skipped {s['strategy']} N={s['population']} W={s['workers']}: {s['why']}")
    if results:
        plot(results, "population", "workers", args.at_workers, args.out.with_name("scale_population.png"))
        plot(results, "workers", "population", args.at_population, args.out.with_name("scale_workers.png"))
    print(args.out)


def save(args: argparse.Namespace, results: list[dict[str, Any]], skipped: list[dict[str, Any]]) -> None:
    summary = {
        "args": {k: str(v) if isinstance(v, (Path, list)) and k != "overrides" else v for k, v in vars(args).items()},
        "cpus_on_machine": os.cpu_count(),
        "results": results,
        "skipped": skipped,
        "growth_vs_population": growth(results, args.at_workers),
    }
    args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
