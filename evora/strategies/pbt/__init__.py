"""strategy=pbt: LoRALab-style hyperparameter search (rank, alpha, learning rate, dropout,
target modules) as Ray Tune population-based training; members train LoRA by gradient
descent and are scored on the engine workers. The runner (`evora/jobs/pbt/`, Ray Tune) is
imported only when a PBT job starts."""

from evora.strategies.pbt.config import PBTConfig, check_pbt
from evora.strategies.registry import register_strategy

# Ray Tune reads these in the process that runs it, the CLI's: no console tables or snapshot
# warnings of its own, and no result files of its own (evora prints one line per result and
# writes trials.jsonl).
TUNE_ENVIRONMENT = (
    ("RAY_AIR_NEW_OUTPUT", "0"),
    ("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0"),
    ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1"),
)

register_strategy(
    "pbt",
    config=PBTConfig,
    summary="LoRALab-style hyperparameter search, as Ray Tune population-based training",
    runner="evora.jobs.pbt.run:run_pbt",
    validate=check_pbt,
    report_keys=("population", "steps_per_generation", "ranks", "learning_rates", "keep_top_fraction", "fitness"),
    analysis="evora.strategies.pbt.analysis:ANALYSIS",
    environment=TUNE_ENVIRONMENT,
)

__all__ = ["PBTConfig"]
