"""A routed portfolio of adapters (the ecology's organelles), evaluated on the worker pool.

The routing map (family -> member) is chosen on the selection split: every member is
evaluated on all of it and each family goes to the member with the best mean reward on
that family's examples when it beats the single best member overall there with confidence
(`routing_map`), else to that single best; so do families the selection split lacks
(held-out-only families). Without a selection split the strategy's own train
statistics choose (`strategy.train_routing`). On held-out each example is then
evaluated by its family's member only, in one pass of MEMBER specs routed to prompts.
`evora eval adapter=<run>/routing.json` reads the map back (`read_routing`) and evaluates
it the same way (`evaluate_routed`), so it reproduces the run's numbers.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import ray

from evora.distributed.evaluate import rows_of, spend_of
from evora.distributed.pool import WorkerPool
from evora.distributed.units import EVAL_CHUNK, chunks
from evora.distributed.worker import WorkUnit
from evora.errors import ConfigError
from evora.lora.layout import AdapterLayout
from evora.lora.peft_io import save_adapter
from evora.strategies.protocol import MEMBER, CandidateSpec, MembersPayload, Tensors
from evora.tasks.base import Example
from evora.tracking.compute import Spend

ROUTING_FILE = "routing.json"


@dataclass(frozen=True)
class RoutingFile:
    """A run's routing.json, read back: the map and its members' adapter folders, in file order."""

    path: Path
    routing: dict[str, str]  # family -> member id, and "default"
    ids: tuple[str, ...]
    folders: tuple[Path, ...]  # PEFT adapter folders (paths in the file are relative to its folder)


def read_routing(path: str | Path) -> RoutingFile:
    """routing.json as `write_routing` writes it; anything else is one ConfigError naming the file."""
    file = Path(path)

    def bad(reason: str) -> ConfigError:
        return ConfigError(f'adapter="{file}": {reason}')

    if not file.is_file():
        raise bad("file not found (a run's routing.json)")
    try:
        document = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise bad(f"not JSON ({error})") from None
    for key in ("routing", "adapters"):
        if not isinstance(document, dict) or not isinstance(document.get(key), dict) or not document[key]:
            raise bad(f'no "{key}" map (a routing file has "routing": family -> member, "adapters": member -> folder)')
    routing, adapters = document["routing"], document["adapters"]
    if "default" not in routing:
        raise bad('"routing" has no "default" member (families it does not name go there)')
    for family, member in routing.items():
        if not isinstance(member, str) or member not in adapters:
            raise bad(f'"routing": {family} -> {member}: not one of its "adapters" ({", ".join(adapters)})')
    folders = []
    for member, folder in adapters.items():
        if not isinstance(folder, str) or not (file.parent / folder).is_dir():
            raise bad(f'member {member}: adapter folder "{folder}" not found (relative to {file.parent})')
        folders.append(file.parent / folder)
    return RoutingFile(file, dict(routing), tuple(adapters), tuple(folders))


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
    keep_texts: bool = False,
) -> dict[str, np.ndarray]:
    """rewards, correct, tokens [member, example] of the first `size` examples of `split`, and
    `evaluated`: each member on its routed examples (None: all); keep_texts: also `texts`, the
    completions ("" where not evaluated)."""
    specs = [CandidateSpec(generation, i, member=i, op=MEMBER, prompts=routes[i]) for i in range(len(members))]
    units = [
        WorkUnit(tuple(group), split, tuple(block), keep_texts)
        for block in chunks(list(range(size)), EVAL_CHUNK)
        for group in chunks(specs, max_loras)
    ]
    results = pool.run(ray.put(MembersPayload(tuple(members))), units)
    spend.add(spend_of(results))
    out = {name: np.zeros((len(members), size), dtype=dtype) for name, dtype in
           (("rewards", np.float64), ("correct", np.float64), ("tokens", np.float64), ("evaluated", bool))}  # fmt: skip
    if keep_texts:
        out["texts"] = np.full((len(members), size), "", dtype=object)
    for unit, result in zip(units, results):
        columns = list(unit.prompt_indices)
        for row, index in enumerate(result.indices):
            mask = result.evaluated[row] if result.evaluated is not None else np.ones(len(columns), dtype=bool)
            out["rewards"][index, columns] = np.where(mask, result.rewards[row], 0.0)
            out["correct"][index, columns] = result.correct[row]
            out["tokens"][index, columns] = result.tokens[row]
            out["evaluated"][index, columns] = mask
            if keep_texts:
                out["texts"][index, columns] = rows_of(result.texts, row)
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


def family_metrics(
    matrices: dict[str, np.ndarray], row_of_example: list[int], examples: Sequence[Example]
) -> dict[str, dict[str, float]]:
    """family -> its examples' count and metrics of the example-wise routed outcomes."""
    out = {}
    for family in sorted({e.family for e in examples}):
        columns = [j for j, e in enumerate(examples) if e.family == family]
        picked = {name: matrices[name][:, columns] for name in ("rewards", "correct", "tokens")}
        out[family] = {"examples": len(columns), **metrics_of(picked, [row_of_example[j] for j in columns])}
    return out


def routed_rows(routing: dict[str, str], ids: list[str], examples: Sequence[Example]) -> list[int]:
    return [ids.index(routing.get(e.family, routing["default"])) for e in examples]


def evaluate_routed(
    pool: WorkerPool,
    ids: list[str],
    members: Sequence[Tensors],
    routing: dict[str, str],
    split: str,
    examples: Sequence[Example],
    *,
    max_loras: int,
    generation: int,
    spend: Spend,
    keep_texts: bool = False,
) -> tuple[dict[str, np.ndarray], list[int]]:
    """Each example of `split` by its family's member (`routing`; families it lacks: "default"),
    in one pass; the default member is evaluated on every example, since it is the portfolio's
    rival (the single best). Returns the [member, example] matrices and each example's row."""
    rows = routed_rows(routing, ids, examples)
    single = ids.index(routing["default"])
    routes = [None if i == single else tuple(j for j, r in enumerate(rows) if r == i) for i in range(len(members))]
    matrices = evaluate_members(
        pool, members, split, len(examples), routes,
        max_loras=max_loras, generation=generation, spend=spend, keep_texts=keep_texts,
    )  # fmt: skip
    return matrices, rows


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
    document: dict[str, Any] = {"routing": routing, "adapters": {i: f"adapters/organelles/{i}" for i in ids}}
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
    single = ids.index(routing["default"])
    matrices, rows = evaluate_routed(
        pool, ids, members, routing, "heldout", heldout, max_loras=max_loras, generation=generation, spend=spend
    )
    return {
        "routing": routing,
        "portfolio": metrics_of(matrices, rows),
        "single_best": {"id": routing["default"], **metrics_of(matrices, [single] * len(heldout))},
        "members": len(members),
        "selection_scores": scores,
    }
