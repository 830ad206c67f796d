"""A routed portfolio of adapters (the ecology's organelles), evaluated on the worker pool.

The routing map (family -> member) is chosen on the selection split: every member is
evaluated on all of it and each family goes to the member with the best mean reward on
that family's examples; families the selection split lacks (held-out-only families) go
to the single best member overall. Without a selection split the strategy's own train
statistics choose (`strategy.train_routing`). On held-out each example is then
evaluated by its family's member only, in one pass of MEMBER specs routed to prompts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import ray

from evora.distributed.evaluate import EVAL_CHUNK, chunks, spend_of
from evora.distributed.pool import WorkerPool
from evora.distributed.worker import WorkUnit
from evora.lora.layout import AdapterLayout
from evora.lora.peft_io import save_adapter
from evora.strategies.protocol import MEMBER, CandidateSpec, MembersPayload, Tensors
from evora.tasks.base import Example
from evora.tracking.compute import Spend

ROUTING_FILE = "routing.json"


def evaluate_members(
    pool: WorkerPool,
    members: Sequence[Tensors],
    split: str,
    size: int,
    routes: Sequence[tuple[int, ...] | None],
    *,
    max_loras: int,
    generation: int,
    spend: Spend,
) -> dict[str, np.ndarray]:
    """rewards, correct, tokens [member, example] of the first `size` examples of `split`, and
    `evaluated`: each member on its routed examples (None: all)."""
    specs = [CandidateSpec(generation, i, member=i, op=MEMBER, prompts=routes[i]) for i in range(len(members))]
    units = [
        WorkUnit(tuple(group), split, tuple(block))
        for block in chunks(list(range(size)), EVAL_CHUNK)
        for group in chunks(specs, max_loras)
    ]
    results = pool.run(ray.put(MembersPayload(tuple(members))), units)
    spend.add(spend_of(results))
    out = {name: np.zeros((len(members), size), dtype=dtype) for name, dtype in
           (("rewards", np.float64), ("correct", bool), ("tokens", np.int64), ("evaluated", bool))}  # fmt: skip
    for unit, result in zip(units, results):
        columns = list(unit.prompt_indices)
        for row, index in enumerate(result.indices):
            mask = result.evaluated[row] if result.evaluated is not None else np.ones(len(columns), dtype=bool)
            out["rewards"][index, columns] = np.where(mask, result.rewards[row], 0.0)
            out["correct"][index, columns] = result.correct[row]
            out["tokens"][index, columns] = result.tokens[row]
            out["evaluated"][index, columns] = mask
    return out


def routing_map(scores: dict[str, list[float]], ids: list[str], default: str) -> dict[str, str]:
    """family -> the member id with the best score on it (ties: the lower position), and
    "default" -> `default`, for families the scores do not cover."""
    chosen = {family: ids[max(range(len(ids)), key=lambda i: (values[i], -i))] for family, values in scores.items()}
    return {**chosen, "default": default}


def family_scores(rewards: np.ndarray, examples: Sequence[Example]) -> dict[str, list[float]]:
    """family -> each member's mean reward on that family's examples."""
    families = sorted({e.family for e in examples})
    return {
        f: [float(v) for v in rewards[:, [i for i, e in enumerate(examples) if e.family == f]].mean(axis=1)]
        for f in families
    }


def metrics_of(matrices: dict[str, np.ndarray], row_of_example: list[int]) -> dict[str, float]:
    """Held-out metrics of the example-wise routed outcomes."""
    columns = np.arange(len(row_of_example))
    rows = np.array(row_of_example)
    return {
        "reward": float(matrices["rewards"][rows, columns].mean()),
        "accuracy": float(matrices["correct"][rows, columns].mean()),
        "tokens": float(matrices["tokens"][rows, columns].mean()),
    }


def routed_rows(routing: dict[str, str], ids: list[str], examples: Sequence[Example]) -> list[int]:
    return [ids.index(routing.get(e.family, routing["default"])) for e in examples]


def write_routing(
    run_dir: Path, routing: dict[str, str], ids: list[str], members: Sequence[Tensors], layout: AdapterLayout
) -> None:
    """adapters/organelles/<id>/ (PEFT) for every member, and routing.json naming them."""
    folder = run_dir / "adapters" / "organelles"
    shutil.rmtree(folder, ignore_errors=True)  # a resumed run's finish: members that died since are not exported
    for member_id, adapter in zip(ids, members):
        save_adapter(folder / member_id, adapter, layout)
    document = {"routing": routing, "adapters": {i: f"adapters/organelles/{i}" for i in ids}}
    (run_dir / ROUTING_FILE).write_text(json.dumps(document, indent=2) + "\n")


def evaluate_portfolio(
    pool: WorkerPool,
    ids: list[str],
    members: list[Tensors],
    splits: Any,
    train_routing: dict[str, str],
    *,
    max_loras: int,
    generation: int,
    spend: Spend,
) -> dict[str, Any]:
    """The routing map (on selection, else from training), and held-out metrics of the routed
    portfolio and of the single best member (the map's default)."""
    routing = train_routing
    if splits.selection:
        selection = evaluate_members(
            pool, members, "selection", len(splits.selection), [None] * len(members),
            max_loras=max_loras, generation=generation, spend=spend,
        )  # fmt: skip
        overall = selection["rewards"].mean(axis=1)
        default = ids[max(range(len(ids)), key=lambda i: (overall[i], -i))]
        routing = routing_map(family_scores(selection["rewards"], splits.selection), ids, default)
    heldout = splits.heldout
    rows = routed_rows(routing, ids, heldout)
    single = ids.index(routing["default"])
    routes = [
        None if i == single else tuple(j for j, r in enumerate(rows) if r == i) for i in range(len(members))
    ]  # the single best is evaluated on every example: it is the portfolio's rival
    matrices = evaluate_members(
        pool, members, "heldout", len(heldout), routes, max_loras=max_loras, generation=generation, spend=spend
    )
    return {
        "routing": routing,
        "portfolio": metrics_of(matrices, rows),
        "single_best": {"id": routing["default"], **metrics_of(matrices, [single] * len(heldout))},
        "members": len(members),
    }
