"""Per-layer noise scales from the base model's weights (as the ES-over-LoRA notes scale it).

Each layer's scale is the mean |W| over its target modules' base weights; the noise of
every adapter tensor in that layer is multiplied by it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from safetensors import safe_open

from evora.lora.layout import AdapterLayout


def _weight_files(model_path: str, revision: str | None) -> list[Path]:
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
    for file in _weight_files(model_path, revision):
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
