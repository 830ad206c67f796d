"""strategy=merge: CMA-ES over the weights of a combination of existing LoRA adapters."""

from typing import TYPE_CHECKING

from evora.strategies.merge.config import MergeConfig, check_merge
from evora.strategies.registry import lazy_exports, register_strategy

register_strategy(
    "merge",
    config=MergeConfig,
    summary="evolutionary merging of existing LoRA adapters: CMA-ES over their weights (the cma package)",
    validate=check_merge,
    center="merged",
    report_keys=("adapters", "population", "sigma", "granularity", "combine", "bounds", "l1", "on_cma_stop"),
    console_keys=(("cma_sigma", "cma sigma"),),
    strategy="evora.strategies.merge.strategy:Merge",
)

if TYPE_CHECKING:
    from evora.strategies.merge.strategy import Merge
__getattr__ = lazy_exports("evora.strategies.merge.strategy", ("Merge",))

__all__ = ["Merge", "MergeConfig"]
