"""Starting (or joining) Ray for a run: a private loopback-only local Ray, a cluster at
`hardware.address`, or the cluster a Ray job was submitted to."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import ray

from evora.config.schema import RunConfig

NAMESPACE = "evora"  # named actors (evora-driver-<tag>, evora-worker-<tag>-<i>) live here


def init_ray(run: RunConfig) -> None:
    if ray.is_initialized():
        return  # a multirun's later jobs share the session
    in_main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if in_main else None
    _start_ray(run)
    if callable(sigterm):
        # ray.init replaces SIGTERM's handler with its own (exit 1, or a native stack dump); the
        # caller's stays in charge (the CLI's stops the run cleanly and says how to resume).
        signal.signal(signal.SIGTERM, sigterm)


def started_here(run: RunConfig) -> bool:
    """Whether this process started the Ray it uses (a private local one), rather than joined a cluster."""
    return run.hardware.address is None and not os.environ.get("RAY_ADDRESS")


def _start_ray(run: RunConfig) -> None:
    hw = run.hardware
    options: dict[str, Any] = {
        "log_to_driver": run.tracking.worker_logs,
        "logging_level": logging.WARNING,
        "namespace": NAMESPACE,
    }
    # Token authentication stays on; only its every-run notice is kept off the console.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if hw.address is not None:
        ray.init(address=hw.address, **options)
    elif not started_here(run):
        ray.init(**options)  # submitted as a Ray job: join that cluster
    else:  # a private local cluster on loopback; the dashboard only when asked for
        loopback_only()
        # "local": a new Ray of its own, never a cluster someone else started on this machine.
        ray.init(address="local", include_dashboard=hw.dashboard, **options)


def loopback_only() -> None:
    """Make a local Ray advertise and bind 127.0.0.1 instead of the machine's address.

    ray.init resolves "127.0.0.1" to the routable address (so `_node_ip_address` cannot
    do it); with Ray's single-machine mode (the switch it uses on macOS and Windows) it
    picks loopback, and its gRPC servers then listen on loopback only. Only this process
    picks the address (ray.init reads the switch here); Ray's own processes and workers are
    given it, so no environment variable has to reach them.
    """
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
