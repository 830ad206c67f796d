"""The scale bench's driver (bench/scale.py; not part of evora): the product's `Driver`, each
generation split into timed phases by wrapping the real code in the driver actor's process:
ask (`strategy.ask`), dispatch (the payload's `ray.put`, the work units and `WorkerPool.run`'s
round trip to the workers), results (`generation_results`), tell (`PopulationSearch._tell`,
with EGGROLL's weight sync), checkpoint (`Driver._checkpoint`) and the rest of the generation
(records, stats); with the driver's RSS, the object store's bytes just after the workers
answered and the checkpoint's size. They travel back in the generation event (`event["bench"]`).
"""

from __future__ import annotations

import time
from functools import wraps
from typing import Any

from evora.distributed.driver import Driver
from evora.distributed.driver_actor import DriverActor

PHASES: dict[str, float] = {}
PARTS = ("ask", "dispatch", "results", "tell", "checkpoint")


def _store_bytes() -> int:
    import ray
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return int(reply.store_stats.object_store_bytes_used)


def _mark(name: str) -> None:
    PHASES[name] = time.perf_counter()


def _time_search() -> None:
    """Wraps the search's phases in this (the driver's) process; the wrappers only read clocks."""
    from evora.distributed import search
    from evora.distributed.pool import WorkerPool

    if getattr(search, "_bench_timed", False):
        return
    step, run, results, tell = (
        search.PopulationSearch.step,
        WorkerPool.run,
        search.generation_results,
        search.PopulationSearch._tell,
    )

    @wraps(step)
    def timed_step(self: Any, state: Any, gen: int) -> Any:
        strategy = self.parts.strategy
        if not getattr(strategy, "_bench_timed", False):
            ask = strategy.ask

            def timed_ask(*args: Any) -> Any:
                out = ask(*args)
                _mark("ask_end")
                PHASES["specs"] = len(out[0])
                return out

            strategy.ask, strategy._bench_timed = timed_ask, True
        _mark("step_start")
        return step(self, state, gen)

    @wraps(run)
    def timed_run(self: Any, payload: Any, units: list[Any], *args: Any, **kwargs: Any) -> Any:
        if "step_start" in PHASES and "run_start" not in PHASES:  # the search's own call, not an evaluation's
            _mark("run_start")
            out = run(self, payload, units, *args, **kwargs)
            _mark("run_end")
            probe = time.perf_counter()
            PHASES["store_bytes"] = _store_bytes()  # results and payload still referenced
            PHASES["units"] = len(units)
            PHASES["probe"] = time.perf_counter() - probe
            return out
        return run(self, payload, units, *args, **kwargs)

    @wraps(results)
    def timed_results(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = results(*args, **kwargs)
        PHASES["results"] = time.perf_counter() - start
        return out

    @wraps(tell)
    def timed_tell(self: Any, *args: Any, **kwargs: Any) -> Any:
        _mark("tell_start")
        out = tell(self, *args, **kwargs)
        _mark("tell_end")
        return out

    search.PopulationSearch.step = timed_step  # type: ignore[method-assign,assignment]
    WorkerPool.run = timed_run  # type: ignore[method-assign]
    search.generation_results = timed_results
    search.PopulationSearch._tell = timed_tell  # type: ignore[method-assign]
    search._bench_timed = True  # type: ignore[attr-defined]


class BenchDriver(Driver):
    """The product's driver, its generation split into timed phases (`event["bench"]`)."""

    def _setup(self) -> None:
        _time_search()
        super()._setup()

    def _checkpoint(self, done: int) -> None:
        _mark("checkpoint_start")
        super()._checkpoint(done)
        _mark("checkpoint_end")

    def _generation(self, generation: int) -> dict[str, Any]:
        import psutil

        from evora.tracking import checkpoint

        PHASES.clear()
        start = time.perf_counter()
        event = super()._generation(generation)
        end = time.perf_counter()
        p, probe = PHASES, PHASES.get("probe", 0.0)
        phases = {
            "ask": p["ask_end"] - p["step_start"],
            # ray.put of the payload, the work units, and the pool's round trip to the workers
            "dispatch": p["run_end"] - p["ask_end"],
            "results": p["results"],
            "tell": p["tell_end"] - p["tell_start"],
            "checkpoint": p["checkpoint_end"] - p["checkpoint_start"],
            "total": end - start - probe,
        }
        phases["other"] = phases["total"] - sum(phases[k] for k in PARTS)
        latest = checkpoint.latest_path(self.run_dir)
        event["bench"] = {
            **phases,
            "specs": p.get("specs", 0),
            "units": p.get("units", 0),
            "store_bytes": p.get("store_bytes", 0),
            "driver_rss": psutil.Process().memory_info().rss,
            "checkpoint_bytes": latest.stat().st_size if latest.exists() else 0,
        }
        return event


class BenchDriverActor(DriverActor):
    """The product's driver actor with `BenchDriver` inside: what the bench starts in its place."""

    def __init__(self, run_dir: str):
        self.driver = BenchDriver(run_dir)
