"""What a run leaves in its folder at the finish, by the kind of strategy (`strategies/kinds.py`
names its exporter):

- adapters (population, gradient): `adapters/<center>` and `adapters/best`;
- a routed portfolio (the ecology): those, its members (`adapters/organelles`) and `routing.json`;
- full weights (EGGROLL, es_full, grpo_full): `model/` and `adapters/delta` (and `best_model/`, `adapters/best`).

Each returns an `Export`: the best (what the finish compares with the base model), the adapters
written, the summary's details, and the evaluation that comparison runs (`finish.Evaluate`)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from evora.distributed.evaluate import SplitOutcome
from evora.distributed.finish import Evaluate
from evora.distributed.full_weights import EngineWeights, original_weights
from evora.distributed.loop_state import Best, LoopState
from evora.distributed.portfolio import ROUTING_FILE, evaluate_portfolio, write_routing
from evora.distributed.scoring import CenterScoring
from evora.lora import Tensors
from evora.lora.peft_io import save_adapter
from evora.plan.run_plan import RunPlan
from evora.strategies.full_weights import MovesWeights
from evora.strategies.protocol import BASE, PortfolioStrategy
from evora.tracking.compute import Spend


@dataclass
class Export:
    best: Best
    adapters: dict[str, str]
    details: dict[str, Any]
    evaluate: Evaluate
    best_scored_by_report: bool = False  # the best's held-out metrics are the finish report's (a portfolio's)


class Centered(Protocol):
    def center(self, state: Any) -> Tensors: ...


class CenteredWeights(Centered, MovesWeights, Protocol):
    """A strategy that moves the engines' weights (es_full, EGGROLL, full-weight GRPO)."""


S = TypeVar("S", bound=Centered)


@dataclass
class ExportParts(Generic[S]):
    plan: RunPlan
    run_dir: Path
    strategy: S  # its kind's protocol: every kind's strategy has a center
    state: Any
    loop: LoopState
    done: int
    scoring: CenterScoring
    weights: EngineWeights | None
    spend: Spend  # the finish's evaluation compute

    def evaluate_at_best(self, best: Best) -> Evaluate:
        def evaluate(theta: Any, layout: Any, ops: list[str]) -> dict[str, SplitOutcome]:
            return self.scoring.outcomes("heldout", ops, best.generation, theta, self.spend)

        return evaluate


def export_adapters(parts: ExportParts[Centered]) -> Export:
    """adapters/<center> and adapters/best."""
    center = save_center(parts)
    loop = parts.loop
    best = loop.best or Best(float("nan"), parts.done, center, loop.last or {})
    return finish_adapters(parts, best, {}, {})


def export_portfolio(parts: ExportParts[PortfolioStrategy]) -> Export:
    """A routed portfolio (the ecology): its routing map, held-out metrics and exported members;
    adapters/best is its single best member on selection (the routing map's default)."""
    save_center(parts)
    strategy, layout = parts.strategy, parts.plan.layout
    ids, members = strategy.members(parts.state)
    result = evaluate_portfolio(
        parts.scoring.pool,
        ids,
        members,
        parts.plan.splits,
        strategy.train_routing(parts.state),
        confidence=strategy.routing_confidence,
        max_loras=parts.plan.run.engine.max_loras,
        generation=parts.done,
        spend=parts.spend,
    )
    scores = result.pop("selection_scores")
    write_routing(parts.run_dir, result["routing"], ids, members, layout, scores)
    details = {**strategy.details(parts.state), **result}
    best = Best(float("nan"), parts.done, members[ids.index(details["single_best"]["id"])], {})
    export = finish_adapters(parts, best, details, {"organelles": "adapters/organelles", "routing": ROUTING_FILE})
    export.best_scored_by_report = True
    return export


def save_center(parts: ExportParts[S]) -> dict[str, Any]:
    entry = parts.plan.entry
    center = parts.strategy.center(parts.state)
    save_adapter(parts.run_dir / "adapters" / (entry.center or "final"), center, parts.plan.layout)
    return center


def finish_adapters(parts: ExportParts[Any], best: Best, details: dict[str, Any], more: dict[str, str]) -> Export:
    save_adapter(parts.run_dir / "adapters" / "best", best.adapter, parts.plan.layout)
    center_name = parts.plan.entry.center or "final"
    adapters = {"best": "adapters/best", center_name: f"adapters/{center_name}", **more}
    return Export(best, adapters, details, parts.evaluate_at_best(best))


def export_weights(parts: ExportParts[CenteredWeights]) -> Export:
    """A full-weight run: model/ (the final weights, whole) and adapters/delta (their update as
    a LoRA); best_model/ and adapters/best when the best generation is an earlier one; the
    evaluation that compares the best generation's weights with the model's own."""
    plan, weights, done, run_dir = parts.plan, parts.weights, parts.done, parts.run_dir
    assert weights is not None, "a full-weight strategy's loop keeps the engines' weights"
    model, layout, rank = (plan.model_path, plan.run.model.revision), plan.layout, parts.strategy.delta_rank
    original = original_weights(model, layout)
    best = parts.loop.best or Best(float("nan"), done, {}, parts.loop.last or {})
    error = weights.export(run_dir, "model", "delta", original, model, layout, rank)
    details = {"delta_rank": rank, "delta_relative_error": error, "best_delta_relative_error": error}
    adapters = {"best": "adapters/best", "delta": "adapters/delta", "model": "model"}
    if best.generation != done:
        weights.to(parts.state, best.generation)
        details["best_delta_relative_error"] = weights.export(
            run_dir, "best_model", "best", original, model, layout, rank
        )
        adapters["best_model"] = "best_model"
    else:
        shutil.copytree(run_dir / "adapters" / "delta", run_dir / "adapters" / "best", dirs_exist_ok=True)

    def heldout_on_engine_weights() -> SplitOutcome:
        # No adapter: the engines' weights are the model evaluated.
        center = parts.strategy.center(parts.state)
        return parts.scoring.outcomes("heldout", [BASE], best.generation, center, parts.spend)[BASE]

    return Export(best, adapters, details, weights.compare_at(parts.state, best.generation, heldout_on_engine_weights))
