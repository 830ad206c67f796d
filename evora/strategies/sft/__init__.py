"""strategy=sft: LoRA supervised fine-tuning on the task's reference answers, a baseline
on the same contract (held-out every eval_every, selection, best-vs-base), optionally to a
compute budget or matched to another run (`strategy.match=<run dir>`)."""

from typing import TYPE_CHECKING

from evora.strategies.kinds import GRADIENT
from evora.strategies.registry import lazy_exports, register_strategy
from evora.strategies.sft.config import SFTConfig, check_sft

register_strategy(
    "sft",
    config=SFTConfig,
    kind=GRADIENT,
    summary="LoRA supervised fine-tuning on the reference answers (a baseline; budgets, match=<run>)",
    validate=check_sft,
    center="trained",
    report_keys=("learning_rate", "steps_per_generation", "batch_size", "budget_flops", "match"),
    console_keys=(("loss", "loss"),),
    strategy="evora.strategies.sft.strategy:SupervisedFineTuning",
)

if TYPE_CHECKING:
    from evora.strategies.sft.strategy import SupervisedFineTuning
__getattr__ = lazy_exports("evora.strategies.sft.strategy", ("SupervisedFineTuning",))

__all__ = ["SFTConfig", "SupervisedFineTuning"]
