"""GRPO's rollouts on the engine workers against transformers' `generate` on the driver, on the
Countdown organism, through the CLI as a user runs it (docs/strategies/grpo.md).

    python bench/grpo_rollouts.py                            # vLLM, 2 workers (about 15 minutes on 2 CPU cores)
    python bench/grpo_rollouts.py --engine hf --workers 1
    python bench/grpo_rollouts.py --es bench/results/organism/es/seed0/<run>   # match a kept es run
    python bench/grpo_rollouts.py --rows-per-unit 16         # one unit per worker (2 x 16 = 32 completions a step)
    python bench/grpo_rollouts.py --smoke                    # least sizes: the code paths only (a minute)

One `+experiment=organism/es` run (`--es-generations`), then `+experiment=organism/grpo` matched to
its search FLOPs (`strategy.match=`) twice, the same group and seed: `strategy.rollouts=driver`
(transformers on the driver, as TRL samples without vLLM: what evora did before) and
`strategy.rollouts=engines` (the run's engine workers). Writes grpo_rollouts.md/.json in --out:
per run, the tokens its rollouts generated, the seconds they took (`seconds_rollout`, summed over
generations) and tokens per second, and the run's wall time (its own clock: set-up, search and
evaluation) against the es run's; the ratio of the engines' tokens per second to the driver's
is printed first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from organism import ROOT, evora  # noqa: E402

from evora.tracking.metrics import read_metrics  # noqa: E402
from evora.tracking.summary import read_summary  # noqa: E402

MODES = ("driver", "engines")
SMOKE = ("task.eval_size=16", "task.prompts_per_generation=4", "task.train_size=32")
SMOKE_ES = ("strategy.population=4",)
SMOKE_GRPO = ("strategy.num_generations=2", "strategy.prompts_per_step=2")


def measured(run: Path) -> dict[str, Any]:
    summary = read_summary(run)
    assert summary is not None, f"{run}: no summary"
    records = read_metrics(run)[1:]  # generation 0 is the base model's evaluation
    generated = sum(r["tokens_generated"] for r in records)
    rollout = sum(r.get("seconds_rollout", 0.0) for r in records)
    return {
        "run": str(run),
        "seconds": summary["compute"]["seconds"]["total"],  # the run's own clock: set-up, search, evaluation
        "flops": summary["compute"]["search"]["flops"],
        "generations": len(records),
        "tokens_generated": generated,
        "seconds_rollout": rollout,
        "tokens_per_second": generated / rollout if rollout else None,
        "seconds_train": sum(r.get("seconds_train", 0.0) for r in records),
    }


def table(report: dict[str, Any]) -> str:
    es, rows = report["es"], report["grpo"]
    lines = [
        f"GRPO on the Countdown organism, matched to an es run's search FLOPs; {report['engine']}, "
        f"{report['workers']} worker(s), {report['machine']}; engines' units of "
        f"{report['rows_per_unit'] or 8} completions.",
        "",
        "| run | generations | tokens gen. | rollout s | tokens/s | training s | wall s | wall / es | FLOPs / es |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| es | {es['generations']} | {es['tokens_generated']} | - | - | - | {es['seconds']:.0f} | 1.00 | 1.00 |",
    ]
    for mode in MODES:
        r = rows[mode]
        speed = f"{r['tokens_per_second']:.0f}" if r["tokens_per_second"] else "-"
        lines.append(
            f"| grpo, rollouts={mode} | {r['generations']} | {r['tokens_generated']} | {r['seconds_rollout']:.1f} | "
            f"{speed} | {r['seconds_train']:.0f} | {r['seconds']:.0f} | {r['seconds'] / es['seconds']:.2f} | "
            f"{r['flops'] / es['flops']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="vllm", help="engine=<name> of every run")
    parser.add_argument("--workers", type=int, default=2, help="hardware.num_workers of every run")
    parser.add_argument("--es-generations", type=int, default=12, help="the es run's generations (its budget)")
    parser.add_argument("--es", type=Path, help="a finished es run to match instead of running one")
    parser.add_argument("--rows-per-unit", type=int, help="strategy.rows_per_unit of the engines' run (default: 8)")
    parser.add_argument("--machine", default="this machine", help="the hardware, as the table names it")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "grpo_rollouts")
    parser.add_argument("--smoke", action="store_true", help="least sizes: the code paths only")
    args = parser.parse_args()
    out = args.out.resolve()
    # held-out only at the start and the end: the same two evaluations in every run
    common = (f"engine={args.engine}", f"hardware.num_workers={args.workers}", "seed=0", "eval_every=1000")
    if args.smoke:
        common = (*common, *SMOKE)
    if args.es is not None:
        es_run = args.es.resolve()
    else:
        generations = "generations=2" if args.smoke else f"generations={args.es_generations}"
        es_args = ("+experiment=organism/es", *common, generations, *(SMOKE_ES if args.smoke else ()))
        es_run, _ = evora(out / "es", *es_args)
    report: dict[str, Any] = {
        "machine": args.machine,
        "engine": args.engine,
        "workers": args.workers,
        "rows_per_unit": args.rows_per_unit,
        "es": measured(es_run),
        "grpo": {},
    }
    for mode in MODES:
        grpo_args = ("+experiment=organism/grpo", *common, *(SMOKE_GRPO if args.smoke else ()))
        matched = ("strategy.budget_flops=null", f"strategy.match={es_run}", f"strategy.rollouts={mode}")
        if mode == "engines" and args.rows_per_unit:
            matched = (*matched, f"strategy.rows_per_unit={args.rows_per_unit}")
        run, _ = evora(out / f"grpo_{mode}", *grpo_args, *matched)
        report["grpo"][mode] = row = measured(run)
        print(f"grpo, rollouts={mode}: {row['tokens_per_second']:.0f} tokens/s, {row['seconds']:.0f} s in all")
    engines, driver = (report["grpo"][m]["tokens_per_second"] for m in ("engines", "driver"))
    report["speedup"] = engines / driver if engines and driver else None
    markdown = table(report)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grpo_rollouts.md").write_text(markdown)
    (out / "grpo_rollouts.json").write_text(json.dumps(report, indent=2))
    print(f"rollouts on the engine workers: {report['speedup']:.2f}x transformers' generate on the driver")
    print(markdown)


if __name__ == "__main__":
    main()
