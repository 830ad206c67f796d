"""The worker pool: places EngineWorker actors and spreads work units over them.

Units go to whichever worker is free next. Which worker runs a unit never changes its
result: a unit is always the same candidates and prompts in one `generate` call, and
units have a fixed size (engine.max_loras), so 1 or N workers give the same numbers.
A unit whose worker dies is run again on another worker.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from evora.config.schema import HardwareConfig
from evora.distributed.worker import EngineWorker, UnitResult, WorkerSpec, WorkUnit

WORKER_FAILURES = (RayActorError, ActorDiedError, ActorUnavailableError)


def worker_count(hw: HardwareConfig) -> int:
    if hw.num_workers is not None:
        return hw.num_workers
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus < hw.gpus_per_worker:
        raise RuntimeError(f"hardware.num_workers=null needs GPUs, but the Ray cluster has {gpus}; "
                           "set hardware.num_workers or use hardware=cpu")
    return gpus // hw.gpus_per_worker


def check_capacity(hw: HardwareConfig, workers: int) -> None:
    """Fail at once, not hang, when the cluster cannot place every worker."""
    have = ray.cluster_resources()
    for resource, each, extra in (("CPU", hw.cpus_per_worker, hw.driver_cpus), ("GPU", hw.gpus_per_worker, 0)):
        need = workers * each + extra
        if need > have.get(resource, 0) + 1e-9:
            raise RuntimeError(f"hardware: {workers} worker(s) x {each} {resource} (+ {extra} for the driver) need "
                               f"{need:g} {resource}s but the Ray cluster has {have.get(resource, 0):g}; lower "
                               "hardware.num_workers or hardware.cpus_per_worker")


def actor_options(hw: HardwareConfig) -> dict[str, Any]:
    options: dict[str, Any] = {"num_cpus": hw.cpus_per_worker, "max_restarts": 0}
    if hw.gpus_per_worker > 0:
        options["num_gpus"] = hw.gpus_per_worker
    if hw.name == "multinode":
        options["scheduling_strategy"] = "SPREAD"
    return options


class WorkerPool:
    def __init__(self, actors: list[Any], infos: list[dict[str, Any]]):
        self.actors = actors
        self.infos = infos
        self.alive = set(range(len(actors)))

    @classmethod
    def start(cls, spec: WorkerSpec) -> "WorkerPool":
        hw = spec.run.hardware
        count = worker_count(hw)
        check_capacity(hw, count)
        remote_worker = ray.remote(EngineWorker).options(**actor_options(hw))
        actors = [remote_worker.remote(spec, i) for i in range(count)]
        infos = ray.get([a.info.remote() for a in actors])
        return cls(actors, infos)

    def __len__(self) -> int:
        return len(self.alive)

    def run(self, payload: Any, units: list[WorkUnit], max_attempts: int = 3) -> list[UnitResult]:
        """Results in unit order. `payload` should be an ObjectRef: put once, read by all."""
        pending = deque((i, 0) for i in range(len(units)))
        idle = deque(sorted(self.alive))
        in_flight: dict[Any, tuple[int, int, int]] = {}  # ref -> (unit, attempt, worker)
        results: list[UnitResult | None] = [None] * len(units)
        while pending or in_flight:
            while pending and idle:
                unit, attempt = pending.popleft()
                worker = idle.popleft()
                in_flight[self.actors[worker].evaluate.remote(payload, units[unit])] = (unit, attempt, worker)
            if not in_flight:
                raise RuntimeError("every engine worker has died")
            [done], _ = ray.wait(list(in_flight), num_returns=1)
            unit, attempt, worker = in_flight.pop(done)
            try:
                results[unit] = ray.get(done)
                idle.append(worker)
            except WORKER_FAILURES:
                self.alive.discard(worker)
                if attempt + 1 >= max_attempts:
                    raise
                pending.append((unit, attempt + 1))
        return results  # type: ignore[return-value]

    def shutdown(self) -> None:
        for i in sorted(self.alive):
            try:
                ray.get(self.actors[i].shutdown.remote(), timeout=60)
            except Exception:  # a worker that cannot shut down cleanly is killed below anyway
                pass
        for actor in self.actors:
            ray.kill(actor)
