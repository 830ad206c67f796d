"""launch/slurm.sbatch on a real SLURM (Debian's slurm-wlm with munge, which `make test`
installs where apt-get runs as root): munged, slurmctld and slurmd started for the module from a
slurm.conf of their own, on free ports; one node, and two nodes, each a slurmd in a network
namespace of its own. The batch script starts a Ray head as a job step (and a Ray worker on each
other node), runs evora on it and ends; a job cancelled with scancel mid-run leaves a run that
`resume=<run>` through the same script finishes, every generation logged once, beside a second
job on the same node; a run on two nodes has an engine worker on each. The one-node cluster's node
has 8 GPUs as SLURM sees them (files standing in for their devices: enough to place a GPU job and
to check its options, not to run on), for the GPU example, launch/slurm_gpu.sbatch."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import ENGINE_ENVIRONMENT, SMALL, free_port, only_run_dir
from evora.tracking.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "launch" / "slurm.sbatch"
GPU_EXAMPLE = ROOT / "launch" / "slurm_gpu.sbatch"
GPUS = 8  # the one-node cluster's, as SLURM counts them
BIN = Path(sys.executable).parent  # evora and ray beside this Python
# engine=hf: the batch script, Ray's start on SLURM and resume are the point, not the engine.
RUN = (
    "hardware=multinode_cpu",
    "hardware.num_workers=1",
    "tracking.progress=false",
    "engine=hf",
    "+experiment=quickstart/es",
    *SMALL,
)


def slurm_conf(folder: Path, controller: str, nodes: list[tuple[str, str | None]], gpus: int) -> str:
    """Job ids start at random: folders named by another session's job ids (which a failed run
    may have left on this machine) are not this session's. `nodes`: (name, address or None)."""
    node_lines = "\n".join(
        f"NodeName={name}"
        + (f" NodeAddr={address}" if address else "")
        + f" CPUs={os.cpu_count()} RealMemory=1000"
        + (f" Gres=gpu:{gpus}" if gpus else "")
        + " State=UNKNOWN"
        for name, address in nodes
    )
    return f"""ClusterName=evora-test
GresTypes=gpu
FirstJobId={random.randrange(10**5, 10**7)}
SlurmctldHost={controller}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
CredType=cred/munge
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
KillWait=10
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def require_slurm() -> None:
    if shutil.which("sbatch") is None:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            pytest.fail("SLURM is not installed: `make slurm` (part of `make test`) installs slurm-wlm and munge")
        pytest.skip("SLURM is not installed, and this machine has no apt-get as root to install it")


def start_cluster(
    folder: Path, controller: str, nodes: list[tuple[str, str | None]], slurmd: list[list[str]], gpus: int = 0
) -> dict:
    """munged, slurmctld and a slurmd per node (`slurmd`: each one's command, before its
    options) for a cluster of its own in `folder`, each node with `gpus` GPUs as SLURM sees them
    (slurmd lists a GPU only with a device file: empty files stand in); the environment a SLURM
    client needs."""
    (folder / "state").mkdir()
    for name, _ in nodes:
        (folder / f"spool-{name}").mkdir()
    for index in range(gpus):
        (folder / f"gpu{index}").touch()
    gres = [f"NodeName={name} Name=gpu File={folder}/gpu[0-{gpus - 1}]" for name, _ in nodes if gpus]
    (folder / "gres.conf").write_text("".join(f"{line}\n" for line in gres))
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    munge = ["--force", f"--key-file={key}", f"--socket={folder}/munge.socket", f"--pid-file={folder}/munged.pid"]
    subprocess.run(["munged", *munge, f"--log-file={folder}/munged.log", f"--seed-file={folder}/seed"], check=True)
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, controller, nodes, gpus))
    # What a user's shell has: not the engine environment this test process set for its own engines.
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENVIRONMENT}
    env["SLURM_CONF"] = str(conf)
    subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env)
    for command, (name, _) in zip(slurmd, nodes):
        subprocess.run([*command, "-f", str(conf), "-N", name], check=True, env=env)
    # Until a slurmd registers, its node's configuration is unknown and `sbatch --test-only`
    # refuses any job that needs one ("Requested node configuration is not available").
    wait_until(lambda: node_states(env) == ["idle"] * len(nodes), "every node's slurmd to register", 120)
    return env


def node_states(env: dict) -> list[str]:
    listed = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True)
    return listed.stdout.split()


def stop_cluster(folder: Path, env: dict) -> None:
    subprocess.run(["scancel", "--user=root"], env=env)
    for pid in [*folder.glob("slurmd-*.pid"), folder / "slurmctld.pid", folder / "munged.pid"]:
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()])


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment a SLURM client needs to reach this module's one-node cluster."""
    require_slurm()
    folder, host = tmp_path_factory.mktemp("slurm"), socket.gethostname()
    env = start_cluster(folder, host, [(host, None)], [["slurmd"]], gpus=GPUS)
    yield env
    stop_cluster(folder, env)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A two-node cluster on this machine: each slurmd in a network namespace of its own (its
    own address, on a bridge to the controller's), so each node's Ray binds and reaches the
    other's as on two hosts. Yields (the client's environment, each node's namespace inode)."""
    require_slurm()
    assert os.geteuid() == 0, "network namespaces need root"
    folder, tag = tmp_path_factory.mktemp("slurm2"), os.getpid() % 100000
    subnet, bridge = f"10.{tag % 200 + 20}.{tag // 200 % 250}", f"evbr{tag}"
    names = [f"evn{tag}a", f"evn{tag}b"]

    def ip(*args: str, namespace: str | None = None) -> None:
        subprocess.run([*(["ip", "netns", "exec", namespace] if namespace else []), "ip", *args], check=True)

    ip("link", "add", bridge, "type", "bridge")
    ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
    ip("link", "set", bridge, "up")
    nodes = []
    for index, name in enumerate(names):
        outside, inside = f"{name}o", f"{name}i"
        ip("netns", "add", name)
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", name)
        ip("link", "set", outside, "master", bridge)
        ip("link", "set", outside, "up")
        address = f"{subnet}.{11 + index}"
        ip("addr", "add", f"{address}/24", "dev", inside, namespace=name)
        ip("link", "set", inside, "up", namespace=name)
        ip("link", "set", "lo", "up", namespace=name)
        nodes.append((name, address))
    # nsenter, not `ip netns exec`: that remounts /sys, where slurmd looks for its cgroups.
    slurmd = [["nsenter", f"--net=/var/run/netns/{name}", "slurmd"] for name in names]
    try:
        env = start_cluster(folder, f"{socket.gethostname()}({subnet}.1)", nodes, slurmd)
        yield env, {name: os.stat(f"/var/run/netns/{name}").st_ino for name in names}
        stop_cluster(folder, env)
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "delete", name])
        subprocess.run(["ip", "link", "delete", bridge])


def sbatch(env: dict, out: Path, *overrides: str, wait: bool, nodes: int = 1) -> subprocess.CompletedProcess:
    """The batch script on `nodes` nodes, its output in out/job.log; with `wait`, until the job ends.
    Ports, Ray's temp folder and the scratch folder are the script's own choice per job (its
    temp folder also keeps a plain ray.init() of another test from joining the job's cluster)."""
    job_env = {**env, "EVORA": str(BIN / "evora")}
    command = ["sbatch", "--parsable", f"--nodes={nodes}", f"--output={out}/job.log", f"--chdir={out}"]
    command += ["--wait"] * wait + [str(SCRIPT), *overrides]
    return subprocess.run(command, env=job_env, capture_output=True, text=True, timeout=900)


def job_listed(env: dict, job: str) -> bool:
    """Whether squeue still lists the job (pending, running or completing: its processes alive)."""
    listed = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True)
    return bool(listed.stdout.strip())


def wait_until(condition, what: str, limit_s: float = 600) -> None:
    """Polls observable state (a file, the job's state) until `condition()` holds."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_the_gpu_example_is_a_valid_job_that_runs_the_batch_script_of_the_checkout(slurm, tmp_path):
    """launch/slurm_gpu.sbatch parses, and SLURM takes its #SBATCH options (whole nodes of 8 GPUs,
    all their memory, a time limit) for a job it could start here, while 9 GPUs a node it could not.
    Run as SLURM runs a batch script (a copy in slurmd's spool), it finds the checkout and its venv
    and hands launch/slurm.sbatch its default, hardware=gpu on one node, which stops in one line,
    before Ray starts, where the job's steps get no GPU (--exclusive, none asked for); a venv that
    is not there is one line too."""
    assert subprocess.run(["bash", "-n", str(GPU_EXAMPLE)]).returncode == 0
    taken = subprocess.run(["sbatch", "--test-only", str(GPU_EXAMPLE)], env=slurm, capture_output=True, text=True)
    assert taken.returncode == 0 and "to start at" in taken.stderr, taken.stderr
    too_many = ["sbatch", "--test-only", f"--gpus-per-node={GPUS + 1}", str(GPU_EXAMPLE)]
    assert subprocess.run(too_many, env=slurm, capture_output=True).returncode != 0

    def job(venv: Path, *flags: str) -> tuple[int, str]:
        log = tmp_path / f"job-{venv.name}.log"
        command = ["sbatch", "--wait", f"--output={log}", f"--chdir={tmp_path}", *flags, str(GPU_EXAMPLE)]
        ended = subprocess.run(command, env={**slurm, "EVORA_VENV": str(venv)}, cwd=ROOT, timeout=300)
        return ended.returncode, log.read_text()

    code, log = job(BIN.parent, "--gpus-per-node=0")
    assert code == 2 and "evora: error: hardware=gpu: the job has no GPUs" in log, log[-3000:]
    assert "Ray head" not in log
    code, log = job(tmp_path / "nowhere")
    assert code == 2 and "evora: error: EVORA_HOME=" in log and "nowhere" in log, log[-3000:]


def test_a_run_cancelled_mid_run_resumes_through_the_script_and_finishes_in_its_run_folder(slurm, tmp_path):
    """A second job on the same node at the same time as the resumed one (each with its own Ray
    ports, temp and scratch folders) runs to its end beside it; neither a cancelled job nor a
    finished one leaves its scratch or Ray folder behind."""
    runs = tmp_path / "runs"
    submitted = sbatch(slurm, tmp_path, *RUN, "generations=10", f"tracking.out_dir={runs}", wait=False)
    job = submitted.stdout.strip().split(";")[0]
    assert submitted.returncode == 0 and job, submitted.stderr

    def logged_two() -> bool:
        found = list(runs.glob("*/metrics.jsonl")) if runs.exists() else []
        return bool(found) and len(read_metrics(found[0].parent)) >= 3  # generations 0, 1 and 2

    wait_until(logged_two, "generation 2")
    subprocess.run(["scancel", job], env=slurm, check=True)
    wait_until(lambda: not job_listed(slurm, job), "the cancelled job's end")
    run_dir = only_run_dir(runs)
    assert (run_dir / "checkpoints" / "latest.pt").is_file()
    assert len(read_metrics(run_dir)) < 11  # stopped before the end
    assert not Path(f"/dev/shm/evora-job-{job}").exists() and not Path(f"/tmp/ray-evora-{job}").exists()
    resumed = sbatch(slurm, tmp_path, f"resume={run_dir}", wait=False)
    resumed_job = resumed.stdout.strip().split(";")[0]
    beside = tmp_path / "beside"
    beside.mkdir()
    other = sbatch(slurm, beside, *RUN, "generations=1", f"tracking.out_dir={beside / 'runs'}", wait=True)
    assert other.returncode == 0, (beside / "job.log").read_text()[-4000:]
    other_job = other.stdout.strip().split(";")[0]
    assert (only_run_dir(beside / "runs") / "eval" / "summary.json").is_file()
    assert not Path(f"/dev/shm/evora-job-{other_job}").exists() and not Path(f"/tmp/ray-evora-{other_job}").exists()
    wait_until(lambda: not job_listed(slurm, resumed_job), "the resumed job's end")
    for gone in (job, resumed_job):  # the resumed run used its own job's scratch, not the first's
        assert not Path(f"/dev/shm/evora-job-{gone}").exists() and not Path(f"/tmp/ray-evora-{gone}").exists()
    log = (tmp_path / "job.log").read_text()
    assert "evora: error" not in log, log[-4000:]
    assert "evora on SLURM job" in log and "Ray head" in log
    assert [r["generation"] for r in read_metrics(run_dir)] == list(range(11))
    assert json.loads((run_dir / "eval" / "summary.json").read_text())["generations"] == 10
    assert (run_dir / "adapters" / "best" / "README.md").is_file()


def engine_workers_by_namespace(namespaces: dict[str, int]) -> set[str]:
    """The namespaces (of `namespaces`) in which an engine worker runs now."""
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        try:
            if " ".join(process.info["cmdline"] or []).startswith("ray::EngineWorker"):
                inode = os.stat(f"/proc/{process.pid}/ns/net").st_ino
                found |= {name for name, node in namespaces.items() if node == inode}
        except (psutil.Error, OSError):
            pass
    return found


def test_a_run_spans_two_nodes_with_a_worker_on_each(two_nodes, tmp_path):
    """Two SLURM nodes, each its own network: the script starts the Ray head on the first at the
    address SLURM has for it, a Ray worker on the second, and the run's two engine workers are
    spread one to a node (seen in their processes' network namespaces); it ends in its folder,
    and no scratch or Ray folder of the job is left."""
    env, namespaces = two_nodes
    runs = tmp_path / "runs"
    args = ("hardware=multinode_cpu", "hardware.num_workers=2", *RUN[2:], "generations=3")
    args += (f"tracking.out_dir={runs}",)
    submitted = sbatch(env, tmp_path, *args, wait=False, nodes=2)
    job = submitted.stdout.strip().split(";")[0]
    assert submitted.returncode == 0 and job, submitted.stderr
    seen: set[str] = set()

    def ended() -> bool:
        seen.update(engine_workers_by_namespace(namespaces))
        return not job_listed(env, job)

    wait_until(ended, "the two-node job's end")
    log = (tmp_path / "job.log").read_text()
    assert "evora: error" not in log, log[-4000:]
    assert seen == set(namespaces), (seen, log[-3000:])
    run_dir = only_run_dir(runs)
    assert [r["generation"] for r in read_metrics(run_dir)] == list(range(4))
    assert (run_dir / "eval" / "summary.json").is_file()
    assert not Path(f"/dev/shm/evora-job-{job}").exists() and not Path(f"/tmp/ray-evora-{job}").exists()
