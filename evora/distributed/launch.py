"""Start (or join) Ray, run the driver actor, and stream its summaries to the console."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from evora.config.schema import RunConfig
from evora.distributed.driver import Driver, run_tag
from evora.engines.adapter_store import sweep_run_scratch
from evora.errors import EvoraError


NAMESPACE = "evora"  # named actors (evora-driver-<tag>, evora-worker-<tag>-<i>) live here


def init_ray(run: RunConfig) -> None:
    if ray.is_initialized():
        return  # a multirun's later jobs share the session
    hw = run.hardware
    options: dict[str, Any] = {"log_to_driver": run.tracking.worker_logs, "logging_level": logging.WARNING,
                               "namespace": NAMESPACE}
    # Token authentication stays on; only its every-run notice is kept off the console.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if hw.address is not None:
        ray.init(address=hw.address, **options)
    elif os.environ.get("RAY_ADDRESS"):
        ray.init(**options)  # submitted as a Ray job: join that cluster
    else:  # a private local cluster on loopback; the dashboard only when asked for
        loopback_only()
        # "local": a new Ray of its own, never a cluster someone else started on this machine.
        ray.init(address="local", include_dashboard=hw.dashboard, **options)


def loopback_only() -> None:
    """Make a local Ray advertise and bind 127.0.0.1 instead of the machine's address.

    ray.init resolves "127.0.0.1" to the routable address (so `_node_ip_address` cannot
    do it); with Ray's single-machine mode (the switch it uses on macOS and Windows) it
    picks loopback, and its gRPC servers then listen on loopback only. The variable
    reaches Ray's own processes; the constant covers this one, where Ray is imported.
    """
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def driver_name(run_dir: str) -> str:
    return f"evora-driver-{run_tag(run_dir)}"


def launch(run: RunConfig, run_dir: str, on_summary: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run the job to its end; returns the final summary."""
    if run.strategy.name == "pbt":
        from evora.tune.pbt import run_pbt

        return run_pbt(run, run_dir, on_summary)
    init_ray(run)
    here = ray.get_runtime_context().get_node_id()
    # A killed driver is restarted by Ray (max_restarts); calling `run` again resumes it from
    # its last checkpoint, so the trajectory is the one an uninterrupted run takes.
    driver = ray.remote(Driver).options(
        num_cpus=run.hardware.driver_cpus, max_restarts=run.hardware.driver_restarts, name=driver_name(run_dir),
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(run, run_dir)
    restarts = 0
    try:
        while True:
            try:
                return _stream(driver, on_summary)
            except DRIVER_LOST:
                if restarts == run.hardware.driver_restarts:
                    raise
                restarts += 1
                on_summary({"kind": "driver-restart", "restarts": restarts})
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, EvoraError):  # bad input found on the cluster (e.g. a hub model's layout)
            raise error.cause from None
        raise
    finally:
        ray.kill(driver, no_restart=True)
        sweep_run_scratch(run.engine.adapter_dir, run_tag(run_dir))


DRIVER_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


def _stream(driver: Any, on_summary: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    final: dict[str, Any] = {}
    for ref in driver.run.options(num_returns="streaming").remote():
        summary = ray.get(ref)
        on_summary(summary)
        if summary["kind"] == "final":
            final = summary
    return final
