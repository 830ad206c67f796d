"""strategy=grpo: GRPO with a LoRA adapter through TRL's GRPOTrainer, a baseline on the same
contract (held-out every eval_every, selection, best-vs-base), optionally to a compute
budget or matched to another run (`strategy.match=<run dir>`)."""

from typing import TYPE_CHECKING

from evora.strategies.grpo.config import GRPOConfig, check_grpo
from evora.strategies.kinds import GRADIENT
from evora.strategies.registry import lazy_exports, register_strategy

register_strategy(
    "grpo",
    config=GRPOConfig,
    kind=GRADIENT,
    summary="GRPO with a LoRA adapter through TRL's GRPOTrainer (a baseline; budgets, match=<run>)",
    validate=check_grpo,
    center="trained",
    report_keys=("learning_rate", "num_generations", "prompts_per_step", "beta", "budget_flops", "match"),
    console_keys=(("reward", "group reward"), ("loss", "loss")),
    strategy="evora.strategies.grpo.strategy:GroupRelativePolicyOptimization",
)

if TYPE_CHECKING:
    from evora.strategies.grpo.strategy import GroupRelativePolicyOptimization
__getattr__ = lazy_exports("evora.strategies.grpo.strategy", ("GroupRelativePolicyOptimization",))

__all__ = ["GRPOConfig", "GroupRelativePolicyOptimization"]
