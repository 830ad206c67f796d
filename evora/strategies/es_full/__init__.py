"""strategy=es_full: the ES paper's own algorithm over full weights ("Evolution Strategies at
Scale: LLM Fine-Tuning Beyond Reinforcement Learning", Qiu et al. 2025): dense Gaussian
perturbations of every selected matrix, each candidate evaluated on the engine's own weights."""

from typing import TYPE_CHECKING

from evora.strategies.es_full.config import EsFullConfig, check_es_full
from evora.strategies.kinds import FULL_WEIGHT
from evora.strategies.registry import lazy_exports, register_strategy

register_strategy(
    "es_full",
    config=EsFullConfig,
    kind=FULL_WEIGHT,
    in_place=True,
    summary="full-weight ES with dense perturbations set into the engines' weights in place (the ES paper's)",
    validate=check_es_full,
    center="delta",  # adapters/delta: the final weights' update as a LoRA (model/ holds them whole)
    report_keys=("population", "sigma", "lr", "antithetic", "shaping", "weight_decay"),
    console_keys=(("update_norm", "|update|"),),
    strategy="evora.strategies.es_full.strategy:EsFullStrategy",
)

if TYPE_CHECKING:
    from evora.strategies.es_full.strategy import EsFullPayload, EsFullState, EsFullStrategy, EsFullUpdate
__getattr__ = lazy_exports(
    "evora.strategies.es_full.strategy", ("EsFullPayload", "EsFullState", "EsFullStrategy", "EsFullUpdate")
)

__all__ = ["EsFullConfig", "EsFullPayload", "EsFullState", "EsFullStrategy", "EsFullUpdate", "check_es_full"]
