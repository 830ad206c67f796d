"""The organism table (docs/strategies/index.md): every strategy's `+experiment=organism/<strategy>`
on the bundled Countdown model organism, over seeds, through the CLI as a user runs it.

    python bench/organism.py                          # every strategy, seeds 0 1 2 (hours on 2 CPU cores)
    python bench/organism.py --strategies es sft grpo --seeds 0
    python bench/organism.py --smoke                  # es and sft, one seed, least sizes (a minute)
    python bench/organism.py --strategies es grpo --seeds 1 2 --add   # more rows in the same table
    python bench/organism.py --merge bench/results/a bench/results/b --out bench/results/all   # one table of both

Each strategy spends organism/es's search compute (conf/experiment/organism/): the evolution
strategies as many candidates, sft and grpo its FLOPs (`strategy.match=` the same seed's es run);
pbt and the ecology their own (the table says what each spent). merge combines two adapters that
organism/es evolved on 3-number and 4-number problems alone (their compute is theirs). Writes
organism.md/.json (best and final held-out accuracy, mean +- std over seeds; the best adapter's
KL from the base; search FLOPs; generated tokens; wall time) and plots/organism_accuracy.png
(held-out accuracy against search FLOPs, a band per strategy), with `evora compare`'s table and
reward-KL plane (plots/reward_kl.png) of every run, in --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evora.tracking.metrics import read_metrics  # noqa: E402
from evora.tracking.summary import read_summary  # noqa: E402

STRATEGIES = ("es", "es_full", "eggroll", "snes", "pgpe", "randopt", "ga", "sft", "grpo", "pbt", "ecology", "merge")
MATCHED = ("sft", "grpo")  # spend the same seed's es run's search FLOPs
SMOKE = ("generations=2", "eval_every=1", "task.eval_size=16", "task.prompts_per_generation=4", "task.train_size=32")
SMOKE_STRATEGY = {"es": ("strategy.population=4",), "sft": ("strategy.steps_per_generation=2", "strategy.batch_size=4")}
SUB_TASKS = {"three": "task.numbers=[3]", "four": "task.numbers=[4]"}  # merge's sources


def evora(folder: Path, *overrides: str) -> tuple[Path, float]:
    """One CLI run under `folder`: (its run folder, wall seconds). Exits with its error if it failed."""
    folder.mkdir(parents=True, exist_ok=True)
    before = set(folder.iterdir())
    started = time.perf_counter()
    command = [sys.executable, "-m", "evora", "tracking.progress=false", f"tracking.out_dir={folder}", *overrides]
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"bench/organism.py: {' '.join(overrides)} failed ({result.returncode}): {result.stderr[-2000:]}")
    (run,) = [p for p in set(folder.iterdir()) - before if read_summary(p) is not None]
    return run, seconds


def run_strategy(strategy: str, seed: int, out: Path, common: tuple[str, ...], es_runs: dict[int, Path]) -> dict:
    """One strategy at one seed: its row of the table."""
    overrides = [f"+experiment=organism/{strategy}", f"seed={seed}", *common]
    if strategy in MATCHED:
        overrides += ["strategy.budget_flops=null", f"strategy.match={es_runs[seed]}"]
    if strategy == "merge":
        sources = [
            evora(out / f"es_{name}" / f"seed{seed}", "+experiment=organism/es", f"seed={seed}", arg, *common)
            for name, arg in SUB_TASKS.items()
        ]
        overrides.append(f"strategy.adapters=[{','.join(str(run) for run, _ in sources)}]")
    run, seconds = evora(out / strategy / f"seed{seed}", *overrides)
    if strategy == "es":
        es_runs[seed] = run
    return row(strategy, seed, run, seconds)


def row(strategy: str, seed: int, run: Path, seconds: float) -> dict[str, Any]:
    summary = read_summary(run)
    assert summary is not None, f"{run}: no summary"
    records = read_metrics(run)
    curve = [(r.get("cumulative_flops", 0.0), r["heldout_accuracy"]) for r in records if "heldout_accuracy" in r]
    return {
        "strategy": strategy,
        "seed": seed,
        "run": str(run),
        "base_accuracy": summary["base"]["accuracy"],
        "best_accuracy": summary["best"]["accuracy"],
        "final_accuracy": (summary["final"] or {}).get("accuracy"),  # pbt has no final center
        "best_kl": summary["best"].get("kl"),
        "flops": summary["compute"]["search"]["flops"],
        "tokens_generated": summary["compute"]["search"]["tokens_generated"],
        "seconds": seconds,
        "curve": curve,
    }


def spread(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    values = [v * scale for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(rows: list[dict[str, Any]], machine: str) -> str:
    lines = [
        f"Held-out accuracy (%, 256 problems, greedy) on {machine}; mean ± std over seeds.",
        "",
        "| strategy | seeds | base | best | final | KL at best | search TFLOPs | tokens generated (k) | wall (min) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == strategy]
        column = lambda key, scale=1.0, digits=1: spread([r[key] for r in mine], scale, digits)  # noqa: E731
        lines.append(
            f"| {strategy} | {len(mine)} | {column('base_accuracy', 100)} | {column('best_accuracy', 100)} | "
            f"{column('final_accuracy', 100)} | {column('best_kl', 1, 4)} | {column('flops', 1e-12, 2)} | "
            f"{column('tokens_generated', 1e-3, 0)} | {column('seconds', 1 / 60)} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Held-out accuracy against search FLOPs: each strategy's mean over seeds, its band min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5))
    colors = [f"C{i}" for i in range(10)]  # matplotlib's ten cycle colours: the eleventh strategy on is dashed
    for i, strategy in enumerate(dict.fromkeys(r["strategy"] for r in rows)):
        curves = [r["curve"] for r in rows if r["strategy"] == strategy and r["curve"]]
        points = min(map(len, curves), default=0)
        if points == 0:
            continue
        flops = np.mean([[x for x, _ in c[:points]] for c in curves], axis=0) / 1e12
        accuracy = np.array([[y for _, y in c[:points]] for c in curves]) * 100
        color, linestyle = colors[i % len(colors)], "-" if i < len(colors) else "--"
        (line,) = ax.plot(flops, accuracy.mean(axis=0), marker="o", label=strategy, color=color, linestyle=linestyle)
        ax.fill_between(flops, accuracy.min(axis=0), accuracy.max(axis=0), color=line.get_color(), alpha=0.2)
    ax.set(xlabel="search TFLOPs", ylabel="held-out accuracy (%)", title="The Countdown organism, held-out")
    ax.legend(ncol=3, fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, help="default: all (--smoke: es and sft)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--engine", default="hf", help="engine=<name> of every run (hf: fastest on a CPU)")
    parser.add_argument("--machine", default="this machine", help="the hardware, as the table names it")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "organism")
    parser.add_argument("--smoke", action="store_true", help="seed 0, least sizes: the code paths only")
    parser.add_argument("--add", action="store_true", help="keep --out's rows; replace those run again")
    parser.add_argument(
        "--merge", nargs="+", type=Path, default=[], help="add these folders' rows to --out's (runs only --strategies)"
    )
    args = parser.parse_args()
    args.out = args.out.resolve()  # each run's own folder is its working directory
    strategies = args.strategies or ([] if args.merge else ["es", "sft"] if args.smoke else list(STRATEGIES))
    seeds: list[int] = args.seeds
    common: tuple[str, ...] = (f"engine={args.engine}", "hardware.num_workers=1")
    if args.smoke:
        seeds, common = [0], (*common, *SMOKE)
    kept = merged([args.out, *args.merge]) if args.add or args.merge else []
    es_runs = {r["seed"]: Path(r["run"]) for r in kept if r["strategy"] == "es"}
    if any(s in MATCHED for s in strategies) and not all(seed in es_runs for seed in seeds):
        strategies = list(dict.fromkeys(["es", *strategies]))  # their budget is the es run's
    strategies = sorted(strategies, key=lambda s: s != "es")
    rows = [r for r in kept if r["strategy"] not in strategies or r["seed"] not in seeds]
    for strategy in strategies:
        for seed in seeds:
            extra = SMOKE_STRATEGY.get(strategy, ()) if args.smoke else ()
            rows.append(run_strategy(strategy, seed, args.out, (*common, *extra), es_runs))
            print(f"{strategy} seed {seed}: best {rows[-1]['best_accuracy']:.3f} in {rows[-1]['seconds']:.0f} s")
            save(rows, args.out, args.machine)  # a later run that fails loses none of these (--add goes on)
    write(rows, args.out, args.machine)


def earlier_rows(out: Path) -> list[dict[str, Any]]:
    """The rows of an earlier organism.json in `out` (none if there is none)."""
    path = out / "organism.json"
    return json.loads(path.read_text())["rows"] if path.is_file() else []


def merged(folders: list[Path]) -> list[dict[str, Any]]:
    """The rows of every folder's organism.json; a strategy and seed in a later folder replaces an earlier's."""
    rows = {(r["strategy"], r["seed"]): r for folder in folders for r in earlier_rows(folder)}
    return list(rows.values())


def save(rows: list[dict[str, Any]], out: Path, machine: str) -> str:
    """organism.json and the table, organism.md (rows in the table's order); the table."""
    rows.sort(key=lambda r: (STRATEGIES.index(r["strategy"]), r["seed"]))
    markdown = table(rows, machine)
    out.mkdir(parents=True, exist_ok=True)
    (out / "organism.md").write_text(markdown)
    (out / "organism.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    return markdown


def write(rows: list[dict[str, Any]], out: Path, machine: str) -> None:
    """The table, the accuracy plot and evora compare's files of every run."""
    from evora.analysis.compare import compare

    markdown = save(rows, out, machine)
    plot(rows, out / "plots" / "organism_accuracy.png")
    compare([r["run"] for r in rows], out)  # compare.md and plots/reward_kl.png of every run
    print(markdown)


if __name__ == "__main__":
    main()
