"""strategy=grpo_full: GRPO through TRL's GRPOTrainer over the model's own matrices (the ES
paper's GRPO baselines train full weights), on the same contract as every strategy."""

from typing import TYPE_CHECKING

from evora.strategies.grpo_full.config import GRPOFullConfig, check_grpo_full
from evora.strategies.kinds import TRAINED_WEIGHTS
from evora.strategies.registry import lazy_exports, register_strategy

register_strategy(
    "grpo_full",
    config=GRPOFullConfig,
    kind=TRAINED_WEIGHTS,
    summary="GRPO over the model's own matrices through TRL's GRPOTrainer (the ES paper's GRPO baseline)",
    validate=check_grpo_full,
    center="delta",  # adapters/delta: the trained weights' change as a LoRA (model/ holds them whole)
    report_keys=("learning_rate", "num_generations", "prompts_per_step", "beta", "budget_flops", "match"),
    console_keys=(("reward", "group reward"), ("loss", "loss"), ("update_norm", "|update|")),
    strategy="evora.strategies.grpo_full.strategy:FullWeightGRPO",
)

if TYPE_CHECKING:
    from evora.strategies.grpo_full.strategy import FullWeightGRPO, TrainedWeightsState, WeightsUpdate
__getattr__ = lazy_exports(
    "evora.strategies.grpo_full.strategy", ("FullWeightGRPO", "TrainedWeightsState", "WeightsUpdate")
)

__all__ = ["FullWeightGRPO", "GRPOFullConfig", "TrainedWeightsState", "WeightsUpdate", "check_grpo_full"]
