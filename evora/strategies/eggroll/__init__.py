"""strategy=eggroll: full-weight ES with low-rank perturbations (EGGROLL, arXiv 2511.16652)."""

from typing import TYPE_CHECKING

from evora.strategies.eggroll.config import EggrollConfig, check_eggroll
from evora.strategies.kinds import FULL_WEIGHT
from evora.strategies.registry import lazy_exports, register_strategy

register_strategy(
    "eggroll",
    config=EggrollConfig,
    kind=FULL_WEIGHT,
    summary="full-weight ES with rank-r perturbations evaluated as multi-LoRA batches (EGGROLL)",
    validate=check_eggroll,
    center="delta",  # adapters/delta: the final weights' update as a LoRA (model/ holds them whole)
    report_keys=("population", "rank", "sigma", "lr", "shaping", "optimizer"),
    console_keys=(("update_norm", "|update|"),),
    strategy="evora.strategies.eggroll.strategy:EggrollStrategy",
)

if TYPE_CHECKING:
    from evora.strategies.eggroll.strategy import EggrollPayload, EggrollState, EggrollStrategy, WeightUpdate
__getattr__ = lazy_exports(
    "evora.strategies.eggroll.strategy", ("EggrollPayload", "EggrollState", "EggrollStrategy", "WeightUpdate")
)

__all__ = ["EggrollConfig", "EggrollPayload", "EggrollState", "EggrollStrategy", "WeightUpdate"]
