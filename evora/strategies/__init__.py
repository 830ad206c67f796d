"""Search strategies: ask/tell units that know nothing about Ray, vLLM or W&B, each in its
own folder and registered by name (`registry.py`). Importing this package imports every
strategy folder in it, which registers it: adding a strategy touches no file outside its
folder (and its conf/strategy/<name>.yaml)."""

import importlib
import pkgutil

from evora.strategies.registry import StrategyEntry, entries, get_strategy, register_strategy, strategy_names

for _folder in pkgutil.iter_modules(__path__):
    if _folder.ispkg:
        importlib.import_module(f"{__name__}.{_folder.name}")

__all__ = ["StrategyEntry", "entries", "get_strategy", "register_strategy", "strategy_names"]
