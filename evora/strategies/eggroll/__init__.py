"""strategy=eggroll: full-weight ES with low-rank perturbations (EGGROLL, arXiv 2511.16652)."""

from evora.strategies.eggroll.config import EggrollConfig, check_eggroll
from evora.strategies.eggroll.strategy import EggrollPayload, EggrollState, EggrollStrategy, WeightUpdate
from evora.strategies.kinds import FULL_WEIGHT
from evora.strategies.registry import register_strategy

register_strategy(
    "eggroll",
    config=EggrollConfig,
    kind=FULL_WEIGHT,
    summary="full-weight ES with rank-r perturbations evaluated as multi-LoRA batches (EGGROLL)",
    validate=check_eggroll,
    center="delta",  # adapters/delta: the final weights' update as a LoRA (model/ holds them whole)
    report_keys=("population", "rank", "sigma", "lr", "shaping", "optimizer"),
    console_keys=(("update_norm", "|update|"),),
)(EggrollStrategy)

__all__ = ["EggrollConfig", "EggrollPayload", "EggrollState", "EggrollStrategy", "WeightUpdate"]
