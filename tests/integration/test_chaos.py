"""Chaos on a three-node `ray.cluster_utils.Cluster`: for ES, RandOpt, GA, EGGROLL and SFT, a
10-generation run (SFT's: 20) with engine=hf is hit by kills of
its engine workers and of its driver at moments drawn from a seeded `random.Random`, each right
after a generation's record appears in metrics.jsonl (mid-generation: the workers are then inside the next generation;
the driver may be between its record and its checkpoint, or past both). Every run ends
bitwise equal to its fault-free reference run (one worker, no kills): the exported adapters
and models, every deterministic value of every metrics record, every JSONL file the run
writes and its summary, with no generation's record missing or written twice.

SFT is bitwise too: it trains on the driver (CPU torch), and a restarted driver rebuilds its
trainer from the checkpointed adapter, AdamW state and step; its batches are a function of
the run seed and the step.

The pool's and the driver's recovery do not depend on the strategy; what does, a strategy's
state through a checkpoint, is tested without Ray for the strategies not run here: SNES and
PGPE (tests/unit/test_separable.py), merge's CMA-ES replay and restart (tests/unit/test_merge.py),
the ecology's population through a resumed run (tests/integration/test_ecology_run.py).

First every worker is killed at once, in a seeded order: the pool, left with none, waits for
their replacements, so each one joins and is counted (a generation here is shorter than a
worker's start). Then the driver, once a seeded later generation is logged and the
replacements are counted in a checkpointed record, so the counts are exact. The kills wait on
observable state (records, actor states), never on time.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray
import torch
from ray_cluster import finish, live_driver, live_workers, logged, run_folder, start_on, three_nodes, wait_for
from safetensors.torch import load_file

from evora.distributed.launch import driver_name
from evora.tracking.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("chaos")]

GENERATIONS = 10
# Small runs: a generation's search and a held-out evaluation every 5 generations on 32 prompts.
TINY_RUN = (
    "engine=hf",
    f"generations={GENERATIONS}",
    "engine.max_loras=4",
    "task.prompts_per_generation=16",
    "task.eval_size=32",
    "eval_every=5",
)
RUNS = {
    "es": (*TINY_RUN, "+experiment=quickstart/es", "strategy.population=8"),
    "ga": (*TINY_RUN, "+experiment=quickstart/ga", "strategy.population=8"),
    # Every round distils on the driver: a restarted driver retrains from the checkpointed adapter.
    "randopt": (*TINY_RUN, "+experiment=quickstart/randopt", "strategy.population=8", "strategy.top_k=2"),
    # Snapshots every 3 generations: its workers killed after generation 4 or 5, their
    # replacements join from the snapshot of generation 3 and the updates since; decay towards
    # the model's own weights, which a replacement reads from the model, not from the snapshot.
    # One worker back runs its generations in about a second each here, and under a loaded
    # machine the second replacement's start has spanned 5 of them (joined at generation 10 of
    # 10): 20 generations leave the driver's kill room, as SFT's below.
    "eggroll": (
        *TINY_RUN,
        "+experiment=quickstart/eggroll",
        "strategy.population=8",
        "strategy.snapshot_every=3",
        "strategy.weight_decay=0.5",
        "strategy.weight_decay_anchor=start",
        "generations=20",
    ),
    # eval_every=1: SFT needs its workers only to evaluate, so the first replacement joins at once;
    # with one worker back its generations are short, and under a loaded machine the second
    # replacement's start has spanned 8 of them: 20 generations leave the driver's kill room.
    "sft": (
        *TINY_RUN,
        "+experiment=quickstart/sft",
        "strategy.steps_per_generation=4",
        "eval_every=1",
        "generations=20",
    ),
}
# Values of a metrics record that depend on time and on the workers, not on the run's trajectory.
VARYING = {"time", "wall_clock_s", "tokens_per_second", "worker_rss_mb"}
VARYING |= {"workers", "workers_lost", "workers_replaced", "pool_events"}


@pytest.fixture(scope="module")
def cluster():
    yield from three_nodes()


@pytest.fixture(scope="module")
def references() -> dict[str, Path]:
    """Fault-free runs' folders by strategy, kept for the module's later tests."""
    return {}


@dataclass
class Chaos:
    run_dir: Path
    stdout: str
    replaced_at: list[int]  # the generations whose records count a replacement joining


def run_with_chaos(cluster, run: tuple[str, ...], seed: int, workers: int, first: range = range(0, 3)) -> Chaos:
    """Every engine worker killed, in a seeded order, once a seeded generation of `first`
    is logged (the pool, left with none, waits for their replacements, so each one joins), then
    the driver once a seeded later generation is logged and the replacements are counted in a
    checkpointed record."""
    chaos = random.Random(seed)
    out, process = start_on(cluster, (*run, f"hardware.num_workers={workers}"))
    try:
        return kill_and_finish(cluster, chaos, out, process, workers, first, generations_of(run))
    finally:
        process.kill()  # gone already, unless the test failed: it must not hold workers into the next test


def kill_and_finish(cluster, chaos: random.Random, out: Path, process, workers: int, first: range, last: int) -> Chaos:
    moment = chaos.choice(first)
    run_dir = wait_for(process, lambda: logged(out, moment), f"generation {moment}")
    driver = live_driver(cluster, run_dir)
    victims = sorted(a.name for a in live_workers(cluster, run_dir, driver.pid))
    assert len(victims) == workers, victims
    chaos.shuffle(victims)
    for victim in victims:
        ray.kill(ray.get_actor(victim))
    wait_for(process, lambda: not set(victims) & {a.name for a in live_workers(cluster, run_dir)}, "the kills")

    def replaced() -> list[int]:
        records = read_metrics(run_dir)
        joined = [r["generation"] for r in records if r.get("workers_replaced")]
        return joined if sum(r.get("workers_replaced", 0) for r in records) == workers else []

    replaced_at = wait_for(process, replaced, "the replacements to join")
    # The record after theirs is written after the checkpoint that holds theirs.
    moment = max(chaos.randrange(1, last), replaced_at[-1] + 1)
    assert moment <= last, f"the replacements joined at generation {replaced_at[-1]}, too late"
    wait_for(process, lambda: logged(out, moment), f"generation {moment}")
    ray.kill(ray.get_actor(driver_name(str(run_dir))), no_restart=False)
    return Chaos(run_dir, finish(process), replaced_at)


def generations_of(run: tuple[str, ...]) -> int:
    """The run's generations: its last `generations=` override."""
    return int([a for a in run if a.startswith("generations=")][-1].partition("=")[2])


def tensors_of(run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    files = [*run_dir.glob("adapters/**/*.safetensors"), *run_dir.glob("model/*.safetensors")]
    return {str(f.relative_to(run_dir)): load_file(str(f)) for f in sorted(files)}


def trajectory(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in VARYING and not k.startswith("seconds")}


def assert_bitwise_equal(run_dir: Path, reference: Path) -> None:
    ours, theirs = tensors_of(run_dir), tensors_of(reference)
    assert ours.keys() == theirs.keys() and ours, (ours.keys(), theirs.keys())
    for name, tensors in theirs.items():
        assert tensors.keys() == ours[name].keys()
        assert all(torch.equal(ours[name][k], v) for k, v in tensors.items()), name
    records = read_metrics(run_dir)
    reference_generations = [r["generation"] for r in read_metrics(reference)]
    assert [r["generation"] for r in records] == reference_generations  # none missing, none twice
    assert reference_generations == list(range(len(reference_generations)))
    assert [trajectory(r) for r in records] == [trajectory(r) for r in read_metrics(reference)]
    files = sorted(p.name for p in reference.glob("*.jsonl") if p.name != "metrics.jsonl")
    assert files == sorted(p.name for p in run_dir.glob("*.jsonl") if p.name != "metrics.jsonl")
    for name in files:
        assert read_metrics(run_dir, name) == read_metrics(reference, name), name
    summaries = [json.loads((d / "eval" / "summary.json").read_text()) for d in (run_dir, reference)]
    for summary in summaries:
        del summary["compute"]  # its seconds vary
    assert summaries[0] == summaries[1]


def assert_recovered(chaos: Chaos, workers: int) -> None:
    """Each lost worker was replaced and its work rerun; the driver restarted once, from its
    last checkpoint."""
    stdout = chaos.stdout
    records = [r for r in read_metrics(chaos.run_dir) if r["generation"] > 0]
    assert sum(r["workers_lost"] for r in records) == workers, records
    assert sum(r["workers_replaced"] for r in records) == workers and records[-1]["workers"] == workers
    assert stdout.count("lost; its work is rerun") == workers, stdout
    assert stdout.count("started as a replacement") == workers, stdout
    assert stdout.count("restarted from the last checkpoint") == 1 and "resumed at generation" in stdout, stdout


@pytest.mark.parametrize(
    "strategy,seed,workers",
    [
        pytest.param("es", 11, 3, id="es"),
        pytest.param("ga", 12, 2, id="ga"),
        pytest.param("randopt", 19, 2, id="randopt"),
        pytest.param("eggroll", 13, 2, id="eggroll"),
        pytest.param("sft", 15, 2, id="sft"),
    ],
)
def test_seeded_worker_and_driver_kills_leave_the_run_bitwise_equal_to_a_fault_free_one(
    cluster, references, strategy, seed, workers
):
    # The fault-free run: one worker, on the same cluster, at the same time (it leaves the chaos
    # run's waits for its replacements and its restart less idle time).
    out, fault_free = start_on(cluster, (*RUNS[strategy], "hardware.num_workers=1"))
    try:
        first = range(4, 6) if strategy == "eggroll" else range(0, 3)
        chaos = run_with_chaos(cluster, RUNS[strategy], seed, workers, first)
        finish(fault_free)
    finally:
        fault_free.kill()  # gone already, unless the chaos run failed
    references[strategy] = run_folder(out)
    assert_recovered(chaos, workers)
    assert_bitwise_equal(chaos.run_dir, references[strategy])
    if strategy == "eggroll":  # the replacements' weights: a snapshot (of generation 3 or later) and the updates since
        assert chaos.replaced_at[0] - 1 > 3, chaos.replaced_at


HUNG_AFTER_S = 30  # engine.unit_timeout_s of the hung-worker run: well above a unit's seconds here


def test_a_hung_worker_is_killed_after_the_unit_deadline_and_the_run_ends_bitwise_equal(cluster, references):
    """One of two workers stopped (SIGSTOP: alive to Ray, never answering) once generation 1 is
    logged: the pool takes it for hung when its unit passes engine.unit_timeout_s, kills and
    replaces it, and its units run again elsewhere with the same results."""
    started = None if "es" in references else start_on(cluster, (*RUNS["es"], "hardware.num_workers=1"))
    out, process = start_on(cluster, (*RUNS["es"], "hardware.num_workers=2", f"engine.unit_timeout_s={HUNG_AFTER_S}"))
    victim = None
    try:
        run_dir = wait_for(process, lambda: logged(out, 1), "generation 1")
        driver = live_driver(cluster, run_dir)
        victim = min(live_workers(cluster, run_dir, driver.pid), key=lambda actor: actor.name)
        os.kill(victim.pid, signal.SIGSTOP)
        stdout = finish(process)
        if started is not None:
            finish(started[1])
            references["es"] = run_folder(started[0])
    finally:
        process.kill()
        if started is not None:
            started[1].kill()
        if victim is not None:
            with contextlib.suppress(ProcessLookupError):  # killed by the pool, as it should be
                os.kill(victim.pid, signal.SIGKILL)
    assert f"gave no result in {HUNG_AFTER_S} s (engine.unit_timeout_s): killed" in stdout, stdout
    records = read_metrics(run_dir)
    assert sum(r.get("workers_lost", 0) for r in records) >= 1, records  # its replacement may join after the end
    assert_bitwise_equal(run_dir, references["es"])
