"""strategy=pgpe: PGPE, symmetric sampling, ClipUp, over the LoRA tensors (Sehnke et al. 2010; Toklu et al. 2020)."""

from typing import TYPE_CHECKING

from evora.strategies.pgpe.config import PGPEConfig, check_pgpe
from evora.strategies.registry import lazy_exports, register_strategy

register_strategy(
    "pgpe",
    config=PGPEConfig,
    summary="PGPE over the LoRA tensors: symmetric pairs, a sigma per value, ClipUp (Sehnke et al. 2010)",
    validate=check_pgpe,
    center="mean",
    summed=True,  # the workers sum the members' noise and its squares (separable.moment_group_sum)
    device_noise=True,  # drawn only on the workers: on their GPU under hardware.noise_device=auto
    report_keys=("population", "sigma", "lr", "sigma_lr", "optimizer", "shaping"),
    console_keys=(("update_norm", "|update|"), ("sigma_mean", "sigma")),
    strategy="evora.strategies.pgpe.strategy:PGPE",
)

if TYPE_CHECKING:
    from evora.strategies.pgpe.strategy import PGPE
__getattr__ = lazy_exports("evora.strategies.pgpe.strategy", ("PGPE",))

__all__ = ["PGPE", "PGPEConfig"]
