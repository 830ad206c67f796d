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


def init_ray(run: RunConfig) -> None:
    if ray.is_initialized():
        return  # a multirun's later jobs share the session
    hw = run.hardware
    options: dict[str, Any] = {"include_dashboard": hw.dashboard, "log_to_driver": run.tracking.worker_logs,
                               "logging_level": logging.WARNING}
    # Token authentication stays on; only its every-run notice is kept off the console.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if hw.address is not None:
        ray.init(address=hw.address, **options)
    elif os.environ.get("RAY_ADDRESS"):
        ray.init(**options)  # submitted as a Ray job: join that cluster
    else:
        ray.init(_node_ip_address="127.0.0.1", **options)  # a private local cluster on loopback


def launch(run: RunConfig, run_dir: str, on_summary: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run the job to its end; returns the final summary."""
    if run.strategy.name == "pbt":
        from evora.tune.pbt import run_pbt

        return run_pbt(run, run_dir, on_summary)
    init_ray(run)
    here = ray.get_runtime_context().get_node_id()
    driver = ray.remote(Driver).options(
        num_cpus=run.hardware.driver_cpus, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(run, run_dir)
    final: dict[str, Any] = {}
    try:
        for ref in driver.run.options(num_returns="streaming").remote():
            summary = ray.get(ref)
            on_summary(summary)
            if summary["kind"] == "final":
                final = summary
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, EvoraError):  # bad input found on the cluster (e.g. a hub model's layout)
            raise error.cause from None
        raise
    finally:
        ray.kill(driver)
        sweep_run_scratch(run.engine.adapter_dir, run_tag(run_dir))
    return final
