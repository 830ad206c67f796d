"""Candidates that perturb the engine's own weights (the ES paper's algorithm, es_full):
one after another, the engine sets each spec's weights from the fp32 master copies plus its
perturbation, drawn from seeds inside the engine (`Engine.perturb_base`), and generates its
requests. A candidate's weights overwrite every perturbed matrix whole, so the next candidate
needs no restore first; before any other spec and after the unit the weights are set back by
casting the master copies again, so the engine ends bitwise as it started (subtracting the
noise in low precision would drift)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from evora.distributed.cells import Requests
from evora.engines import Completion, Engine
from evora.strategies.full_weights import InPlaceStrategy
from evora.strategies.master_weights import MasterWeights
from evora.strategies.protocol import PERTURB


def complete_in_place(
    engine: Engine,
    strategy_and_master: tuple[InPlaceStrategy, MasterWeights],
    payload: Any,
    specs: Sequence[Any],
    requests: Requests,
    max_tokens: int,
    kl_base: Mapping[str, torch.Tensor] | None = None,
) -> tuple[list[Completion], list[list[float]] | None]:
    """The unit's completions, its specs' requests generated spec by spec; given `kl_base` (the
    model's own weights), each request's per-token KL from it too, measured while its
    candidate's weights are set."""
    strategy, master = strategy_and_master
    rows = requests.rows()
    out: list[Completion | None] = [None] * len(rows)
    kl: list[list[float]] = [[] for _ in rows]
    perturbed = False  # whether the engine holds a candidate's weights now
    try:
        for row, spec in enumerate(specs):
            indices = [i for i, r in enumerate(rows) if r == row]
            if not indices:
                continue
            if spec.op == PERTURB:
                engine.perturb_base(master.tensors, strategy.perturbation(payload, spec))
                perturbed = True
            elif perturbed:
                engine.set_base_weights(master.tensors)  # exactly the master again, cast as at the sync
                perturbed = False
            sampling = None if requests.sampling is None else [requests.sampling[i] for i in indices]
            prompts = [requests.prompts[i] for i in indices]
            completions = engine.generate(prompts, [None] * len(indices), max_tokens, sampling)
            if kl_base is not None:
                ids = [list(c.token_ids) for c in completions]
                for i, values in zip(indices, engine.kl_to_base(prompts, ids, [None] * len(indices), kl_base)):
                    kl[i] = values
            for i, completion in zip(indices, completions):
                out[i] = completion
    finally:
        if perturbed:
            engine.set_base_weights(master.tensors)
    return [c for c in out if c is not None], None if kl_base is None else kl
