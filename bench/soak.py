"""Soak: a long quickstart run, watched for leaks (not a test; docs/architecture.md, "Benchmarks").

    python bench/soak.py [--generations 500] [--warmup 10] [--experiment quickstart/es] [overrides ...]
    python bench/soak.py --generations 200 --experiment quickstart/eggroll
    python bench/soak.py --generations 200 --experiment quickstart/ecology
    python bench/soak.py --smoke [--out FOLDER] [overrides ...]

Every generation it samples the driver actor's and each engine worker's RSS (with their
child processes) and open file descriptors, the scratch entries on /dev/shm, the Ray object
store's bytes, the run folder's size and the checkpoint's (`checkpoints/latest.pt`: the
strategy's state, which grows by design where it keeps history: EGGROLL's fitness of every
generation, the ecology's births and archive). Writes bench/results/soak_<strategy>.json and
.png, and prints start (after warm-up), end and max of each curve. The goal: flat within 5%
for memory, file descriptors, /dev/shm and the object store; the run folder and the state
grow, stated as bytes per generation (a least-squares slope after warm-up).

--smoke (CI: tests/integration/test_benches.py): 4 generations (3 sampled, the first of them
warm-up) of a quickstart cut to one worker on engine=hf (no vLLM to start: the bench's own code
is the same), 4 candidates, 4 prompts a generation and 8 held-out; overrides given after it
still win (`--smoke engine=vllm`). Its figures mean nothing; it writes to --out, by default a new
temporary folder, never over bench/results.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray
from ray._private.internal_api import get_memory_info_reply, get_state_from_address

from evora.distributed.worker_memory import process_tree_rss_mb

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
GOAL = 0.05  # flat within 5% after warm-up
# --smoke: the quickstart at the least size that still samples every measure
SMOKE = {"generations": 4, "warmup": 1}
SMOKE_OVERRIDES = [
    "engine=hf",
    "hardware.num_workers=1",
    "strategy.population=4",
    "task.prompts_per_generation=4",
    "task.eval_size=8",
    "task.selection_size=0",
    "eval_every=0",
]
GROWS = ("run_dir_bytes", "state_bytes")  # linear by design: reported per generation, not held flat


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def actor_pids(prefix: str) -> dict[str, int]:
    """Live actors whose name starts with `prefix` (from the GCS: the quickstart runs no dashboard)."""
    alive = [a for a in ray._private.state.actors().values() if a["State"] == "ALIVE"]
    return {a["Name"]: a["Pid"] for a in alive if (a["Name"] or "").startswith(prefix)}


def sample(run_dir: Path, tag: str, generation: int) -> dict[str, Any]:
    from evora.distributed.launch import driver_name

    driver = actor_pids(driver_name(str(run_dir)))
    workers = actor_pids(f"evora-worker-{tag}-")
    store = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address)).store_stats
    scratch = list(Path("/dev/shm").glob(f"evora-{tag}-*"))
    return {
        "generation": generation,
        "time": time.time(),
        "driver_rss_mb": sum(process_tree_rss_mb(p) for p in driver.values()),
        "driver_fds": sum(psutil.Process(p).num_fds() for p in driver.values()),
        "worker_rss_mb": {name.rsplit("-", 1)[-1]: process_tree_rss_mb(p) for name, p in workers.items()},
        "worker_fds": {name.rsplit("-", 1)[-1]: psutil.Process(p).num_fds() for name, p in workers.items()},
        "shm_entries": sum(1 for folder in scratch for _ in folder.rglob("*")) + len(scratch),
        "object_store_bytes": int(store.object_store_bytes_used),
        "run_dir_bytes": folder_bytes(run_dir),
        "state_bytes": (run_dir / "checkpoints" / "latest.pt").stat().st_size,
    }


def curves(samples: list[dict[str, Any]]) -> dict[str, list[float]]:
    """One series per measure; per-worker measures are summed over workers."""
    out: dict[str, list[float]] = {}
    for s in samples:
        for key, value in s.items():
            if key in ("generation", "time"):
                continue
            out.setdefault(key, []).append(float(sum(value.values()) if isinstance(value, dict) else value))
    return out


def per_generation(series: list[float]) -> float:
    """Least-squares slope of a curve: its growth per generation."""
    return float(np.polyfit(np.arange(len(series)), series, 1)[0]) if len(series) > 1 else 0.0


def report(samples: list[dict[str, Any]], warmup: int) -> dict[str, dict[str, Any]]:
    table = {}
    for key, series in curves(samples).items():
        after = series[min(warmup, len(series) - 1) :]
        start, end, top = after[0], after[-1], max(after)
        growth = (end - start) / start if start else (0.0 if end == 0 else float("inf"))
        # Only growth counts (a smaller end is no leak); the max may catch a generation mid-way (its scratch).
        flat = None if key in GROWS else growth <= GOAL
        table[key] = {
            "start": start,
            "end": end,
            "max": top,
            "growth": growth,
            "per_generation": per_generation(after),
            "flat": flat,
        }
    return table


def plot(samples: list[dict[str, Any]], warmup: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = curves(samples)
    generations = [s["generation"] for s in samples]
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.2 * len(series)), sharex=True)
    for ax, (key, values) in zip(axes, series.items()):
        ax.plot(generations, values)
        ax.axvline(warmup, color="grey", linestyle=":")
        ax.set_ylabel(key, fontsize=8)
    axes[-1].set_xlabel("generation")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generations", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=10, help="generations before the start of each curve")
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for the JSON and the plot (default: bench/results; --smoke: in a temporary folder)",
    )
    parser.add_argument("--smoke", action="store_true", help="a few generations at the least size (CI)")
    parser.add_argument("--experiment", default="quickstart/es", help="the run's +experiment= (conf/experiment/)")
    parser.add_argument("overrides", nargs="*", help="evora config overrides, after the experiment's")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        args.overrides = [*SMOKE_OVERRIDES, *args.overrides]
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="evora-bench-smoke-")) if args.smoke else RESULTS

    from evora.distributed.launch import launch
    from evora.plan.compose import compose_run, setup
    from evora.plan.run_plan import build_plan
    from evora.tracking.run_dir import run_tag

    setup()
    out = Path(tempfile.mkdtemp(prefix="evora-soak-"))
    settings = [f"+experiment={args.experiment}", f"generations={args.generations}", f"tracking.out_dir={out}"]
    run = compose_run([*settings, *args.overrides])
    run_dir = out / "soak"
    run_dir.mkdir()
    tag = run_tag(str(run_dir))
    samples: list[dict[str, Any]] = []

    def on_event(event: dict[str, Any]) -> None:
        # The last generation's event arrives while the driver already runs the finish.
        if event["kind"] == "generation" and event["generation"] < args.generations:
            samples.append(sample(run_dir, tag, event["generation"]))
            print(f"generation {event['generation']}: {json.dumps(samples[-1])}", file=sys.stderr)

    started = time.time()
    launch(build_plan(run), str(run_dir), on_event)
    table = report(samples, args.warmup)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "generations": args.generations,
        "warmup": args.warmup,
        "overrides": args.overrides,
        "seconds": time.time() - started,
        "summary": table,
        "samples": samples,
    }
    stem = args.out / f"soak_{run.strategy.name}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(samples, args.warmup, stem.with_suffix(".png"))
    print_table(table)
    print(f"{stem.with_suffix('.json')}\n{stem.with_suffix('.png')}")


def print_table(table: dict[str, dict[str, Any]]) -> None:
    print(f"{'measure':<20} {'start':>14} {'end':>14} {'max':>14} {'growth':>8} {'per gen':>12}")
    for key, row in table.items():
        flag = {None: "  (grows by design)", True: "", False: "  > 5%"}[row["flat"]]
        print(
            f"{key:<20} {row['start']:>14,.1f} {row['end']:>14,.1f} {row['max']:>14,.1f} {row['growth']:>8.1%}"
            f" {row['per_generation']:>12,.1f}{flag}"
        )


if __name__ == "__main__":
    main()
