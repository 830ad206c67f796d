"""strategy=ecology: a population of LoRA organelles in an energy economy, routed per task
family, learning within, by selection and by merging (Evolora)."""

from typing import TYPE_CHECKING

from evora.strategies.ecology.config import EcologyConfig, check_ecology
from evora.strategies.kinds import PORTFOLIO
from evora.strategies.registry import lazy_exports, register_strategy

register_strategy(
    "ecology",
    config=EcologyConfig,
    kind=PORTFOLIO,
    refines=True,
    summary="an ecology of LoRA organelles: energy economy, per-family routing, merging, QD archive",
    validate=check_ecology,
    center="best_organelle",
    report_keys=("condition", "organelles", "max_population", "plasticity", "router", "uplift_threshold"),
    console_keys=(("population", "pop"), ("total_energy", "energy"), ("roi_mean", "roi")),
    analysis="evora.strategies.ecology.analysis:ANALYSIS",
    strategy="evora.strategies.ecology.strategy:Ecology",
)

if TYPE_CHECKING:
    from evora.strategies.ecology.strategy import Ecology, EcologyPayload, EcologyState, EcoSpec
__getattr__ = lazy_exports(
    "evora.strategies.ecology.strategy", ("Ecology", "EcologyPayload", "EcologyState", "EcoSpec")
)

__all__ = ["EcoSpec", "Ecology", "EcologyConfig", "EcologyPayload", "EcologyState"]
