"""`python -m evora.engines.vllm_lora_probe ARCH`: prints whether vLLM's model class for ARCH
implements SupportsLoRA (true / false; null: vLLM has no class for it). Run in its own
process by `engines/support.py`: importing vLLM's model registry takes seconds."""

from __future__ import annotations

import importlib
import json
import sys


def supports_lora(architecture: str) -> bool | None:
    from vllm.model_executor.models.interfaces import supports_lora as implements
    from vllm.model_executor.models.registry import _VLLM_MODELS

    if architecture not in _VLLM_MODELS:
        return None
    module, name = _VLLM_MODELS[architecture]
    return bool(implements(getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)))


if __name__ == "__main__":
    print(json.dumps(supports_lora(sys.argv[1])))
