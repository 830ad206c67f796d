"""Adapters on disk in PEFT's layout: adapter_config.json + adapter_model.safetensors.

vLLM ignores `layers_to_transform`, so only the chosen layers' tensors are written:
both PeftModel and vLLM then apply exactly the same modules.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from evora.lora.layout import Adaptable, AdapterLayout

if TYPE_CHECKING:  # safetensors.torch is imported where tensors are read or written: the CLI's
    import torch  # config checks read adapter_config.json only, without torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


def adapter_config(layout: AdapterLayout) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": layout.base_model,
        "r": layout.rank,
        "lora_alpha": layout.alpha,
        "target_modules": list(layout.target_modules),
        "layers_to_transform": None if layout.layers is None else list(layout.layers),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": layout.fan_in_fan_out,  # GPT-2's Conv1D stores weights [in, out]
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
    }


def check_tensors(tensors: dict[str, torch.Tensor], layout: AdapterLayout) -> None:
    """The tensors are exactly the layout's (PEFT names)."""
    shapes = layout.shapes()
    if set(tensors) != set(shapes):
        raise ValueError(f"adapter tensors do not match the layout: {sorted(set(tensors) ^ set(shapes))[:4]}")


def save_adapter(
    directory: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    layout: AdapterLayout,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write `tensors` (PEFT names) as an adapter folder; `dtype` casts (the engine's dtype)."""
    from safetensors.torch import save_file

    check_tensors(tensors, layout)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    # On the host: a candidate drawn on a GPU (hardware.noise_device) is written from there.
    out = {name: (t.to(dtype) if dtype is not None else t).contiguous().cpu() for name, t in tensors.items()}
    save_file(out, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(adapter_config(layout), indent=2))
    return folder


def load_adapter_tensors(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The adapter's tensors in fp32 (master precision)."""
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(Path(directory) / WEIGHTS_FILE)).items()}


def read_adapter_config(directory: str | os.PathLike) -> dict:
    return json.loads((Path(directory) / CONFIG_FILE).read_text())


def layout_of_adapter(
    directory: str | os.PathLike, modules: dict[str, Adaptable], key: str = "adapter"
) -> AdapterLayout:
    """The layout a PEFT adapter folder describes, checked against its tensors."""
    from safetensors import safe_open

    from evora.errors import ConfigError
    from evora.lora.layout import build_layout

    folder = Path(directory)
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise ConfigError(f'{key}="{directory}": not a PEFT adapter folder ({CONFIG_FILE} + {WEIGHTS_FILE})')
    config = read_adapter_config(folder)
    targets, layers = config["target_modules"], config.get("layers_to_transform")
    if isinstance(targets, str):
        raise ConfigError(f'{key}="{directory}": target_modules given as a regex is not supported; list the modules')
    layout = build_layout(
        modules,
        rank=config["r"],
        alpha=config["lora_alpha"],
        target_modules=targets,
        layers=[layers] if isinstance(layers, int) else layers,
        base_model=config.get("base_model_name_or_path") or "",
    )
    with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as handle:
        stored = set(handle.keys())
    if stored != set(layout.shapes()):
        missing = sorted(set(layout.shapes()) - stored)[:2]
        raise ConfigError(
            f'{key}="{directory}": its tensors do not match its adapter_config.json and the model '
            f"(e.g. missing {missing})"
        )
    return layout
