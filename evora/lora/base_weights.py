"""Base-model weights read from the model's safetensors: per-layer noise scales (as the
ES-over-LoRA notes scale them) and the matrices full-weight strategies start from.

Each layer's scale is the mean |W| over its target modules' base weights; the noise of
every adapter tensor in that layer is multiplied by it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

from evora.lora.layout import AdapterLayout


def weight_files(model_path: str, revision: str | None = None) -> list[Path]:
    folder = Path(model_path)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(model_path, revision=revision, allow_patterns=["*.safetensors"]))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path}: no .safetensors weights to take per-layer noise scales from")
    return files


def per_layer_scales(layout: AdapterLayout, model_path: str, revision: str | None = None) -> dict[str, float]:
    """Adapter tensor name -> multiplier of sigma."""
    wanted = {f"{slot.name}.weight": slot for slot in layout.modules}
    sums: dict[int | None, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for file in weight_files(model_path, revision):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                slot = wanted.get(key)
                if slot is not None:
                    weight = handle.get_tensor(key).float()
                    sums[slot.layer][0] += float(weight.abs().sum())
                    sums[slot.layer][1] += weight.numel()
    missing = [n for n, s in wanted.items() if s.layer not in sums]
    if missing:
        raise KeyError(f"base weights not found for {missing[:3]}")
    scales = {}
    for slot in layout.modules:
        total, count = sums[slot.layer]
        scales[slot.a_key] = scales[slot.b_key] = total / count
    return scales


def read_weights(model_path: str, names: list[str], revision: str | None = None) -> dict[str, torch.Tensor]:
    """The named tensors of a model's checkpoint (checkpoint names), in fp32."""
    wanted, out = set(names), {}
    for file in weight_files(model_path, revision):
        with safe_open(str(file), framework="pt") as handle:
            for key in wanted.intersection(handle.keys()):
                out[key] = handle.get_tensor(key).to(torch.float32)
    missing = sorted(wanted - set(out))
    if missing:
        raise KeyError(f"{model_path}: no weight named {missing[0]} in its safetensors ({len(missing)} missing)")
    return {name: out[name] for name in names}
