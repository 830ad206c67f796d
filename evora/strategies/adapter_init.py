"""Where adapter-space strategies (es, ga) start: the initial adapter and per-tensor noise
scales, from the config fields they share (`noise_scale`, `init`, `init_a_std`,
`init_b_std`, `init_path`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evora.config.checks import choice, require
from evora.strategies.protocol import StrategyContext, Tensors

# The configs' checks (`check_init`) run in the CLI; the tensors' code, and torch, is imported
# by the two functions that make tensors, in the driver.


def initial_adapter(cfg: Any, context: StrategyContext) -> Tensors:
    from evora.lora.init import adapter_from_path, random_adapter

    if cfg.init == "path":
        return adapter_from_path(context.layout, cfg.init_path)
    return random_adapter(context.layout, context.seed, cfg.init_a_std, cfg.init_b_std)


def noise_scales(cfg: Any, context: StrategyContext) -> dict[str, float]:
    """Tensor name -> sigma multiplier; empty for uniform noise."""
    from evora.lora.base_weights import per_layer_scales

    if cfg.noise_scale != "per_layer":
        return {}
    return per_layer_scales(context.layout, context.model_path, context.revision)


def check_init(cfg: Any) -> None:
    choice("strategy.noise_scale", cfg.noise_scale, ("uniform", "per_layer"))
    choice("strategy.init", cfg.init, ("random", "path"))
    if cfg.init_a_std is not None:
        require(cfg.init_a_std >= 0, "strategy.init_a_std", cfg.init_a_std, "must be >= 0, or null")
    require(cfg.init_b_std >= 0, "strategy.init_b_std", cfg.init_b_std, "must be >= 0")
    if cfg.init == "path":
        path = cfg.init_path
        require(
            path is not None and (Path(path) / "adapter_config.json").is_file(),
            "strategy.init_path",
            path,
            "must be a PEFT adapter directory when strategy.init=path",
        )
