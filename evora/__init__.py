"""evora: evolve LoRA adapters of large language models on Ray and vLLM.

From Python: `evora.compose(*overrides)`, `evora.run(*overrides)` and `evora.load_run(path)`
(evora/api.py), imported on first use so that `import evora` stays light; `@evora.batch_reward`
declares a reward that scores a batch (evora/tasks/base.py)."""

from typing import Any

from evora.version import __version__

__all__ = ["Run", "__version__", "batch_reward", "compose", "load_run", "run"]


def __getattr__(name: str) -> Any:
    if name in ("Run", "compose", "load_run", "run"):
        from evora import api

        return getattr(api, name)
    if name == "batch_reward":
        from evora.tasks.base import batch_reward

        return batch_reward
    raise AttributeError(f"module 'evora' has no attribute {name!r}")
