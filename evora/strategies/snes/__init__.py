"""strategy=snes: separable natural evolution strategies over the LoRA tensors (Schaul et al. 2011)."""

from typing import TYPE_CHECKING

from evora.strategies.registry import lazy_exports, register_strategy
from evora.strategies.snes.config import SNESConfig, check_snes

register_strategy(
    "snes",
    config=SNESConfig,
    summary="separable NES over the LoRA tensors: a sigma per value, adapted (Schaul et al. 2011)",
    validate=check_snes,
    center="mean",
    summed=True,  # the workers sum the members' noise and its squares (separable.moment_group_sum)
    device_noise=True,  # drawn only on the workers: on their GPU under hardware.noise_device=auto
    report_keys=("population", "sigma", "lr", "sigma_lr", "shaping", "antithetic"),
    console_keys=(("update_norm", "|update|"), ("sigma_mean", "sigma")),
    strategy="evora.strategies.snes.strategy:SNES",
)

if TYPE_CHECKING:
    from evora.strategies.snes.strategy import SNES
__getattr__ = lazy_exports("evora.strategies.snes.strategy", ("SNES",))

__all__ = ["SNES", "SNESConfig"]
