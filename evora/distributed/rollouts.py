"""A trainer's completions sampled on the run's engine workers (`training.rollouts.RolloutSampler`):
GRPO's groups go through the same engines, work units and seeded sampling as evaluation.

A request's rows are cut into units of `rows_per_unit` rows in row order, whatever the pool's
size, and each row samples from its own seeded stream: 1 or N workers give the same tokens
(docs/architecture.md, "Determinism rules"). The policy travels once a step through the object
store (`SharedPayload`: each worker reads it once) and each worker takes it in once a step
(`worker_rollouts.py`): an adapter loaded under the step's label, in memory where the engine
takes adapters so (`AdapterScratch.keep`), else through tmpfs; full-weight training's matrices
written into the engine's own weights."""

from __future__ import annotations

import ray

from evora.distributed.pool import WorkerPool
from evora.distributed.units import RolloutResult, rollout_units
from evora.training.rollouts import Rollout, RolloutRequest


class EngineRollouts:
    """The sampler a gradient strategy is given where a run has engine workers."""

    def __init__(self, pool: WorkerPool):
        self.pool = pool

    def __call__(self, request: RolloutRequest) -> list[Rollout]:
        results: list[RolloutResult] = self.pool.run(ray.put(request.policy), rollout_units(request), method="rollout")
        return [
            Rollout(ids, None if result.logprobs is None else result.logprobs[i])
            for result in results
            for i, ids in enumerate(result.completions)
        ]
