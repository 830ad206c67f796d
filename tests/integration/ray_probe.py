"""What stands where an engine worker would in test_cluster.py's placement tests, in a module of
its own: the Ray workers that run it import this module (by name, through the PYTHONPATH the
cluster's nodes pass on), and it imports Ray alone, not the test module's torch and evora."""

from __future__ import annotations

import os

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


@ray.remote(num_gpus=1, num_cpus=0)
def shard_gpu() -> tuple[str, list]:
    return ray.get_runtime_context().get_node_id(), ray.get_gpu_ids()


class Probe:
    """Stands where an EngineWorker would, and reports what Ray gave it."""

    def where(self) -> dict:
        group = ray.util.get_current_placement_group()
        shards = []
        if group is not None:  # as vLLM's Ray executor does: one shard per bundle of the worker's group
            shards = ray.get(
                [
                    shard_gpu.options(
                        scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)
                    ).remote()
                    for i in range(len(group.bundle_specs))
                ]
            )
        return {"node": ray.get_runtime_context().get_node_id(), "gpus": ray.get_gpu_ids(), "shards": shards}

    def environment(self, names: list[str]) -> dict:
        return {name: os.environ.get(name) for name in names}


class SlowStart(Probe):
    """A worker whose constructor takes `seconds` (as an engine's start does): placed, not yet up."""

    def __init__(self, seconds: float):
        import time

        time.sleep(seconds)
