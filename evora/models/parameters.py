"""How many parameters a base model has (P in the compute accounting), without loading it:
from the safetensors headers of a local folder, or from a hub model's config on the meta
device (no weights)."""

from __future__ import annotations

import math
from pathlib import Path

from safetensors import safe_open


def count_parameters(model_path: str, revision: str | None = None, trust_remote_code: bool = False) -> int:
    files = sorted(Path(model_path).glob("*.safetensors")) if Path(model_path).is_dir() else []
    if files:
        total = 0
        for file in files:
            # framework="numpy": shapes only, read from the header (bf16 and fp8 too), and no
            # torch import in the CLI, which plans every run with this count.
            with safe_open(str(file), framework="numpy") as handle:
                total += sum(math.prod(handle.get_slice(key).get_shape()) for key in handle.keys())
        return total
    return _count_from_config(model_path, revision, trust_remote_code)


def _count_from_config(model_path: str, revision: str | None, trust_remote_code: bool) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, revision=revision, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in model.parameters())
