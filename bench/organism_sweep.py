"""How sensitive es, es_full and snes are to their noise and step on the Countdown organism
(docs/strategies/es.md, es_full.md, snes.md): an Optuna grid (evora's `hydra/sweeper=optuna`,
`hydra/sweeper/sampler=grid`) over each one's `+experiment=organism/<strategy>` at half its
budget, through the CLI as a user sweeps.

    python bench/organism_sweep.py                 # es 3 x 3, es_full 4 + 2, snes 3 (about an hour on 2 CPU cores)
    python bench/organism_sweep.py --sweeps es_full es_full_lr
    python bench/organism_sweep.py --smoke         # es, 2 trials at least sizes (a minute)

Each trial runs 24 generations (organism/<strategy>'s 48 halved) and is scored by its final
held-out accuracy (`objective=final.accuracy`, 256 problems, greedy). Writes
organism_sweep.md/.json in --out: per strategy a grid of held-out accuracy (%) over the swept
values, the base model's beside it, and each sweep folder (its sweep_summary.md and Optuna's
optimization_results.yaml).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

Grid = dict[str, tuple[float, ...]]  # key -> values; the first key is the table's rows, the second its columns
# sweep -> (strategy, grid, overrides every trial of it takes)
SWEEPS: dict[str, tuple[str, Grid, tuple[str, ...]]] = {
    "es": ("es", {"strategy.sigma": (0.03, 0.1, 0.3), "strategy.lr": (0.005, 0.02, 0.08)}, ()),
    # at the paper's alpha / sigma ratio (organism/es_full's lr before this sweep)
    "es_full": ("es_full", {"strategy.sigma": (0.001, 0.003, 0.01, 0.03)}, ("strategy.lr=0.0015",)),
    # es_full's step (alpha / N sum z eps) does not scale with sigma: its lr, at organism/es_full's sigma
    "es_full_lr": ("es_full", {"strategy.lr": (0.006, 0.024)}, ()),
    # the initial spread; the paper fixes both learning rates
    "snes": ("snes", {"strategy.sigma": (0.03, 0.1, 0.3)}, ()),
}
HALF_BUDGET = ("generations=24", "eval_every=24")
SMOKE = ("generations=2", "eval_every=2", "task.eval_size=16", "task.prompts_per_generation=4", "task.train_size=32")
SMOKE_SWEEPS: dict[str, tuple[str, Grid, tuple[str, ...]]] = {
    "es": ("es", {"strategy.sigma": (0.05, 0.1)}, ("strategy.population=4",))
}


def sweep(strategy: str, grid: Grid, folder: Path, common: tuple[str, ...]) -> Path:
    """One Optuna grid multirun of `strategy` under `folder`: its sweep folder."""
    folder.mkdir(parents=True, exist_ok=True)
    before = set(folder.iterdir())
    searched = [f"{key}=choice({','.join(map(str, values))})" for key, values in grid.items()]
    command = [
        *(sys.executable, "-m", "evora", "-m", "tracking.progress=false", f"tracking.out_dir={folder}"),
        *(f"+experiment=organism/{strategy}", "objective=final.accuracy", *common),
        *("hydra/sweeper=optuna", "hydra/sweeper/sampler=grid", "hydra.sweeper.direction=maximize"),
        *(f"hydra.sweeper.n_trials={math.prod(len(values) for values in grid.values())}", *searched),
    ]
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"bench/organism_sweep.py: {strategy} failed ({result.returncode}): {result.stderr[-2000:]}")
    (found,) = [p for p in set(folder.iterdir()) - before if (p / "sweep_summary.json").is_file()]
    return found


def results(name: str, strategy: str, grid: Grid, folder: Path) -> dict[str, Any]:
    """The sweep's trials: each one's swept values and final held-out accuracy."""
    rows = json.loads((folder / "sweep_summary.json").read_text())
    base = json.loads((Path(rows[0]["run_dir"]) / "eval" / "summary.json").read_text())["base"]["accuracy"]
    found = []
    for row in rows:
        overrides = dict(o.split("=", 1) for o in row["overrides"].split())
        found.append({"values": {k: float(overrides[k]) for k in grid}, "accuracy": row["objective"]})
    return {"sweep": name, "strategy": strategy, "grid": grid, "folder": str(folder), "base": base, "trials": found}


def table(result: dict[str, Any]) -> str:
    """Rows: the first key's values; columns: the second's (or one column)."""
    keys = list(result["grid"])
    rows_key, columns_key = keys[0], (keys[1] if len(keys) > 1 else None)
    columns = result["grid"][columns_key] if columns_key else (None,)
    accuracy = {(t["values"][rows_key], t["values"].get(columns_key)): t["accuracy"] for t in result["trials"]}
    header = [f"{columns_key}={c}" for c in columns] if columns_key else ["held-out accuracy (%)"]
    lines = [
        f"`{result['strategy']}` (base model {100 * result['base']:.1f}%; sweep folder: `{result['folder']}`)",
        "",
        f"| {rows_key} | " + " | ".join(header) + " |",
        "|---" * (len(header) + 1) + "|",
    ]
    for value in result["grid"][rows_key]:
        cells = [accuracy.get((value, c)) for c in columns]
        lines.append(f"| {value} | " + " | ".join("-" if a is None else f"{100 * a:.1f}" for a in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", nargs="+", choices=list(SWEEPS), help="default: all (--smoke: es)")
    parser.add_argument("--engine", default="hf", help="engine=<name> of every trial (hf: fastest on a CPU)")
    parser.add_argument("--machine", default="this machine", help="the hardware, as the tables name it")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "organism_sweep")
    parser.add_argument("--smoke", action="store_true", help="es, 2 trials at least sizes: the code paths only")
    args = parser.parse_args()
    out = args.out.resolve()
    sweeps = SMOKE_SWEEPS if args.smoke else {name: SWEEPS[name] for name in args.sweeps or SWEEPS}
    common = (f"engine={args.engine}", "hardware.num_workers=1", *(SMOKE if args.smoke else HALF_BUDGET))
    found = [
        results(name, s, grid, sweep(s, grid, out / name, (*common, *fixed)))
        for name, (s, grid, fixed) in sweeps.items()
    ]
    generations = next(o for o in common if o.startswith("generations=")).split("=")[1]
    title = f"Final held-out accuracy (%) after {generations} generations, on {args.machine}."
    markdown = "\n".join([title, "", *(table(r) for r in found)])
    (out / "organism_sweep.md").write_text(markdown)
    (out / "organism_sweep.json").write_text(json.dumps({"machine": args.machine, "sweeps": found}, indent=2))
    print(markdown)


if __name__ == "__main__":
    main()
