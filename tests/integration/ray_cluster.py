"""What the cluster and chaos tests share: a three-node `ray.cluster_utils.Cluster` this process
joins, the CLI started against it, polls on a run folder's observable state, and the
comparison of a run's results with its fault-free reference."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.state import list_actors
from safetensors.torch import load_file

from conftest import evora_cmd, free_port
from evora.distributed.launch import NAMESPACE, driver_name
from evora.tracking.metrics import read_metrics
from evora.tracking.run_dir import run_tag

HERE = Path(__file__).resolve().parent
GPUS_PER_NODE = 2


def three_nodes() -> Iterator[Cluster]:
    """A head and two more nodes, each declaring 2 CPUs and 2 GPUs; this process joins it (the
    body of a module-scoped fixture)."""
    if ray.is_initialized():
        ray.shutdown()
    # Ray's workers import the test modules (ray_probe's Probe) and conftest by name; the
    # nodes pass this on to them.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(HERE.parent), saved]))
    # A dashboard port of its own: the state API (list_actors) goes through the dashboard, and
    # another cluster of the suite may hold Ray's default 8265.
    # No log monitors (one a node, each globbing the one session's log folder ten times a second):
    # the CLI's runs keep workers' logs off the console, and this process reads none.
    head = {"num_cpus": 2, "num_gpus": GPUS_PER_NODE, "dashboard_port": free_port(), "include_log_monitor": False}
    nodes = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(2):
        nodes.add_node(num_cpus=2, num_gpus=GPUS_PER_NODE, include_log_monitor=False)
    nodes.wait_for_nodes()
    ray.init(address=nodes.address, namespace=NAMESPACE)
    yield nodes
    ray.shutdown()
    nodes.shutdown()
    if saved is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = saved


def start_on(cluster: Cluster, run: tuple[str, ...]) -> tuple[Path, subprocess.Popen]:
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    args = [
        *run,
        "hardware=multinode_cpu",
        f"hardware.address={cluster.address}",
        f"tracking.out_dir={out}",
        "tracking.progress=false",
    ]
    return out, subprocess.Popen(evora_cmd(*args), cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(process: subprocess.Popen, ready, what: str, timeout: float = 600):
    """Poll the run folder until `ready()` returns something (the run must still be going); on a
    timeout the run is killed (it would hold its workers into the next test) and the failure
    carries what it printed and the cluster's actors.

    Ray nices its workers to 15 so that raylets stay responsive; against the other test processes'
    work at nice 0 on 2 cores, a run's engine workers then start in minutes, not seconds (CI,
    stop 66: three workers still inside their start after 300 s). Un-niced, the raylets of
    Ray starts elsewhere in the suite outlasted Ray's fixed 30 s registration wait instead, so the
    suite keeps Ray's niceness and waits longer here."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stdout, stderr = process.communicate()
            raise AssertionError(f"the run ended before {what}: {stdout[-3000:]}{stderr[-3000:]}")
        found = ready()
        if found:
            return found
        time.sleep(0.2)
    process.kill()
    stdout, stderr = process.communicate()
    raise AssertionError(f"timed out waiting for {what}; actors: {actors_now()}\n{stdout[-3000:]}{stderr[-3000:]}")


def actors_now() -> list[tuple[str, str]] | str:
    """The joined cluster's actors not dead, by name and state (PENDING_CREATION: no resources)."""
    try:
        address = ray.get_runtime_context().gcs_address
        return [(a.name, a.state) for a in list_actors(address=address, filters=[("state", "!=", "DEAD")])]
    except Exception as error:  # a diagnostic: it must not hide the failure it describes
        return f"(not listed: {error})"


def run_folder(out: Path):
    runs = [p for p in out.iterdir() if p.is_dir()]
    return runs[0] if runs else None


def logged(out: Path, generation: int):
    run_dir = run_folder(out)
    if run_dir is not None and any(r["generation"] >= generation for r in read_metrics(run_dir)):
        return run_dir
    return None


def live_workers(cluster: Cluster, run_dir: Path, driver_pid: int | None = None) -> list:
    """The run's engine workers that are alive; `driver_pid`: only those of that driver process
    (a restarted driver starts its own pool, named after its process)."""
    # The cluster's address, not auto-detection: other Ray instances may be running on this
    # machine (other runs, other test workers).
    prefix = f"evora-worker-{run_tag(run_dir)}-" + ("" if driver_pid is None else f"{driver_pid}-")
    alive = list_actors(address=cluster.address, filters=[("state", "=", "ALIVE")])
    return [a for a in alive if (a.name or "").startswith(prefix)]


def live_driver(cluster: Cluster, run_dir: Path):
    """The run's driver actor while it is alive (its process id tells its pool apart), else None."""
    alive = list_actors(
        address=cluster.address, filters=[("name", "=", driver_name(str(run_dir))), ("state", "=", "ALIVE")]
    )
    return alive[0] if alive else None


def finish(process: subprocess.Popen) -> str:
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stdout[-2000:] + stderr[-4000:]
    return stdout


def assert_same_result(run_dir: Path, reference: Path) -> None:
    ours, theirs = (load_file(str(d / "adapters" / "mean" / "adapter_model.safetensors")) for d in (run_dir, reference))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    rewards = [[r.get("reward_mean") for r in read_metrics(d)] for d in (run_dir, reference)]
    assert rewards[0] == rewards[1]
