"""Cluster operations on this machine: placement on a three-node `ray.cluster_utils.Cluster`
with declared GPUs, fault injection (a worker killed and a node removed; an es_full worker
killed) against a fault-free run (seeded kills of workers and drivers for every strategy:
test_chaos.py), Hydra multirun in one Ray session with W&B groups and a sweep
summary, and a local Ray that listens on loopback only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import ray
import torch
import yaml
from ray.util.state import list_actors
from ray_cluster import GPUS_PER_NODE, assert_same_result, finish, live_workers, logged, start_on, three_nodes, wait_for
from ray_probe import Probe, SlowStart
from safetensors.torch import load_file

from conftest import ROOT, SMALL, cli_run, only_run_dir, run_evora
from evora.distributed.launch import driver_name
from evora.distributed.placement import place_workers, wait_placed, worker_count
from evora.errors import ConfigError, RunError
from evora.plan.compose import compose_run
from evora.tracking.metrics import read_metrics

# One xdist worker: the cluster fixture is started once, and the fault runs' reference run is
# the cached run of test_cli.py's test_hf_engine_runs_the_same_loop (same arguments).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hf-run")]

FAKE_SECRETS = {
    "WANDB_API_KEY": "local-fake0123456789abcdef0123456789abcdef0123",
    "HF_TOKEN": "hf_fakeTokenValue0123456789",
    "EVORA_TEST_SERVICE_KEY": "fake-service-key-98765",
}


@pytest.fixture(scope="module")
def cluster():
    yield from three_nodes()


# --- placement ----------------------------------------------------------------------------


def placed(*overrides: str) -> list[dict]:
    hw = compose_run(list(overrides)).hardware
    placement = place_workers(hw, worker_count(hw))
    actors = [ray.remote(Probe).options(**options).remote() for options in placement.options]
    try:
        return ray.get([actor.where.remote() for actor in actors], timeout=120)
    finally:
        for actor in actors:
            ray.kill(actor)
        placement.release()


def test_one_engine_worker_per_gpu(cluster):
    where = placed("hardware=gpu", "hardware.cpus_per_worker=0.5")
    assert len(where) == 3 * GPUS_PER_NODE
    assert all(len(w["gpus"]) == 1 for w in where)
    assert len({(w["node"], w["gpus"][0]) for w in where}) == 3 * GPUS_PER_NODE  # no GPU shared


def test_multinode_spreads_workers_over_every_node(cluster):
    where = placed("hardware=multinode", "hardware.num_workers=3", "hardware.cpus_per_worker=0.5")
    assert len({w["node"] for w in where}) == 3 and all(len(w["gpus"]) == 1 for w in where)


def test_tensor_parallel_engines_get_a_strict_pack_group_of_gpus(cluster):
    where = placed("hardware=multinode", "hardware.tensor_parallel_size=2", "hardware.cpus_per_worker=0.5")
    assert len(where) == 3  # 6 GPUs / 2 per engine
    for w in where:
        assert w["gpus"] == []  # the worker holds none; its shards do
        assert [node for node, _ in w["shards"]] == [w["node"]] * 2  # one node per engine
        assert sorted(len(gpus) for _, gpus in w["shards"]) == [1, 1]
        assert len({gpus[0] for _, gpus in w["shards"]}) == 2
    assert len({w["node"] for w in where}) == 3


def test_tensor_parallel_wider_than_any_node_fails_at_once(cluster):
    hw = compose_run(["hardware=gpu", "hardware.num_workers=1", "hardware.tensor_parallel_size=3"]).hardware
    with pytest.raises(ConfigError, match=r"hardware.tensor_parallel_size=3: no node of the Ray cluster has"):
        place_workers(hw, 1)


def refused_while_held(hw, holders: list, until=lambda: True) -> str:
    """The line `wait_placed` fails with for a worker Ray cannot place while `holders` hold
    their resources, once `until()` (actors an earlier test killed may still hold theirs)."""
    try:
        ray.get([holder.where.remote() for holder in holders], timeout=120)
        deadline = time.monotonic() + 120
        while not until() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert until()
        actor = ray.remote(Probe).options(**place_workers(hw, 1).options[0]).remote()  # the totals suffice
        with pytest.raises(RunError) as error:
            wait_placed([actor], [actor.where.remote()], hw, timeout_s=1)
        ray.kill(actor)
    finally:
        for holder in holders:
            ray.kill(holder)
    return str(error.value)


def test_a_worker_ray_cannot_place_fails_the_start_in_one_line_and_a_slow_one_is_waited_for(cluster):
    hw = compose_run(["hardware=gpu", "hardware.num_workers=1", "hardware.cpus_per_worker=0.5"]).hardware
    holders = [ray.remote(Probe).options(num_gpus=1, num_cpus=0).remote() for _ in range(3 * GPUS_PER_NODE)]
    line = refused_while_held(hw, holders)  # every GPU held by another actor
    assert line.startswith("1 of 1 engine worker(s) not placed by Ray after 1s: each needs 0.5 CPU (")
    assert f"1 GPU (0 free of {3 * GPUS_PER_NODE})" in line and "\n" not in line
    slow = ray.remote(SlowStart).options(num_cpus=0.5).remote(3.0)  # placed, its constructor still going
    assert wait_placed([slow], [slow.where.remote()], hw, timeout_s=0.5)[0]["node"]
    ray.kill(slow)


def test_room_free_in_sum_but_split_between_nodes_places_no_worker_and_fails_in_one_line(cluster):
    """Two nodes' GPUs held and the third node's CPUs: Ray has a free GPU and free CPUs, on
    different nodes, and can place no worker that needs both."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from evora.distributed.placement import fits, has_room

    hw = compose_run(["hardware=gpu", "hardware.num_workers=1", "hardware.cpus_per_worker=0.5"]).hardware
    nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]

    def held_on(node: str, **resources: float):
        on_node = NodeAffinitySchedulingStrategy(node, soft=False)
        return ray.remote(Probe).options(scheduling_strategy=on_node, **resources).remote()

    holders = [held_on(node, num_gpus=1, num_cpus=0) for node in nodes[:2] for _ in range(GPUS_PER_NODE)]
    holders.append(held_on(nodes[2], num_cpus=2))
    line = refused_while_held(hw, holders, until=lambda: fits(ray.available_resources(), hw) and not has_room(hw))
    assert line.startswith("1 of 1 engine worker(s) not placed by Ray after 1s: each needs 0.5 CPU (")
    assert "1 GPU (2 free of 6), free on different nodes (one node must hold all of it)" in line and "\n" not in line


def test_engine_workers_get_their_engines_environment_through_ray(cluster, tiny_path, tiny_shapes):
    """The nodes were started from this process, whose environment holds a 1 GiB KV cache: the
    run's 3 GiB reaches every worker through Ray's runtime_env, with vLLM's other settings."""
    from evora.distributed.pool import worker_placement
    from evora.distributed.worker_spec import worker_spec
    from evora.engines.environment import engine_environment
    from evora.lora.layout import build_layout

    run = compose_run(["hardware.kv_cache_gib=3", "hardware.num_workers=3", "hardware.cpus_per_worker=0.5"])
    layout = build_layout(tiny_shapes, rank=4, alpha=8, target_modules=["q_proj"], layers=None, base_model=tiny_path)
    spec = worker_spec(run, tiny_path, layout, "environment")
    expected = engine_environment("vllm", spec.engine)
    assert expected["VLLM_CPU_KVCACHE_SPACE"] == "3" != os.environ["VLLM_CPU_KVCACHE_SPACE"]
    placement = worker_placement(spec, run.hardware)
    actors = [ray.remote(Probe).options(**options).remote() for options in placement.options]
    try:
        assert ray.get([a.environment.remote(sorted(expected)) for a in actors], timeout=120) == [expected] * 3
    finally:
        for actor in actors:
            ray.kill(actor)
        placement.release()


# --- fault tolerance ------------------------------------------------------------------------

FAULT_RUN = (
    "+experiment=quickstart/es",
    *SMALL,
    "generations=2",
    "engine=hf",
)  # the reference: hardware.num_workers=1, no faults


def test_killed_worker_and_removed_node_do_not_change_the_result(cluster):
    reference, _ = cli_run(*FAULT_RUN, "hardware.num_workers=1")
    out, process = start_on(cluster, FAULT_RUN)
    run_dir = wait_for(process, lambda: logged(out, 0), "the initial evaluation")  # generation 1 is under way
    victim = live_workers(cluster, run_dir)[0]
    ray.kill(ray.get_actor(victim.name))

    wait_for(process, lambda: logged(out, 1), "generation 1")
    drivers = list_actors(address=cluster.address, filters=[("name", "=", driver_name(str(run_dir)))])
    driver_node = next(a.node_id for a in drivers)
    worker_nodes = {a.node_id for a in live_workers(cluster, run_dir)}
    node = next(n for n in cluster.worker_nodes if n.node_id in worker_nodes and n.node_id != driver_node)
    cluster.remove_node(node, allow_graceful=False)
    finish(process)
    assert_same_result(run_dir, reference)


# Long enough (~20 s) for a replacement to start (~10 s) and join with a snapshot and updates
# behind it (it joined at generation 15 of 30). EGGROLL's replacement: test_chaos.py.
ES_FULL_RUN = (
    *SMALL,
    "+experiment=quickstart/es_full",
    "strategy.snapshot_every=4",
    "generations=30",
    "task.prompts_per_generation=32",
    "engine=hf",
)


def test_a_killed_es_full_worker_is_replaced_with_the_same_weights(cluster):
    """A replacement rebuilds the engine's weights from the snapshot and the fitness since
    (its checksum is checked when it joins); the exported model is bitwise the fault-free run's."""
    reference, _ = cli_run(*ES_FULL_RUN, "hardware.num_workers=1")
    out, process = start_on(cluster, ES_FULL_RUN)
    run_dir = wait_for(process, lambda: logged(out, 0), "the initial evaluation")
    victim = live_workers(cluster, run_dir)[0].name
    ray.kill(ray.get_actor(victim))
    wait_for(process, lambda: victim not in {a.name for a in live_workers(cluster, run_dir)}, f"{victim} to die")
    stdout = finish(process)
    ours, theirs = (load_file(str(d / "model" / "model.safetensors")) for d in (run_dir, reference))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    rewards = [[r.get("reward_mean") for r in read_metrics(d)] for d in (run_dir, reference)]
    assert rewards[0] == rewards[1]
    records = [r for r in read_metrics(run_dir) if r["generation"] > 0]
    assert sum(r["workers_replaced"] for r in records) >= 1, stdout


# --- Hydra multirun -------------------------------------------------------------------------


def test_multirun_shares_one_ray_session_groups_wandb_runs_and_writes_a_sweep_summary():
    out, ray_tmp = Path(tempfile.mkdtemp(prefix="evora-test-")), Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
    result = run_evora(
        [
            "-m",
            "+experiment=quickstart/es,quickstart/ga",
            "generations=1",
            "engine=hf",
            "hardware.num_workers=1",
            "task.prompts_per_generation=8",
            "task.eval_size=16",
            "tracking=wandb",
            "tracking.wandb_mode=offline",
            f"tracking.out_dir={out}",
        ],
        cwd=out,
        env={**FAKE_SECRETS, "RAY_TMPDIR": str(ray_tmp)},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    sweep = only_run_dir(out)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    assert len(list(ray_tmp.glob("ray/session_2*"))) == 1, "each job started its own Ray"
    rows = json.loads((sweep / "sweep_summary.json").read_text())
    assert [r["strategy"] for r in rows] == ["es", "ga"] and all(r["status"] == "completed" for r in rows)
    for row, job in zip(rows, ("0", "1")):
        summary = json.loads((sweep / job / "eval" / "summary.json").read_text())
        assert row["final_heldout"] == summary["final"]["reward"] and row["generations"] == 1
        assert row["wall_clock_s"] > 0 and row["run_dir"].endswith(f"/{job}")
        wandb_run = next((sweep / job / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
        assert f'"wandb_group":"{sweep.name}"'.encode() in wandb_run  # the group, in the run's W&B config
    markdown = (sweep / "sweep_summary.md").read_text()
    assert "+experiment=quickstart/es" in markdown and "+experiment=quickstart/ga" in markdown
    assert_no_secrets(sweep)


def test_an_optuna_study_searches_sigma_and_lr_with_each_trial_an_evora_job():
    """hydra/sweeper=optuna (hydra-optuna-sweeper): two trials, each a run folder; the objective each
    returns is its summary's best held-out reward; the study's best is the best trial's."""
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    result = run_evora(
        ["-m", "+experiment=quickstart/es", *SMALL, "generations=1", "engine=hf", "task.selection_size=0"]
        + ["hardware.num_workers=1"]  # the sweeper is the point: one engine process a trial
        + ["hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.direction=maximize"]
        + ["hydra.sweeper.sampler.seed=0", "strategy.sigma=interval(0.1,0.5)", "strategy.lr=interval(0.01,0.1)"]
        + [f"tracking.out_dir={out}"],
        cwd=out,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    sweep = only_run_dir(out)
    rows = json.loads((sweep / "sweep_summary.json").read_text())
    assert [r["job"] for r in rows] == [0, 1] and all(r["status"] == "completed" for r in rows)
    for row in rows:
        summary = json.loads((Path(row["run_dir"]) / "eval" / "summary.json").read_text())
        assert row["objective"] == summary["best"]["reward"]  # objective=best.reward, the default
        chosen = dict(o.split("=") for o in row["overrides"].split() if o.startswith(("strategy.sigma", "strategy.lr")))
        assert 0.1 <= float(chosen["strategy.sigma"]) <= 0.5 and 0.01 <= float(chosen["strategy.lr"]) <= 0.1
    study = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert study["best_value"] == max(r["objective"] for r in rows)
    assert f"best value {study['best_value']:.3f}" in (sweep / "sweep_summary.md").read_text()
    compared = run_evora(["compare", str(sweep), "--out", str(out / "compare")], cwd=out)
    assert compared.returncode == 0 and len(json.loads((out / "compare" / "compare.json").read_text())["runs"]) == 2


def assert_no_secrets(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for name, value in FAKE_SECRETS.items():
                assert value.encode() not in data, f"{name} found in {path}"


# --- security defaults ----------------------------------------------------------------------

LISTENERS = textwrap.dedent("""
    import json, os, psutil, ray
    from evora.plan.compose import compose_run, setup
    from evora.distributed.ray_session import init_ray
    setup()
    init_ray(compose_run([]))
    node = ray._private.worker.global_worker.node
    session = node.get_session_dir_path()
    ours = {p.pid for p in psutil.process_iter(["cmdline"]) if session in " ".join(p.info["cmdline"] or [])}
    ours |= {c.pid for c in psutil.Process().children(recursive=True)} | {os.getpid()}
    listening = sorted({c.laddr.ip for c in psutil.net_connections("inet")
                        if c.status == psutil.CONN_LISTEN and c.pid in ours})
    print(json.dumps({"node_ip": node.node_ip_address, "listening": listening,
                      "dashboard": ray._private.worker.get_dashboard_url()}))
    ray.shutdown()
""")


def test_local_ray_listens_on_loopback_only_and_has_no_dashboard():
    ray_tmp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
    result = subprocess.run(
        [sys.executable, "-c", LISTENERS],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "RAY_TMPDIR": str(ray_tmp)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["node_ip"] == "127.0.0.1" and not report["dashboard"]
    assert report["listening"] and all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for ip in report["listening"]), (
        report["listening"]
    )
