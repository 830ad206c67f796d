"""strategy=es: evolution strategies over the LoRA tensors (Salimans et al. 2017; Qiu et al. 2025)."""

from typing import TYPE_CHECKING

from evora.strategies.es.config import ESConfig, check_es
from evora.strategies.registry import lazy_exports, register_strategy

register_strategy(
    "es",
    config=ESConfig,
    summary="evolution strategies over the LoRA tensors (antithetic, z-score, SGD/Adam)",
    validate=check_es,
    center="mean",
    summed=True,  # the workers sum the members' noise (strategies/noise_sums.py)
    device_noise=True,  # drawn only on the workers (materialise, group_sum): on their GPU under noise_device=auto
    report_keys=("population", "sigma", "lr", "antithetic", "shaping", "optimizer"),
    console_keys=(("update_norm", "|update|"),),
    strategy="evora.strategies.es.strategy:EvolutionStrategy",
)

if TYPE_CHECKING:
    from evora.strategies.es.strategy import ESPayload, ESState, EvolutionStrategy
__getattr__ = lazy_exports("evora.strategies.es.strategy", ("ESPayload", "ESState", "EvolutionStrategy"))

__all__ = ["ESConfig", "ESPayload", "ESState", "EvolutionStrategy"]
