"""Candidates that perturb the engine's own weights (the ES paper's algorithm, es_full):
one after another, each spec's weights are set from the fp32 master copies plus its
perturbation, its requests generated, and the weights set back by casting the master
copies again, so after every candidate the engine holds bitwise what it held before
(subtracting the noise in low precision would drift)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from evora.distributed.cells import Requests
from evora.engines import Completion, Engine
from evora.strategies.full_weights import InPlaceStrategy, MasterWeights
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
    for row, spec in enumerate(specs):
        indices = [i for i, r in enumerate(rows) if r == row]
        if not indices:
            continue
        sampling = None if requests.sampling is None else [requests.sampling[i] for i in indices]
        prompts = [requests.prompts[i] for i in indices]
        if spec.op == PERTURB:
            engine.set_base_weights(strategy.perturbed(master, payload, spec))
        try:
            completions = engine.generate(prompts, [None] * len(indices), max_tokens, sampling)
            if kl_base is not None:
                ids = [list(c.token_ids) for c in completions]
                for i, values in zip(indices, engine.kl_to_base(prompts, ids, [None] * len(indices), kl_base)):
                    kl[i] = values
        finally:
            if spec.op == PERTURB:
                engine.set_base_weights(master.tensors)  # exactly the master again, cast as at the sync
        for i, completion in zip(indices, completions):
            out[i] = completion
    return [c for c in out if c is not None], None if kl_base is None else kl
