"""Where engine workers go: one per GPU (`num_gpus=1`), a STRICT_PACK placement group of
`tensor_parallel_size` one-GPU bundles per engine when an engine spans several GPUs, or
CPU workers; spread over every node with `hardware=multinode`.

With tensor parallelism the worker actor itself takes no GPU: it sits in bundle 0 and
captures its child tasks, so vLLM's Ray executor puts one shard on each bundle (vLLM
uses the placement group it finds itself in). Everything here fails at once, with the
key to change, when the cluster cannot hold the workers, instead of waiting forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from evora.config.schema import HardwareConfig
from evora.errors import ConfigError, RunError

PLACEMENT_TIMEOUT_S = 120.0


def engine_gpus(hw: HardwareConfig) -> int:
    """GPUs one engine uses."""
    return hw.gpus_per_worker * hw.tensor_parallel_size


def worker_count(hw: HardwareConfig) -> int:
    _check_gpus(hw)
    if hw.num_workers is not None:
        return hw.num_workers
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus < max(engine_gpus(hw), 1):
        raise ConfigError(
            f"hardware.num_workers=null needs GPUs, but the Ray cluster has {gpus}; "
            "set hardware.num_workers or use hardware=cpu"
        )
    return gpus // engine_gpus(hw)


def _check_gpus(hw: HardwareConfig) -> None:
    if engine_gpus(hw) > 0 and ray.cluster_resources().get("GPU", 0) == 0:
        raise ConfigError(
            f"hardware.gpus_per_worker={hw.gpus_per_worker}: the Ray cluster has no GPUs; "
            "use hardware=cpu (engines on CPU cores)"
        )


def check_capacity(hw: HardwareConfig, workers: int) -> None:
    """Fail at once, not hang, when the cluster cannot place every worker."""
    _check_gpus(hw)
    have = ray.cluster_resources()
    for resource, each, extra, key in (
        ("CPU", hw.cpus_per_worker, hw.driver_cpus, "hardware.cpus_per_worker"),
        ("GPU", engine_gpus(hw), 0, "hardware.tensor_parallel_size"),
    ):
        need = workers * each + extra
        if need > have.get(resource, 0) + 1e-9:
            raise ConfigError(
                f"hardware.num_workers={workers}: {workers} worker(s) x {each:g} {resource} (+ {extra:g} for the "
                f"driver) need {need:g} {resource}s but the Ray cluster has {have.get(resource, 0):g}; lower "
                f"hardware.num_workers or {key}"
            )


def wait_placed(
    actors: list[Any], refs: list[Any], hw: HardwareConfig, timeout_s: float = PLACEMENT_TIMEOUT_S
) -> list[Any]:
    """`refs` (the `actors`' first answers) once every worker has started. Ray queues a worker it
    cannot place (the CPUs or GPUs it needs held by other actors or jobs) without a word, and it
    would wait for ever: every `timeout_s` that some have not answered, if Ray has placed not all
    of those and no node has free what one needs, the start fails in one line naming what is
    free against what one needs (room free in sum but split between nodes, a node's CPUs beside
    another's GPU, places no worker). Engines only slow to start have a process, and workers Ray
    has the room for will get one: both are waited for."""
    pending = dict(zip(refs, actors))
    while pending:
        _, left = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        pending = {ref: pending[ref] for ref in left}
        unplaced = [actor for actor in pending.values() if not has_process(actor)]
        if unplaced and not has_room(hw):
            raise RunError(
                f"{len(unplaced)} of {len(refs)} engine worker(s) not placed by Ray after {timeout_s:g}s: each "
                f"needs {needs(hw)}; the rest is held by other actors or jobs: free it, or lower "
                "hardware.num_workers, hardware.cpus_per_worker or hardware.gpus_per_worker"
            )
    return ray.get(refs)


def has_process(actor: Any) -> bool:
    """Whether Ray has placed the actor (a process runs it, its constructor maybe still going),
    from the GCS's actor table: the public state API needs the dashboard, which evora's local
    Ray does not start. Written for Ray 2.60 (tests/integration/test_cluster.py checks it);
    where the table cannot be read, True: wait, as Ray itself does."""
    try:
        from ray._private.state import state

        entry = state.actor_table(actor._actor_id.hex())
    except Exception:  # another Ray's private API: no verdict
        return True
    return not (entry and entry.get("State") == "PENDING_CREATION" and not entry.get("Pid"))


def per_worker(hw: HardwareConfig) -> tuple[tuple[str, float], ...]:
    """The Ray resources one worker (and its engine's shards) takes."""
    return ("CPU", hw.cpus_per_worker), ("GPU", float(engine_gpus(hw)))


def fits(free: dict[str, float], hw: HardwareConfig) -> bool:
    """Whether `free` resources hold what one worker needs."""
    return all(free.get(name, 0.0) + 1e-9 >= n for name, n in per_worker(hw))


def free_per_node() -> list[dict[str, float]] | None:
    """Each live node's free resources, from Ray's developer API (written for Ray 2.60); None
    where it cannot be read."""
    try:
        from ray._private.state import available_resources_per_node

        return list(available_resources_per_node().values())
    except Exception:  # another Ray's developer API: judge by the sum
        return None


def has_room(hw: HardwareConfig) -> bool:
    """Whether one of Ray's nodes has free what one more worker needs (the sum over the nodes,
    where Ray's per-node table cannot be read)."""
    nodes = free_per_node()
    return fits(ray.available_resources(), hw) if nodes is None else any(fits(free, hw) for free in nodes)


def needs(hw: HardwareConfig) -> str:
    """What one worker needs against what Ray has free, as "1 CPU (0.5 free of 2)", and whether
    the free room is split between nodes."""
    free, total = ray.available_resources(), ray.cluster_resources()
    line = ", ".join(
        f"{n:g} {name} ({free.get(name, 0.0):g} free of {total.get(name, 0.0):g})"
        for name, n in per_worker(hw)
        if n > 0
    )
    split = fits(free, hw) and not has_room(hw)
    return line + (", free on different nodes (one node must hold all of it)" if split else "")


@dataclass
class Placement:
    """Actor options for each worker, and the placement groups to remove afterwards."""

    options: list[dict[str, Any]]
    groups: list[PlacementGroup] = field(default_factory=list)

    def release(self) -> None:
        for group in self.groups:
            remove_placement_group(group)
        self.groups.clear()


def _largest_node_gpus() -> float:
    return max((node["Resources"].get("GPU", 0.0) for node in ray.nodes() if node["Alive"]), default=0.0)


def _tensor_parallel_group(hw: HardwareConfig, name: str) -> PlacementGroup:
    if _largest_node_gpus() < hw.tensor_parallel_size:
        raise ConfigError(
            f"hardware.tensor_parallel_size={hw.tensor_parallel_size}: no node of the Ray cluster has "
            f"that many GPUs (the most on one node: {_largest_node_gpus():g}); an engine's shards "
            "share one node (STRICT_PACK)"
        )
    bundles = [{"GPU": 1, "CPU": hw.cpus_per_worker}] + [{"GPU": 1}] * (hw.tensor_parallel_size - 1)
    group = placement_group(bundles, strategy="STRICT_PACK", name=name)
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        remove_placement_group(group)
        raise ConfigError(
            f"hardware.tensor_parallel_size={hw.tensor_parallel_size}: no node has "
            f"{hw.tensor_parallel_size} free GPUs for one engine within {PLACEMENT_TIMEOUT_S:g}s "
            "(STRICT_PACK); lower it or hardware.num_workers"
        )
    return group


def place_workers(hw: HardwareConfig, count: int, name_prefix: str | None = None) -> Placement:
    """Options for `count` worker actors (`ray.remote(cls).options(**options[i])`)."""
    check_capacity(hw, count)
    placement = Placement([])
    for index in range(count):
        options: dict[str, Any] = {"num_cpus": hw.cpus_per_worker, "max_restarts": 0}
        if name_prefix is not None:
            options["name"] = f"{name_prefix}-{index}"
        if hw.gpus_per_worker > 0 and hw.tensor_parallel_size > 1:
            try:
                group = _tensor_parallel_group(hw, f"{name_prefix or 'evora-engine'}-{index}")
            except ConfigError:
                placement.release()
                raise
            placement.groups.append(group)
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
            )
        else:
            if hw.gpus_per_worker > 0:
                options["num_gpus"] = hw.gpus_per_worker
            if hw.spread:
                options["scheduling_strategy"] = "SPREAD"
        placement.options.append(options)
    return placement
