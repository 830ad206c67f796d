"""A worker's side of a trainer's rollouts (`EngineWorker.rollout`, `distributed/rollouts.py`):
the step's policy taken in once a step for all its units on this worker (an adapter loaded; full
weights written into the engine's own, which the generation's end sets from the worker's master
copies again: `EngineWorker.sync_weights`), each unit one `generate` call and, for the
importance-sampling correction, one `score` call."""

from __future__ import annotations

from typing import Callable

import torch

from evora.distributed.units import RolloutResult, RolloutUnit
from evora.engines import AdapterRef, Engine
from evora.engines.adapter_store import AdapterScratch
from evora.lora import Tensors
from evora.lora.layout import AdapterLayout
from evora.training.rollouts import Policy


class WorkerRollouts:
    def __init__(
        self,
        engine: Engine,
        scratch: AdapterScratch,
        layout: AdapterLayout,
        dtype: torch.dtype,
        release: Callable[[list[AdapterRef | None]], None],
    ):
        self.engine, self.scratch, self.layout, self.dtype, self.release = engine, scratch, layout, dtype, release
        self.held: tuple[str | None, AdapterRef | None] = (None, None)  # (step label, its adapter)

    def run(self, policy: Policy, unit: RolloutUnit, worker: int) -> RolloutResult:
        ref = self.take(policy, unit.label)
        prompts, adapters = [list(p) for p in unit.prompts], [ref] * len(unit.prompts)
        completions = [c.token_ids for c in self.engine.generate(prompts, adapters, unit.max_tokens, unit.sampling)]
        logprobs = None
        if unit.logprobs:
            scored = self.engine.score(prompts, [list(c) for c in completions], adapters)
            logprobs = [tuple(values) for values in scored]
        return RolloutResult(completions, logprobs, worker)

    def take(self, policy: Policy, label: str) -> AdapterRef | None:
        """`label`'s step's policy, taken in at its first unit here and kept for the step's others
        (the previous step's adapter is released then); its adapter, if any."""
        held_label, held = self.held
        if held_label == label:
            return held
        if held is not None:
            self.release([held])
        if policy.weights is not None:
            self.engine.set_base_weights(policy.weights)
        ref = None if policy.adapter is None else self._load(label, policy.adapter)
        self.held = (label, ref)
        return ref

    def _load(self, label: str, adapter: Tensors) -> AdapterRef:
        return self.scratch.keep(label, adapter, self.layout, self.dtype, self.engine.loads_from_memory)
