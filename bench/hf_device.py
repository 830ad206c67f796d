"""The transformers engine on an accelerator against the same engine on the CPU (docs/architecture.md,
"Benchmarks"): the paths of `engine=hf` that run on a GPU machine without vLLM or Ray.

    python bench/hf_device.py --device cuda [--population 16] [--prompts 32] [--tokens 16] [--out FILE]
    python bench/hf_device.py --smoke [--device cpu|cuda] [--out FILE]

The real EngineWorker (engine=hf, the ES strategy: N LoRA candidates rebuilt from seeds, one
adapter at a time through PEFT, its prompts batched) evaluates the same unit on each device:

  parity       the bundled tiny model in fp32: the share of the unit's greedy completions that
               are equal on both devices, the largest reward difference, the largest difference of
               the per-token KL(adapter || base) (`WorkUnit.kl`), and the share of seeded samples
               (temperature 1) that are equal. Kernels differ between devices, so a near tie can
               decode another token: these are measured, not promised.
  throughput   generated tokens per second of the same unit on the bench model (~26M parameters,
               random weights, every sequence exactly --tokens long) on each device, and in bf16 on
               the accelerator: the median of --repeats, with the worker's own split of it (materialising
               the adapters, loading them, generating, rewards).

Results: bench/results/hf_device.json.

--device cpu compares the CPU with itself (the same paths, parity then expected to be exact).
--smoke (CI: tests/integration/test_benches.py) runs every path at the least size (2 candidates
x 2 prompts x 2 tokens, one repeat; parity's sampled unit keeps its 8 held-out prompts) on
--device, by default cuda where torch sees a CUDA device and otherwise cpu, compared against
cpu. Its figures mean nothing; it writes to --out, by default a file in a new temporary folder,
never over bench/results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_model import RESULTS, ROOT, bench_layout, build_bench_model

TINY = str(ROOT / "evora" / "models" / "tiny")
SMOKE = {"population": 2, "prompts": 2, "tokens": 2, "repeats": 1}  # --smoke: every path at the least size


def start_worker(model: str, device: str, dtype: str, args: argparse.Namespace, extra: list[str]) -> Any:
    from evora.distributed.worker import EngineWorker
    from evora.distributed.worker_spec import engine_rank, worker_spec
    from evora.plan.compose import compose_run

    run = compose_run(
        [
            "engine=hf",
            *(["hardware=gpu", "hardware.num_workers=1"] if device == "cuda" else []),
            f"model.path={model}",
            f"model.dtype={dtype}",
            f"strategy.population={args.population}",
            "strategy.sigma=0.01",
            "strategy.init_b_std=0.01",
            f"task.prompts_per_generation={args.prompts}",
            f"task.max_tokens={args.tokens}",
            f"hardware.cpu_threads_per_worker={args.threads}",
            *extra,
        ]
    )
    layout = bench_layout(run, model)
    return EngineWorker(worker_spec(run, model, layout, f"bench-hf-{device}", max_lora_rank=engine_rank(layout)), 0)


def es_unit(worker: Any, split: str, prompts: int, **flags: bool) -> tuple[Any, Any]:
    from evora.distributed.worker import WorkUnit
    from evora.lora.init import random_adapter

    state = worker.strategy.start(random_adapter(worker.layout, 0, None, 0.01))
    specs, payload = worker.strategy.ask(state, 0)
    return payload, WorkUnit(tuple(specs), split, tuple(range(prompts)), keep_texts=True, **flags)


def equal_share(a: list[list[str]], b: list[list[str]]) -> float:
    pairs = [(x, y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b)]
    return sum(x == y for x, y in pairs) / len(pairs)


def parity(args: argparse.Namespace) -> dict:
    """The same greedy (with KL) and sampled units of the tiny model on the CPU and on --device."""
    results: dict[str, Any] = {}
    for device in ("cpu", args.device):
        greedy = start_worker(TINY, device, "float32", args, [])
        payload, unit = es_unit(greedy, "train", min(args.prompts, 16), kl=True)
        results[device] = {"greedy": greedy.evaluate(payload, unit)}
        greedy.shutdown()
        sampled = start_worker(TINY, device, "float32", args, ["task.eval_temperature=1.0", "task.eval_samples=2"])
        payload, unit = es_unit(sampled, "heldout", 8)
        results[device]["sampled"] = sampled.evaluate(payload, unit)
        sampled.shutdown()
    cpu, other = results["cpu"], results[args.device]
    return {
        "greedy_completions_equal": equal_share(cpu["greedy"].texts, other["greedy"].texts),
        "greedy_reward_max_difference": float(np.abs(cpu["greedy"].rewards - other["greedy"].rewards).max()),
        "kl_max_difference": float(np.abs(cpu["greedy"].kl - other["greedy"].kl).max()),
        "kl_max": float(cpu["greedy"].kl.max()),
        "sampled_completions_equal": equal_share(cpu["sampled"].texts, other["sampled"].texts),
        "cells": int(cpu["greedy"].rewards.size),
    }


def throughput(model: str, device: str, dtype: str, args: argparse.Namespace) -> dict:
    worker = start_worker(model, device, dtype, args, ["engine.ignore_eos=true"])
    payload, unit = es_unit(worker, "train", args.prompts)
    worker.evaluate(payload, unit)  # warm-up (CUDA context, kernels, the first adapter load)
    seconds, results = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        results.append(worker.evaluate(payload, unit))
        seconds.append(time.perf_counter() - start)
    worker.shutdown()
    median, tokens = statistics.median(seconds), int(results[-1].tokens.sum())
    assert tokens == args.population * args.prompts * args.tokens  # every sequence exactly --tokens long
    parts = {part: statistics.median(r.timings[part] for r in results) for part in results[-1].timings}
    return {
        "device": device,
        "dtype": dtype,
        "seconds": median,
        "tokens": tokens,
        "tokens_per_s": tokens / median,
        "parts_s": parts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), help="default: cuda (--smoke: cuda if there is one, else cpu)"
    )
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of the CPU engine")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", help="the results file (default: bench/results/hf_device.json; --smoke: in a temporary folder)"
    )
    parser.add_argument("--smoke", action="store_true", help="every path at the least size (CI)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.device is None:
        args.device = "cpu" if args.smoke and not torch.cuda.is_available() else "cuda"
    if args.out is None:
        folder = Path(tempfile.mkdtemp(prefix="evora-bench-smoke-")) if args.smoke else RESULTS
        args.out = str(folder / "hf_device.json")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    with tempfile.TemporaryDirectory(prefix="evora-bench-") as folder:
        parameters = build_bench_model(Path(folder))
        runs = [throughput(folder, "cpu", "float32", args), throughput(folder, args.device, "float32", args)]
        if args.device == "cuda":
            runs.append(throughput(folder, "cuda", "bfloat16", args))
    report = {
        "setup": {**vars(args), "torch": torch.__version__, "bench_model_parameters": parameters},
        "accelerator": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "parity_tiny_fp32": parity(args),
        "throughput": runs,
        "speedup_over_cpu": {f"{r['device']} {r['dtype']}": r["tokens_per_s"] / runs[0]["tokens_per_s"] for r in runs},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("accelerator", "parity_tiny_fp32", "speedup_over_cpu")}, indent=2))
    for run in runs:
        parts = ", ".join(f"{part} {value:.2f}" for part, value in run["parts_s"].items())
        speed = f"{run['tokens_per_s']:10.1f} tokens/s ({run['seconds']:.2f} s: {parts})"
        print(f"{run['device']:>5} {run['dtype']:>9}: {speed}")


if __name__ == "__main__":
    main()
