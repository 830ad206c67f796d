"""strategy=randopt: RandOpt's perturb, top-K ensemble and distil loop, iterated over rounds."""

from typing import TYPE_CHECKING

from evora.strategies.randopt.config import RandOptConfig, check_randopt
from evora.strategies.registry import lazy_exports, register_strategy

register_strategy(
    "randopt",
    config=RandOptConfig,
    summary="RandOpt: random perturbations, the top K as an ensemble, its answers distilled by SFT, round after round",
    validate=check_randopt,
    center="distilled",
    refines=True,
    device_noise=True,  # drawn only on the workers (materialise): on their GPU under noise_device=auto
    report_keys=("population", "sigma", "top_k", "targets", "distil_from", "sft_epochs", "sft_learning_rate"),
    console_keys=(("ensemble_accuracy", "ensemble"), ("distil_examples", "distilled")),
    strategy="evora.strategies.randopt.strategy:RandOpt",
)

if TYPE_CHECKING:
    from evora.strategies.randopt.strategy import RandOpt
__getattr__ = lazy_exports("evora.strategies.randopt.strategy", ("RandOpt",))

__all__ = ["RandOpt", "RandOptConfig"]
