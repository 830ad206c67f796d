"""A worker's side of a trainer's rollouts (`EngineWorker.rollout`, `distributed/rollouts.py`):
the policy's adapter loaded once a step for all the step's units on this worker, each unit one
`generate` call and, for the importance-sampling correction, one `score` call."""

from __future__ import annotations

from typing import Callable

import torch

from evora.distributed.units import RolloutResult, RolloutUnit
from evora.engines import AdapterRef, Engine
from evora.engines.adapter_store import AdapterScratch
from evora.lora import Tensors
from evora.lora.layout import AdapterLayout


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

    def run(self, adapter: Tensors | None, unit: RolloutUnit, worker: int) -> RolloutResult:
        """`adapter`: the policy's tensors (None: the engine's own weights)."""
        ref = self.policy(adapter, unit.label)
        prompts, adapters = [list(p) for p in unit.prompts], [ref] * len(unit.prompts)
        completions = [c.token_ids for c in self.engine.generate(prompts, adapters, unit.max_tokens, unit.sampling)]
        logprobs = None
        if unit.logprobs:
            scored = self.engine.score(prompts, [list(c) for c in completions], adapters)
            logprobs = [tuple(values) for values in scored]
        return RolloutResult(completions, logprobs, worker)

    def policy(self, adapter: Tensors | None, label: str) -> AdapterRef | None:
        """The adapter of `label`'s step: loaded at its first unit here and kept for the step's
        others; the previous step's is released then."""
        held_label, held = self.held
        if held_label == label:
            return held
        if held is not None:
            self.release([held])
        in_memory = self.engine.loads_from_memory
        ref = None if adapter is None else self.scratch.keep(label, adapter, self.layout, self.dtype, in_memory)
        self.held = (label, ref)
        return ref
