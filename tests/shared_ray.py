"""One Ray head per test process that the CLI runs of the suite join, as runs join a cluster a user
started (`RAY_ADDRESS`), so that a run pays no Ray start and stop of its own: a third of a tiny
run's CPU on this machine. Runs whose test is about a private Ray (its start, its folders, its
shutdown on a signal) start their own, as a user's plain `evora` does (conftest.run_evora)."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 300.0  # a failure guard: the suite's first minutes start three heads beside three test processes
STOP_TIMEOUT_S = 20.0
RAY = Path(sys.executable).with_name("ray")


class HeadDidNotStart(RuntimeError):
    """`ray start` gave up or did not say it was up in time; the message ends with its log."""


class SharedHead:
    """A `ray start --head --block` of this process's own, on loopback, with the defaults a CLI's
    private Ray takes (its CPUs, memory and GPUs as detected) and no dashboard; stopped with the
    process. Token authentication as the SLURM script sets it up: one token, given to every run."""

    def __init__(self, environ: dict[str, str], port: int) -> None:
        self.address = f"127.0.0.1:{port}"
        self.environ = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_ADDRESS": self.address}
        command = [str(RAY), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}"]
        command += ["--include-dashboard=false", "--disable-usage-stats"]
        # No log monitor: runs keep workers' logs off the console (tracking.worker_logs=false), and
        # it globs the session's log folder ten times a second, a folder that grows by every run's
        # workers through the suite (4% of the suite's CPU over its first 45 minutes here, and rising).
        command += ["--include-log-monitor=false"]
        self.log = Path(tempfile.mkdtemp(prefix="evora-shared-ray-")) / "head.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command,
                env={**environ, **self.environ},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group of its own: stopped as one; a test's signals miss it
            )
        atexit.register(self.stop)
        self._await_started()

    def _await_started(self) -> None:
        """Returns once `ray start --block` says the node is up (it then blocks, printing nothing)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self.log.read_text()[-3000:]  # read before stop() removes its folder
                self.stop()
                raise HeadDidNotStart(f"the suite's shared Ray head did not start: {log}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # `--block` stops the node's processes on SIGTERM
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever of the group outlived it
        except ProcessLookupError:
            pass
        self.process.wait()
        shutil.rmtree(self.log.parent, ignore_errors=True)
