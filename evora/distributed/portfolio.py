"""A routed portfolio of adapters (the ecology's organelles), evaluated on the worker pool.

The routing map (family -> member) is chosen on the selection split: every member is
evaluated on all of it and each family goes to the member with the best mean reward on
that family's examples when it beats the single best member overall there with confidence
(`routing_map`), else to that single best; so do families the selection split lacks
(held-out-only families). Without a selection split the strategy's own train
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


def routing_map(
    rewards: np.ndarray, examples: Sequence[Example], ids: list[str], default: str, confidence: float = 0.0
) -> dict[str, str]:
    """family -> member id, and "default" -> `default` (families the examples lack go there).

    A family leaves the default (the single best member) only for the member with the best
    mean reward on it, and only if that member beats the default on the family's examples by
    more than `confidence` standard errors of their paired difference: a few dozen selection
    examples per family make a specialist's lead noisy, and a noisy switch costs held-out
    reward (0: the best mean wins, ties to the lower position)."""
    anchor = ids.index(default)
    routing = {}
    for family in sorted({e.family for e in examples}):
        columns = [i for i, e in enumerate(examples) if e.family == family]
        lead = rewards[:, columns] - rewards[anchor, columns]
        means = lead.mean(axis=1)
        best = max(range(len(ids)), key=lambda i: (means[i], -i))
        error = lead[best].std(ddof=1) / np.sqrt(len(columns)) if len(columns) > 1 else 0.0
        routing[family] = ids[best] if means[best] > 0 and means[best] > confidence * error else default
    return {**routing, "default": default}


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
    run_dir: Path,
    routing: dict[str, str],
    ids: list[str],
    members: Sequence[Tensors],
    layout: AdapterLayout,
    scores: dict[str, dict[str, float]] | None = None,
) -> None:
    """adapters/organelles/<id>/ (PEFT) for every member, and routing.json naming them, with
    the selection scores (family -> member -> mean reward) the map was chosen on."""
    folder = run_dir / "adapters" / "organelles"
    shutil.rmtree(folder, ignore_errors=True)  # a resumed run's finish: members that died since are not exported
    for member_id, adapter in zip(ids, members):
        save_adapter(folder / member_id, adapter, layout)
    document = {"routing": routing, "adapters": {i: f"adapters/organelles/{i}" for i in ids}}
    if scores:
        document["selection_scores"] = scores
    (run_dir / ROUTING_FILE).write_text(json.dumps(document, indent=2) + "\n")


def evaluate_portfolio(
    pool: WorkerPool,
    ids: list[str],
    members: list[Tensors],
    splits: Any,
    train_routing: dict[str, str],
    *,
    confidence: float,
    max_loras: int,
    generation: int,
    spend: Spend,
) -> dict[str, Any]:
    """The routing map (on selection, else from training), and held-out metrics of the routed
    portfolio and of the single best member (the map's default)."""
    routing, scores = train_routing, {}
    if splits.selection:
        selection = evaluate_members(
            pool, members, "selection", len(splits.selection), [None] * len(members),
            max_loras=max_loras, generation=generation, spend=spend,
        )  # fmt: skip
        overall = selection["rewards"].mean(axis=1)
        default = ids[max(range(len(ids)), key=lambda i: (overall[i], -i))]
        routing = routing_map(selection["rewards"], splits.selection, ids, default, confidence)
        by_family = family_scores(selection["rewards"], splits.selection)
        scores = {family: dict(zip(ids, values)) for family, values in by_family.items()}
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
        "selection_scores": scores,
    }
