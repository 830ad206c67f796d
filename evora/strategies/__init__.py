"""Search strategies: ask/tell units that know nothing about Ray, vLLM or W&B, each in its
own folder and registered by name (`registry.py`). Importing this package registers the
built-in ones."""

from evora.strategies import es, ga, pbt  # noqa: E402,F401,I001  (registration, after the registry exists)
from evora.strategies.registry import StrategyEntry, entries, get_strategy, register_strategy, strategy_names

__all__ = ["StrategyEntry", "entries", "get_strategy", "register_strategy", "strategy_names"]
