"""strategy=pbt: LoRALab-style hyperparameter search (rank, alpha, learning rate, dropout,
target modules) as Ray Tune population-based training; members train LoRA by gradient
descent and are scored on the engine workers. The runner (`evora/jobs/pbt/`, Ray Tune) is
imported only when a PBT job starts."""

from evora.strategies.pbt.config import PBTConfig, check_pbt
from evora.strategies.registry import register_strategy

register_strategy(
    "pbt",
    config=PBTConfig,
    summary="LoRALab-style hyperparameter search, as Ray Tune population-based training",
    runner="evora.jobs.pbt.run:run_pbt",
    validate=check_pbt,
    report_keys=("population", "steps_per_generation", "ranks", "learning_rates", "keep_top_fraction", "fitness"),
    analysis="evora.strategies.pbt.analysis:ANALYSIS",
)

__all__ = ["PBTConfig"]
