"""The GPU check in one call (issue 37): what evora's GPU paths promise, checked on the device,
by the checks `evora doctor --run` runs (evora/selfcheck) and the real-shape timings,
with only torch, transformers and PEFT installed (no vLLM, no Ray, no network: random-weight
models built from transformers' config classes), and one table to paste into a note.

    PYTHONPATH=. python bench/gpu_check.py [--device cuda] [--layers 2] [--out FILE]
    python bench/gpu_check.py --smoke            (CI: tiny sizes, on the CPU where there is no GPU)

  noise       a key's stream drawn twice on the device gives equal tensors; other members differ
  es          the update (the members' noise summed in groups on the device, as workers sum it
              under hardware.noise_device=auto, on 1 and 2 workers: bitwise equal) against float64
  eggroll     `apply` on master copies on the device against float64 from the same factors
  es_full     `apply` on the device against float64 from the same (device) noise
  engine      the transformers engine on the device, LoRA candidates rebuilt from seeds: its greedy
              tokens against PEFT's own `PeftModel.generate` of the same adapters
  in place    es_full's candidate set inside the engine from seeds (`perturb_base`) is bitwise the
              fp32 candidate cast to the engine's dtype; the restore is bitwise the master's cast
  MoE         the engine check on a tiny random-weight Qwen3-MoE, every expert adapted
  shapes      bench/real_shapes.py at Qwen2.5-1.5B's widths on --layers layers (extrapolated to
              28): es_full per candidate (goal: under 0.1 s) beside the paper's way, its update at
              population 30 (goal: under 3 s), EGGROLL's update, checksums and weight syncs
  es shapes   bench/real_shapes.py's ES over a rank-8 LoRA at Qwen3-30B-A3B's widths (every
              expert) on 1 layer (extrapolated to 48), its noise on the device: materialise per
              candidate, and the update at population 30 (goal: under 3 s)

Results: bench/results/gpu_check.json (--out); the table on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # evora and real_shapes from this checkout

from evora.engines.base import EngineSpec  # noqa: E402
from evora.selfcheck.checks import PASSED, SKIPPED, Node  # noqa: E402
from evora.selfcheck.checks import run_check as run_shared  # noqa: E402
from evora.selfcheck.runner import IN_PROCESS, in_order  # noqa: E402

TINY = ROOT / "evora" / "models" / "tiny"


def check_shapes(device: str, args: argparse.Namespace) -> tuple[bool, str, list[dict]]:
    import real_shapes

    out = str(Path(args.out).with_name("gpu_check_shapes.json"))
    argv = ["--device", device, "--strategies", "es_full,eggroll", "--layers", str(args.layers), "--out", out]
    # Nine repeats: the per-candidate steps take milliseconds on a GPU, and their median decides.
    full = ["--models", "qwen2.5-1.5b", "--populations", "30", "--workers", "", "--repeats", "9"]
    argv += ["--smoke"] if args.smoke else full
    rows = real_shapes.main(argv)["rows"]
    by = {(r["strategy"], r["step"]): r["seconds"] for r in rows if r.get("population") in (None, 30, 4)}
    candidate = by[("es_full", "perturb + restore per candidate")]
    paper = by[("es_full", "per candidate, the paper's way")]
    update = by[("es_full", "update per generation")]
    # The goals are for a GPU at Qwen2.5-1.5B's shapes: --smoke reports its figures only.
    passed = args.smoke or (candidate < 0.1 and update < 3 and candidate <= paper)
    detail = f"es_full per candidate {candidate:.4f} s (paper's way {paper:.4f} s), update at N=30 {update:.3f} s"
    return passed, detail, rows


def check_es_shapes(device: str, args: argparse.Namespace) -> tuple[bool, str, list[dict]]:
    import real_shapes

    out = str(Path(args.out).with_name("gpu_check_es_shapes.json"))
    argv = ["--device", device, "--strategies", "es", "--workers", "", "--out", out]
    full = ["--models", "qwen3-30b-a3b", "--populations", "30", "--layers", "1", "--repeats", "3"]
    rows = real_shapes.main(argv + (["--smoke"] if args.smoke else full))["rows"]
    by = {r["step"]: r["seconds"] for r in rows if r.get("population") in (None, 30, 4)}
    candidate, sums = by["materialise per candidate"], by["update: workers' sums, summed"]
    update = sums + by[real_shapes.DRIVERS_PART]
    detail = (
        f"ES over LoRA: materialise {candidate:.3f} s a candidate, update at N=30 {update:.2f} s ({sums:.2f} s sums)"
    )
    return args.smoke or update < 3, detail, rows


# --- the run ------------------------------------------------------------------------------------


def run_check(name: str, fn: Callable[[], tuple], table: list[dict]) -> Any:
    start = time.perf_counter()
    try:
        passed, detail, *extra = fn()
    except Exception as error:  # a check that breaks is a failed check, and the others still run
        passed, detail, extra = False, f"{type(error).__name__}: {error}", []
    add_row(table, name, "pass" if passed else "FAIL", detail, time.perf_counter() - start)
    return extra[0] if extra else None


def add_row(table: list[dict], name: str, result: str, detail: str, seconds: float) -> None:
    """A row of the table: result pass, FAIL or skip (a skipped check has not failed, nor passed)."""
    table.append({"check": name, "passed": result == "pass", "result": result, "detail": detail, "seconds": seconds})
    print(f"| {name} | {result} | {detail} | {seconds:.1f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu_check.json"))
    args = parser.parse_args(argv)
    device, size = args.device, 64 if args.smoke else 1024
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    print(
        f"device: {name}, torch {torch.__version__}\n\n| check | result | detail | s |\n|---|---|---|---|", flush=True
    )
    table: list[dict] = []
    # evora doctor --run's checks (evora/selfcheck), on the transformers engine: in place in bf16
    node = Node(
        device, size, 2 if args.smoke else 8, "hf", EngineSpec(model=str(TINY), dtype="bfloat16", device=device)
    )
    for check in in_order(IN_PROCESS):  # no Ray or vLLM on a GPU machine lent here
        result = run_shared(check, node)
        shown = {PASSED: "pass", SKIPPED: "skip"}.get(result.status, "FAIL")
        add_row(table, result.name, shown, result.detail, result.seconds)
    shapes = run_check("real shapes", lambda: check_shapes(device, args), table)
    es_shapes = run_check("es shapes", lambda: check_es_shapes(device, args), table)
    report = {"device": name, "checks": table, "shapes": shapes, "es_shapes": es_shapes}
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if all(row["result"] != "FAIL" for row in table) else 1


if __name__ == "__main__":
    sys.exit(main())
