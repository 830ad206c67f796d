"""The worker pool: places EngineWorker actors and spreads work units over them.

Units go to whichever worker is free next. Which worker runs a unit never changes its
result: a unit is always the same candidates and prompts in one `generate` call, and
units have a fixed size (engine.max_loras), so 1 or N workers give the same numbers.
A unit whose worker dies is run again on another worker, and the lost worker is replaced
by a new actor (on whichever node has room) up to `hardware.worker_replacements` times,
so a long run on preemptible nodes keeps its capacity. A worker killed for memory is not
replaced (its replacement would die alike): the run stops in one line saying so.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any, Callable

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, ObjectLostError, RayActorError

from evora.config.schema import HardwareConfig
from evora.distributed.memory_deaths import memory_killer
from evora.distributed.payloads import SharedPayload
from evora.distributed.placement import Placement, place_workers, wait_placed, worker_count
from evora.distributed.worker import EngineWorker
from evora.distributed.worker_spec import WorkerSpec
from evora.engines.environment import engine_environment
from evora.errors import RunError
from evora.tracking.events import PoolEvent, WorkerLost, WorkerReplaced

# A lost node also loses the results it held in its object store: those units are rerun too.
WORKER_FAILURES = (RayActorError, ActorDiedError, ActorUnavailableError, ObjectLostError)


def worker_placement(spec: WorkerSpec, hardware: HardwareConfig, name_prefix: str | None = None) -> Placement:
    """Where and how the workers start: their resources, and their engine's environment
    variables through Ray's runtime_env (replacements start from the same options)."""
    placement = place_workers(hardware, worker_count(hardware), name_prefix)
    env_vars = engine_environment(spec.engine_name, spec.engine)
    if env_vars:
        for options in placement.options:
            options["runtime_env"] = {"env_vars": env_vars}
    return placement


UNITS_IN_FLIGHT = 2  # per worker


def slots_of(workers: list[int]) -> list[int]:
    """Each worker UNITS_IN_FLIGHT times, round-robin: the first units spread over every worker."""
    return [w for _ in range(UNITS_IN_FLIGHT) for w in workers]


class UnitClock:
    """When each busy worker's current unit began: at its dispatch to an idle worker, or at the
    result before it (the next unit then leaves the actor's queue). None: no deadline."""

    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        self.since: dict[int, float] = {}

    def started(self, worker: int) -> None:
        self.since.setdefault(worker, time.monotonic())

    def finished(self, worker: int, busy: bool) -> None:
        if busy:
            self.since[worker] = time.monotonic()
        else:
            self.since.pop(worker, None)

    def wait(self) -> float | None:
        """Seconds until the first deadline (None: no deadline to wait for)."""
        if self.timeout_s is None or not self.since:
            return None
        return max(0.0, min(self.since.values()) + self.timeout_s - time.monotonic())

    def overdue(self) -> list[int]:
        """Workers past their deadline, forgotten here (their units fail and are rerun)."""
        if self.timeout_s is None:
            return []
        now = time.monotonic()
        late = sorted(w for w, since in self.since.items() if now - since >= self.timeout_s)
        for worker in late:
            del self.since[worker]
        return late


class WorkerPool:
    def __init__(
        self,
        actors: list[Any],
        infos: list[dict[str, Any]],
        placement: Placement | None = None,
        spec: WorkerSpec | None = None,
        replacements: int = 0,
    ):
        self.actors = actors
        self.infos = infos
        self.alive = set(range(len(actors)))
        self.placement = placement
        self.spec = spec
        self.replacements_left = replacements if spec is not None and placement is not None else 0
        self.unit_timeout_s = spec.unit_timeout_s if spec is not None else None
        self.starting: dict[Any, int] = {}  # a replacement's info() ref -> its worker index
        self.events: list[PoolEvent] = []  # workers lost and replaced, taken by `take_events`
        # Called with a replacement's actor before it takes work (full-weight strategies sync its weights).
        self.on_join: Callable[[Any], None] | None = None

    @classmethod
    def start(cls, spec: WorkerSpec, hardware: HardwareConfig, name_prefix: str | None = None) -> "WorkerPool":
        """Named workers (`name_prefix`-i) can be found with `ray list actors`, and by tests."""
        placement = worker_placement(spec, hardware, name_prefix)
        remote_worker = ray.remote(EngineWorker)
        actors: list[Any] = [  # actor handles
            remote_worker.options(**options).remote(spec, i) for i, options in enumerate(placement.options)
        ]
        try:
            infos = wait_placed(actors, [a.info.remote() for a in actors], hardware)
        except BaseException:  # not placed, or failed to start: none of them is left behind
            with contextlib.suppress(Exception):  # (the error that got here is the one to report)
                for actor in actors:
                    ray.kill(actor)
                placement.release()
            raise
        return cls(actors, infos, placement, spec, hardware.worker_replacements)

    def __len__(self) -> int:
        return len(self.alive)

    def take_events(self) -> list[PoolEvent]:
        events, self.events = self.events, []
        return events

    def run(self, payload: Any, units: list[Any], max_attempts: int = 3, method: str = "evaluate") -> list[Any]:
        """Results of `method(payload, unit)` in unit order (`evaluate`: a WorkUnit -> UnitResult;
        `noise_sum`: a GroupTask -> GroupSum). `payload` is an ObjectRef: put once, read once by
        each worker. Each worker has UNITS_IN_FLIGHT units at a time: the next waits in its
        actor's queue while it runs one, so no worker idles through a round trip to the driver.
        A worker that gives no result for `unit_timeout_s` while it has units is hung (a stuck
        engine or collective): it is killed and replaced, and its units run again elsewhere."""
        shared = SharedPayload(payload)
        pending = deque((i, 0) for i in range(len(units)))
        slots = deque(slots_of(self._check_in()))  # a worker once per unit it may have in flight
        in_flight: dict[Any, tuple[int, int, int]] = {}  # ref -> (unit, attempt, worker)
        results: dict[int, Any] = {}  # by unit
        clock = UnitClock(self.unit_timeout_s)
        while pending or in_flight:
            while pending and slots:
                unit, attempt = pending.popleft()
                worker = slots.popleft()
                call = getattr(self.actors[worker], method)
                in_flight[call.remote(shared, units[unit])] = (unit, attempt, worker)
                clock.started(worker)
            if not in_flight and not self.starting:
                raise RuntimeError("every engine worker has died (hardware.worker_replacements used up)")
            ready, _ = ray.wait([*in_flight, *self.starting], num_returns=1, timeout=clock.wait())
            if not ready:  # a deadline passed
                for worker in clock.overdue():
                    if worker in self.alive:  # not lost meanwhile through a failed unit
                        self._hung(worker)
                slots = deque(w for w in slots if w in self.alive)
                continue
            [done] = ready
            if done in self.starting:
                slots.extend(slots_of(self._joined(done)))
                continue
            unit, attempt, worker = in_flight.pop(done)
            clock.finished(worker, busy=worker in self.alive and any(w == worker for _, _, w in in_flight.values()))
            try:
                results[unit] = ray.get(done)
                if worker in self.alive:  # not lost meanwhile through its other unit
                    slots.append(worker)
            except WORKER_FAILURES as error:
                if worker in self.alive:  # its other unit in flight may have found it lost already
                    self._lost(worker, error)
                if attempt + 1 >= max_attempts:
                    raise
                pending.append((unit, attempt + 1))
                # Workers lost with it (a node, a preemption) may be idle: found now, so that the
                # unit does not use up its attempts on workers that were dead before it got there.
                slots = deque(self._responding(list(slots)))
        return [results[unit] for unit in range(len(units))]

    def broadcast(self, method: str, *args: Any) -> list[Any]:
        """`method(*args)` on every live worker, in worker order; a worker lost on the way is
        replaced (`on_join` brings its replacement up to date when it joins)."""
        workers = self._check_in()
        # No deadline: a broadcast's work (a full-weight update at 7B on a CPU: minutes) is not a unit's.
        answers = self._answers({w: getattr(self.actors[w], method).remote(*args) for w in workers}, None)
        results = [answers[w] for w in workers if w in answers]
        while not results and self.starting:  # every worker was lost: the first replacement to start answers
            [ready], _ = ray.wait(list(self.starting), num_returns=1)
            for worker in self._joined(ready, up_to_date=False):  # `method` brings it up to date
                results.extend(
                    self._answers({worker: getattr(self.actors[worker], method).remote(*args)}, None).values()
                )
        if not results:
            raise RuntimeError("every engine worker has died (hardware.worker_replacements used up)")
        return results

    def first_live(self) -> Any:
        return self.actors[min(self.alive)]

    def _check_in(self) -> list[int]:
        """Workers ready for work: replacements that have started join; a worker that died
        while idle is found now (one cheap call each) and replaced at once."""
        if self.starting:
            ready, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
            for ref in ready:
                self._joined(ref)
        return self._responding(sorted(self.alive))

    def _responding(self, workers: list[int]) -> list[int]:
        """Those of `workers` that answer (one cheap call each); the others are lost."""
        # `workers` may name one several times (its slots), and one already lost through a unit.
        distinct = sorted(set(workers) & self.alive)
        self._answers({w: self.actors[w].__ray_ready__.remote() for w in distinct}, self.unit_timeout_s)
        return [w for w in workers if w in self.alive]

    def _answers(self, calls: dict[int, Any], timeout_s: float | None) -> dict[int, Any]:
        """Each worker's answer to its call (worker -> ref), by worker: a worker whose call fails
        is lost, one that has not answered within `timeout_s` (None: no limit) is hung."""
        refs = list(calls.values())
        _, late = ray.wait(refs, num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
        answers = {}
        for worker, ref in calls.items():
            if ref in late:
                self._hung(worker)
                continue
            try:
                answers[worker] = ray.get(ref)
            except WORKER_FAILURES as error:
                self._lost(worker, error)
        return answers

    def _hung(self, worker: int) -> None:
        """A worker past its unit's deadline: killed (its units then fail and run again
        elsewhere), and lost."""
        ray.kill(self.actors[worker], no_restart=True)
        self._lost(worker, hung_s=self.unit_timeout_s)

    def _lost(self, worker: int, error: BaseException | None = None, hung_s: float | None = None) -> None:
        """Drop a dead worker, and start a replacement with the same resources; one killed for
        memory (`error`: how its death showed) stops the run instead."""
        self.alive.discard(worker)
        killer = memory_killer(error, self.infos[worker]) if error is not None else None
        if killer is not None:
            raise RunError(
                f"engine worker {worker} was killed for memory ({killer}); a replacement would die alike: "
                "give each worker less to hold (engine.max_num_seqs, engine.max_loras, hardware.kv_cache_gib "
                "on CPUs) or more memory (fewer workers a node); `evora doctor` shows the estimate"
            )
        self.events.append(WorkerLost(worker, hung_s))
        if self.replacements_left == 0:
            return
        self.replacements_left -= 1
        assert self.placement is not None and self.spec is not None
        index = len(self.actors)
        options = dict(self.placement.options[worker])
        if "name" in options:
            options["name"] = f"{options['name'].rsplit('-', 1)[0]}-{index}"
        self.placement.options.append(options)
        actor: Any = ray.remote(EngineWorker).options(**options).remote(self.spec, index)  # an actor handle
        self.actors.append(actor)
        self.infos.append({})
        self.starting[actor.info.remote()] = index

    def _joined(self, ready: Any, up_to_date: bool = True) -> list[int]:
        """A replacement that started joins the pool (`up_to_date`: `on_join` brings it up to
        date); one that died on the way is lost too."""
        index = self.starting.pop(ready)
        try:
            self.infos[index] = ray.get(ready)
            if up_to_date and self.on_join is not None:
                self.on_join(self.actors[index])
        except WORKER_FAILURES as error:
            self._lost(index, error)
            return []
        self.alive.add(index)
        self.events.append(WorkerReplaced(index, self.infos[index]["node"]))
        return [index]

    def shutdown(self) -> None:
        closing = [self.actors[i].shutdown.remote() for i in sorted(self.alive)]  # all at once
        if closing:  # one that cannot shut down cleanly is killed below anyway
            ray.wait(closing, num_returns=len(closing), timeout=60)
        for actor in self.actors:
            ray.kill(actor)
        if self.placement is not None:
            self.placement.release()
