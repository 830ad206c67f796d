"""A short run as a user starts one (`evora <overrides> generations=3`, through Ray, on every
worker the hardware config gives: one a GPU with hardware=gpu), every worker busy in every
generation, with its generation throughput beside the same engine generating with the base
model alone in this process; and the same run with each engine over 2 GPUs (tensor parallel)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from evora.engines.registry import get_engine
from evora.selfcheck.checks import Check, Finding, Node, register_check
from evora.selfcheck.engine_checks import create

GENERATIONS, POPULATION, PROMPTS, MAX_TOKENS = 3, 8, 16, 8
# Small: 16 prompts a generation (8 candidates where the strategy has a population), held-out
# rows only at the start and the end.
RUN = (
    f"generations={GENERATIONS}",
    "eval_every=0",
    f"task.prompts_per_generation={PROMPTS}",
    "task.eval_size=16",
    "tracking.progress=false",
)


def sized(node: Node) -> tuple[str, ...]:
    """RUN, with the population set where the user's strategy has one."""
    keys = {field.name for field in fields(node.run.strategy)} if node.run is not None else {"population"}
    return (*RUN, f"strategy.population={POPULATION}") if "population" in keys else RUN


def short_run(node: Node, *extra: str) -> list[dict[str, Any]] | Finding:
    """A short run with the user's overrides and `extra`: its searched generations' records, or
    the failed Finding that quotes its one-line error."""
    from evora.tracking.metrics import read_metrics

    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "evora", *node.overrides, *sized(node), *extra, f"tracking.out_dir={out}"]
        done = subprocess.run(command, cwd=out, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            error = [line for line in done.stderr.splitlines() if line.startswith("evora: error:")]
            why = error[-1] if error else done.stderr.strip().splitlines()[-1:]
            return Finding(False, f"the run exited {done.returncode}: {why}", "the run's own error names it")
        [run_dir] = [p for p in Path(out).iterdir() if p.is_dir()]
        return [r for r in read_metrics(run_dir) if r["generation"] > 0]


def idle_generations(records: list[dict[str, Any]]) -> list[int]:
    """Generations in which a worker had no unit (of those whose work is cut into units)."""
    return [
        r["generation"]
        for r in records
        if "seconds_busy_by_worker" in r and len(r["seconds_busy_by_worker"]) < r["workers"]
    ]


def check_ray_run(node: Node) -> Finding:
    records = short_run(node)
    if isinstance(records, Finding):
        return records
    workers, idle = records[-1]["workers"], idle_generations(records)
    done = f"{len(records)} generations on {workers} workers"
    searched = [r for r in records if "tokens_per_second" in r]
    if len(searched) < 2:  # a strategy whose generations train on the driver (sft, grpo): no search units
        return Finding(len(records) == GENERATIONS, f"{done}; its generations have no search units to time")
    rate = statistics.mean(r["tokens_per_second"] for r in searched[1:])  # the first warms the engines up
    base = base_only_rate(node, searched[-1]["units"], POPULATION * PROMPTS, int(searched[-1]["tokens"]))
    detail = (
        f"{done}, {'every worker busy' if not idle else f'idle in {idle}'}; "
        f"{rate / workers:,.0f} tokens/s a worker, {rate / workers / base:.2f} of the engine generating "
        f"as many tokens with the base model alone ({base:,.0f} tokens/s)"
    )
    return Finding(len(records) == GENERATIONS and not idle, detail, "hardware.min_units" if idle else "")


def check_tensor_parallel(node: Node) -> Finding:
    records = short_run(node, "hardware.tensor_parallel_size=2")
    if isinstance(records, Finding):
        return records
    workers, idle = records[-1]["workers"], idle_generations(records)
    detail = f"{len(records)} generations on {workers} workers of 2 GPUs each, every worker busy: {not idle}"
    return Finding(len(records) == GENERATIONS and not idle, detail, "hardware.tensor_parallel_size" if idle else "")


def tensor_parallel_unavailable(node: Node) -> str | None:
    """Why tensor parallel 2 cannot run here, or None."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not get_engine(node.engine).tensor_parallel:
        return f"engine={node.engine} does not shard a model over GPUs"
    return None if gpus >= 2 and node.device == "cuda" else f"needs 2 GPUs and hardware=gpu; this node has {gpus}"


def base_only_rate(node: Node, calls: int, requests: int, tokens: int) -> float:
    """Generated tokens a second of the node's engine, base model, greedy, in calls of a unit's
    requests (a generation's `requests` in its `calls`) until it has generated `tokens`."""
    engine = create(node)
    per_call = max(requests // max(calls, 1), 1)
    rows = [[1, 5 + i % 50, 9 + i % 30, 17] for i in range(per_call)]
    engine.generate(rows[:4], [None] * len(rows[:4]), MAX_TOKENS)  # warm-up
    generated, start = 0, time.perf_counter()
    while generated < tokens:
        generated += sum(c.num_tokens for c in engine.generate(rows, [None] * len(rows), MAX_TOKENS))
    seconds = time.perf_counter() - start
    engine.shutdown()
    return generated / seconds


register_check(
    Check(
        "run through Ray",
        f"a {GENERATIONS}-generation run as a user starts it, on every worker, each busy every generation",
        check_ray_run,
    )
)
register_check(
    Check(
        "tensor parallel 2",
        "the same short run with each worker's engine sharded over 2 GPUs (NCCL between them)",
        check_tensor_parallel,
        skip=tensor_parallel_unavailable,
    )
)
