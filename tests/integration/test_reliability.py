"""Reliability through the real CLI: hostile user rewards are bounded and counted, a diverging
update stops in one line, bad input found after Ray starts is one line with the right exit
code (tracebacks in the run's cli.log), and Ctrl-C / SIGTERM stop at once, leave no process
and no scratch folder behind, and resume to the uninterrupted result bit for bit."""

from __future__ import annotations

import contextlib
import math
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT, SMALL, cli_run, evora_cmd, only_run_dir, run_evora
from evora.tracking.metrics import read_metrics
from evora.tracking.run_dir import run_tag

pytestmark = pytest.mark.slow

TESTS = str(ROOT / "tests")


def one_error_line(result: subprocess.CompletedProcess, code: int, *parts: str) -> str:
    """The run ended with `code` and one `evora: error:` line holding `parts`; no traceback."""
    console = result.stdout + result.stderr
    assert result.returncode == code, console[-4000:]
    assert "Traceback" not in console, console[-4000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("evora: error:")]
    assert len(errors) == 1, result.stderr[-4000:]
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


def fresh_out() -> Path:
    return Path(tempfile.mkdtemp(prefix="evora-test-"))


# --- user rewards -----------------------------------------------------------------------------


def test_hostile_user_rewards_are_bounded_counted_and_the_run_finishes():
    out = fresh_out()
    result = run_evora(
        [
            "+experiment=quickstart/es",
            *SMALL,
            "generations=2",
            "engine=hf",
            "task.reward=hostile_rewards:mixed",  # sleeps forever, segfaults, os._exit(1), eats memory
            "task.reward_timeout_s=1",
            "task.reward_memory_mb=512",
            f"tracking.out_dir={out}",
        ],
        cwd=out,
        env={"PYTHONPATH": TESTS},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    run_dir = only_run_dir(out)
    records = [r for r in read_metrics(run_dir) if r["generation"] > 0]
    assert sum(r["reward_timeouts"] for r in records) > 0
    assert sum(r["reward_errors"] for r in records) > 0  # the crashes, exits and MemoryErrors
    # task.reward_penalty is null: every failed reward's cell is left out of the fitness, and counted
    failures = sum(r["reward_errors"] + r["reward_timeouts"] for r in records)
    assert sum(r["reward_failed"] for r in records) == failures
    assert all(math.isfinite(r["reward_mean"]) for r in records)
    assert [r["workers"] for r in records] == [2, 2]  # no engine worker lost
    assert sum(r["workers_lost"] for r in records) == 0
    assert all(r["reward_mean"] > 0 for r in records)  # the fair examples are still scored
    assert "held-out reward: base model" in result.stdout
    assert (run_dir / "eval" / "summary.json").is_file()


def test_a_reward_that_always_times_out_stops_the_run_naming_the_reward_and_its_deadline():
    """Every reward of the base model's held-out evaluation passes its deadline: the run stops there,
    before any search, naming the reward and task.reward_timeout_s, not the strategy's settings."""
    out = fresh_out()
    reward = "hostile_rewards:sleeps_forever"
    args = ["+experiment=quickstart/es", "engine=hf", "hardware.num_workers=1", "generations=1", "task.eval_size=2"]
    args += [f"task.reward={reward}", "task.reward_timeout_s=1", f"tracking.out_dir={out}"]
    # A Ray of its own, as the hostile rewards above: the shared head's workers do not import from tests/
    result = run_evora(args, cwd=out, env={"PYTHONPATH": TESTS})
    stopped = f"heldout evaluation after generation 0: all 4 rewards from task.reward={reward} failed (4 timeouts)"
    line = one_error_line(result, 1, stopped)
    assert "task.reward_timeout_s=1, each call's deadline" in line and "strategy." not in line
    assert "held-out reward: base model" not in result.stdout  # stopped before the start event
    run_dir = only_run_dir(out)
    assert not read_metrics(run_dir) and not (run_dir / "checkpoints" / "latest.pt").exists()


# --- non-finite numbers ---------------------------------------------------------------------


def test_a_diverging_update_stops_in_one_line_before_its_checkpoint():
    out = fresh_out()  # an lr that overflows float32 on the first update
    result = run_evora(
        [
            "+experiment=quickstart/es",
            *SMALL,
            "generations=3",
            "engine=hf",
            "hardware.num_workers=1",  # the driver's check is the point: one engine process
            "strategy.lr=1e300",
            f"tracking.out_dir={out}",
        ],
        cwd=out,
    )
    line = one_error_line(result, 1, "generation 1: the update made", "non-finite", "strategy.lr=1e+300")
    assert "strategy.sigma=" in line
    run_dir = only_run_dir(out)
    assert not (run_dir / "checkpoints" / "latest.pt").exists()  # the broken generation was not saved
    assert "RunError" in (run_dir / "cli.log").read_text()


# --- one-line errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "code", "parts"),
    [
        (["strategy.sigma=inf"], 2, ["strategy.sigma=inf: must be a finite number"]),
        (["tracking.out_dir=/proc/forbidden"], 2, ['tracking.out_dir="/proc/forbidden": cannot write in /proc']),
        (
            ["hardware.num_workers=2", "hardware.cpus_per_worker=32"],
            2,
            ["hardware.num_workers=2:", "need 64 CPUs but the Ray cluster has"],
        ),
        (["hardware=gpu", "engine=hf"], 2, ["hardware.gpus_per_worker=1: the Ray cluster has no GPUs"]),
        (
            ["model.path=Qwen/Qwen2.5-0.5B-Instruct", "engine=hf"],
            2,
            ['model.path="Qwen/Qwen2.5-0.5B-Instruct": not in the Hugging Face cache', "HF_HUB_OFFLINE=1"],
        ),
    ],
    ids=["inf", "unwritable-out-dir", "capacity", "no-gpus", "hub-offline"],
)
def test_bad_input_after_ray_starts_too_is_one_line(overrides, code, parts):
    out = fresh_out()
    args = [*overrides, "generations=1"]
    if not any(o.startswith("tracking.out_dir") for o in overrides):
        args.append(f"tracking.out_dir={out}")
    result = run_evora(args, cwd=out, env={"HF_HUB_OFFLINE": "1"})
    one_error_line(result, code, *parts)


@pytest.mark.parametrize("command", [["doctor"], ["eval", "adapter=base"]], ids=["doctor", "eval"])
def test_an_uncached_hub_model_offline_is_one_line_in_seconds(command, tmp_path):
    """Not transformers' half a minute of retries and its traceback: the cache is looked up, and
    HF_HUB_OFFLINE=1 says the hub will not be asked."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    started = time.monotonic()
    result = run_evora([*command, "model.path=Qwen/Qwen2.5-14B-Instruct"], cwd=tmp_path, env=env)  # no bundled snapshot
    seconds = time.monotonic() - started
    one_error_line(
        result, 2, 'model.path="Qwen/Qwen2.5-14B-Instruct": not in the Hugging Face cache', "HF_HUB_OFFLINE=1"
    )
    assert seconds < 20, seconds  # 7-9 s here beside a running suite, mostly imports; the retries took 26 s and more


def test_vllm_not_installed_is_one_line_before_ray():
    blocked = "import sys; sys.modules['vllm'] = None; from evora.cli import main; main(sys.argv[1:])"
    out = fresh_out()
    result = subprocess.run(
        [sys.executable, "-c", blocked, "engine=vllm", f"tracking.out_dir={out}"],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=300,
    )
    one_error_line(result, 2, 'engine="vllm": vllm is not installed here', "engine=hf")
    assert list(out.iterdir()) == []  # nothing started


# --- interrupts -------------------------------------------------------------------------------

# Six generations: the interrupt after the first must land well before the run would end.
INTERRUPTED_RUN = ("+experiment=quickstart/es", *SMALL, "generations=10", "engine=hf", "hardware.num_workers=2")
# The interrupted runs are niced: on a loaded machine the test that reads their output must not
# fall so far behind that the run has finished before the test sees generation 1 and interrupts.
NICE = 10


def as_from_a_shell() -> None:
    """The state a shell starts a command in (whatever the test process inherited: ignored
    or blocked signals survive exec), niced."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.nice(NICE)


class Terminal:
    """The CLI on a pseudo-terminal, as a user runs it: Ctrl-C is the terminal's ^C."""

    def __init__(self, args: list[str], cwd: Path):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become the CLI
            as_from_a_shell()
            os.chdir(cwd)
            os.execv(sys.executable, evora_cmd(*args))
        self.output = ""

    def read_until(self, pattern: str, timeout: float = 600) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            ready, _, _ = select.select([self.fd], [], [], 1.0)
            if ready:
                chunk = self._read()
                assert chunk is not None, f"the run ended before {pattern!r}:\n{self.output[-3000:]}"
                self.output += chunk
        raise AssertionError(f"timed out waiting for {pattern!r}:\n{self.output[-3000:]}")

    def _read(self) -> str | None:
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return None
        return data.decode(errors="replace") if data else None

    def wait(self) -> int:
        while (chunk := self._read()) is not None:
            self.output += chunk
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)


def process_tree(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def assert_nothing_left(tree: list[psutil.Process], run_dir: Path) -> None:
    _, alive = psutil.wait_procs(tree, timeout=60)
    assert not alive, [(p.pid, p.name()) for p in alive]
    assert not list(Path("/dev/shm").glob(f"evora-{run_tag(run_dir)}-*"))
    assert not (run_dir / "run.lock").exists()


def test_ctrl_c_stops_at_once_leaves_nothing_and_resume_gives_the_uninterrupted_result():
    reference, _ = cli_run(*INTERRUPTED_RUN)
    out = fresh_out()
    terminal = Terminal([*INTERRUPTED_RUN, f"tracking.out_dir={out}"], out)
    terminal.read_until(r"gen\s+1/10")  # generation 1 is checkpointed; 2 is under way
    tree = process_tree(terminal.pid)
    assert len(tree) > 3  # Ray's processes and the engine workers
    # What the terminal's ^C does: SIGINT to the foreground process group, the CLI's (its session's
    # leader). Sent directly: under a loaded xdist run a ^C written to the pty was seen not to arrive.
    os.killpg(os.getpgid(terminal.pid), signal.SIGINT)
    code = terminal.wait()
    run_dir = only_run_dir(out)
    assert code == 130, terminal.output[-3000:]
    assert "Traceback" not in terminal.output
    found = re.search(r"evora: interrupted after generation (\d); resume: evora resume=(\S+)", terminal.output)
    assert found and found.group(2) == str(run_dir), terminal.output[-3000:]
    assert_nothing_left(tree, run_dir)

    resumed = run_evora([f"resume={run_dir}"], cwd=out)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-4000:]
    assert f"resumed at generation {found.group(1)}" in resumed.stdout
    ours, theirs = (load_file(str(d / "adapters" / "mean" / "adapter_model.safetensors")) for d in (run_dir, reference))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert [r["reward_mean"] for r in read_metrics(run_dir)[1:]] == [
        r["reward_mean"] for r in read_metrics(reference)[1:]
    ]


def test_sigterm_stops_with_143_and_the_resume_line():
    out = fresh_out()
    args = [*INTERRUPTED_RUN, f"tracking.out_dir={out}", "tracking.progress=false"]
    process = subprocess.Popen(
        evora_cmd(*args),
        cwd=out,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_shell,
    )
    run_dir = None
    deadline = time.monotonic() + 600
    while run_dir is None and time.monotonic() < deadline:  # wait for the first generation's line
        line = process.stdout.readline()
        assert line, process.stderr.read()[-3000:]
        if re.match(r"gen\s+1/10", line):
            run_dir = only_run_dir(out)
    tree = process_tree(process.pid)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    assert "SIGTERM received" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert re.search(rf"evora: interrupted after generation \d; resume: evora resume={re.escape(str(run_dir))}", stderr)
    assert_nothing_left(tree, run_dir)


# --- a worker killed for memory ------------------------------------------------------------------

CGROUP_V1, CGROUP_V2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int):
    """A memory cgroup of its own (v1's memory controller, else v2's where it has one); yields
    the file a process is moved in by."""
    if (CGROUP_V1 / "memory.limit_in_bytes").exists():
        root, limit_file = CGROUP_V1, "memory.limit_in_bytes"
    else:
        controllers = CGROUP_V2 / "cgroup.controllers"
        assert controllers.exists() and "memory" in controllers.read_text().split(), "no memory cgroup here"
        root, limit_file = CGROUP_V2, "memory.max"
    assert os.access(root, os.W_OK), f"{root} is not writable (run as root)"
    group = root / f"evora-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / limit_file).write_text(str(limit_bytes))
        yield group / "cgroup.procs"
    finally:
        deadline = time.monotonic() + 60
        while group.exists():  # removable once its process is gone
            try:
                group.rmdir()
            except OSError:
                assert time.monotonic() < deadline, f"{group} still holds a process"
                time.sleep(0.5)


def test_a_worker_killed_for_memory_stops_the_run_in_one_line_instead_of_being_replaced():
    """The kernel's OOM killer, for real: once generation 1 is logged, the engine worker is moved
    into a memory cgroup of 1 MiB, and its next allocation has it killed. A replacement would
    die alike: the run stops (exit 1) in one line naming the killer, its checkpoint kept."""
    out = fresh_out()
    args = [
        "+experiment=quickstart/es",
        *SMALL,
        "engine=hf",
        "hardware.num_workers=1",
        "generations=10",
        f"tracking.out_dir={out}",
    ]
    process = subprocess.Popen(
        evora_cmd(*args, "tracking.progress=false"), cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # until generation 1's line
        line = process.stdout.readline()
        assert line, process.stderr.read()[-3000:]
        if re.match(r"gen\s+1/10", line):
            break
    [worker] = [p for p in process_tree(process.pid) if " ".join(p.cmdline()).startswith("ray::EngineWorker")]
    with memory_cgroup(2**20) as procs:
        procs.write_text(str(worker.pid))
        stdout, stderr = process.communicate(timeout=300)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    one_error_line(result, 1, "engine worker 0 was killed for memory (the kernel's OOM killer)", "evora doctor")
    run_dir = only_run_dir(out)
    assert (run_dir / "checkpoints" / "latest.pt").is_file()
    assert not any(r.get("workers_replaced") for r in read_metrics(run_dir))
