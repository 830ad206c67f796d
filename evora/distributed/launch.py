"""Run one job: a strategy's own runner (registered as "module:function", e.g. PBT on Ray
Tune), or the shared run loop (`driver.Driver`, inside `driver_actor.DriverActor`, so that this
process imports no torch) as a restartable Ray actor whose events stream to the console."""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from evora.distributed.driver_actor import DriverActor
from evora.distributed.plan_ref import PlanRef
from evora.distributed.ray_session import NAMESPACE, init_ray, started_here
from evora.engines.adapter_store import sweep_run_scratch
from evora.errors import EvoraError
from evora.interrupts import raise_pending
from evora.plan.run_plan import RunPlan
from evora.tracking.events import Event, OnEvent
from evora.tracking.run_dir import run_tag

__all__ = ["NAMESPACE", "driver_name", "launch"]


def driver_name(run_dir: str) -> str:
    return f"evora-driver-{run_tag(run_dir)}"


def launch(plan: RunPlan, run_dir: str, on_event: OnEvent) -> Event:
    """Run the job to its end; returns the final event."""
    run = plan.run
    runner = plan.entry.run_function()
    if runner is not None:
        return runner(plan, run_dir, on_event)
    init_ray(run)
    here = ray.get_runtime_context().get_node_id()
    # A killed driver is restarted by Ray (max_restarts); calling `run` again resumes it from
    # its last checkpoint, so the trajectory is the one an uninterrupted run takes. The plan (its
    # task splits can be large) goes to each `run` by a reference this process owns.
    plan_ref = PlanRef(ray.put(plan))
    driver: Any = (  # an actor handle
        ray.remote(DriverActor)
        .options(
            num_cpus=run.hardware.driver_cpus,
            num_gpus=run.hardware.driver_gpus,
            max_restarts=run.hardware.driver_restarts,
            name=driver_name(run_dir),
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
        )
        .remote(run_dir)
    )
    restarts = 0
    try:
        while True:
            try:
                return _stream(driver, plan_ref, on_event)
            except DRIVER_LOST as error:
                if not _driver_itself(error) or restarts == run.hardware.driver_restarts:
                    raise
                # One loss is one restart: wait until Ray has restarted the actor, or calls made
                # while it restarts fail at once and would use up every restart for one loss.
                _await_ready(driver)
                restarts += 1
                on_event({"kind": "driver-restart", "restarts": restarts})
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, EvoraError):  # bad input found on the cluster (e.g. a hub model's layout)
            raise error.cause from None
        raise
    except BaseException:  # Ctrl-C, SIGTERM or a failure: the generation under way is abandoned, its checkpoint stays
        if started_here(run):
            _stop_now(driver, run_tag(run_dir))
            ray.shutdown()  # our own Ray: its processes go now, so none writes scratch after the sweep below
        raise
    finally:
        # Actors gone before the scratch sweep, and (on a joined cluster) before the next job asks for their CPUs/GPUs.
        if ray.is_initialized():
            _stop_now(driver, run_tag(run_dir))
        sweep_run_scratch(run.engine.adapter_dir, run_tag(run_dir))


def _stop_now(driver: Any, tag: str) -> None:
    """Kill the driver and its engine workers, and return once they are gone (so no worker
    writes a scratch folder after the sweep)."""
    actors = [driver]
    for name in ray.util.list_named_actors():
        if name.startswith(f"evora-worker-{tag}-"):
            try:
                actors.append(ray.get_actor(name))
            except ValueError:  # gone already
                pass
    for actor in actors:
        ray.kill(actor, no_restart=True)
    for actor in actors:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=STOP_TIMEOUT_S)
        except (*DRIVER_LOST, ray.exceptions.GetTimeoutError):
            pass  # dead, as asked (or unreachable: the cluster reaps it)


DRIVER_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


def _driver_itself(error: Exception) -> bool:
    """The driver actor was lost, not a worker inside its task (that error is a RayTaskError
    that is also a RayActorError by type): only the first is restarted."""
    return not isinstance(error, ray.exceptions.RayTaskError)


RESTART_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0


def _await_ready(driver: Any) -> None:
    """Returns once the (restarted) driver actor answers; raises if it died for good
    (RayActorError) or did not come back within RESTART_TIMEOUT_S."""
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while True:
        try:
            ray.get(driver.__ray_ready__.remote(), timeout=max(deadline - time.monotonic(), 1.0))
            return
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # refused while restarting: ask again shortly (a poll, bounded by the deadline)


EVENT_POLL_S = 1.0  # how often the wait on the driver's next event looks for an interrupt it swallowed


def _stream(driver: Any, plan_ref: PlanRef, on_event: OnEvent) -> Event:
    """The driver's events, each to on_event, until its last; the wait for each is cut into
    polls, so SIGTERM or Ctrl-C that lands while a generation waits long (on a judge, say)
    stops the run within a poll even where Ray's call swallowed the signal."""
    final: Event = {}
    events = driver.run.options(num_returns="streaming").remote(plan_ref)
    while True:
        while not ray.wait([events], timeout=EVENT_POLL_S)[0]:
            raise_pending()
        try:
            ref = next(events)
        except StopIteration:
            return final
        event = ray.get(ref)
        on_event(event)
        if event["kind"] == "final":
            final = event
