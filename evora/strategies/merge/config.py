"""strategy=merge: its config schema and the rules checked before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from evora.config.checks import choice, require
from evora.strategies.merge.sources import COMBINES, GRANULARITIES, check_sources

STOP, RESTART = "stop", "restart"  # strategy.on_cma_stop: what the run does when CMA-ES's stop() says so


@dataclass(frozen=True)
class MergeConfig:
    name: str = "merge"
    adapters: List[str] = field(default_factory=list)  # PEFT folders, run folders (adapters/best) or hub ids
    population: int = 0  # candidates per generation; 0: CMA-ES's default, 4 + floor(3 ln d)
    sigma: float = 0.2  # CMA-ES's initial step size, in units of an adapter's weight
    init_weight: Optional[float] = None  # every weight's start; None: 1 / len(adapters), the uniform average
    granularity: str = "adapter"  # adapter: a weight per adapter | layer: a weight per adapter and layer
    combine: str = "concat"  # concat: sum_i w_i B_i A_i exactly (rank sum r_i) | lorahub: (sum w_i B_i)(sum w_i A_i)
    bounds: Optional[List[float]] = None  # [low, high] for every weight (LoraHub's: [-1.5, 1.5]); None: unbounded
    l1: float = 0.0  # fitness - l1 * mean |w| (LoraHub's regulariser: 0.05)
    on_cma_stop: str = STOP  # stop: the run ends there | restart: a fresh CMA-ES from the mean, at the initial sigma


def check_merge(cfg: MergeConfig, run: Any = None) -> None:
    require(
        cfg.population == 0 or cfg.population >= 2,
        "strategy.population",
        cfg.population,
        "must be >= 2, or 0 (CMA-ES's default)",
    )
    require(cfg.sigma > 0, "strategy.sigma", cfg.sigma, "must be > 0")
    choice("strategy.granularity", cfg.granularity, GRANULARITIES)
    choice("strategy.combine", cfg.combine, COMBINES)
    choice("strategy.on_cma_stop", cfg.on_cma_stop, (STOP, RESTART))
    require(cfg.l1 >= 0, "strategy.l1", cfg.l1, "must be >= 0")
    if cfg.bounds is not None:
        bounds = list(cfg.bounds)
        require(
            len(bounds) == 2 and bounds[0] < bounds[1],
            "strategy.bounds",
            bounds,
            "must be [low, high] with low < high, or null",
        )
        start = cfg.init_weight if cfg.init_weight is not None else 1.0 / max(len(cfg.adapters), 1)
        require(bounds[0] <= start <= bounds[1], "strategy.bounds", bounds, f"must hold the initial weight {start:g}")
    check_sources(cfg.adapters, cfg.combine, None if run is None else run.lora.rank)
