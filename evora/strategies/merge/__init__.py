"""strategy=merge: CMA-ES over the weights of a combination of existing LoRA adapters."""

from evora.strategies.merge.config import MergeConfig, check_merge
from evora.strategies.merge.strategy import Merge
from evora.strategies.registry import register_strategy

register_strategy(
    "merge",
    config=MergeConfig,
    summary="evolutionary merging of existing LoRA adapters: CMA-ES over their weights (the cma package)",
    validate=check_merge,
    center="merged",
    report_keys=("adapters", "population", "sigma", "granularity", "combine", "bounds", "l1", "on_cma_stop"),
    console_keys=(("cma_sigma", "cma sigma"),),
)(Merge)

__all__ = ["Merge", "MergeConfig"]
