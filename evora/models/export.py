"""A model directory with some of its weights replaced: what full-weight strategies export.

Every file of the source model is copied (config, tokenizer, generation config, shard
index); each safetensors shard is rewritten with the replaced tensors cast to the dtype the
shard stores them in, so `AutoModelForCausalLM.from_pretrained` and `vllm serve` load the
folder as they load the original.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def model_folder(model_path: str, revision: str | None = None) -> Path:
    """The model's files on this machine: a local folder, or a hub snapshot."""
    folder = Path(model_path)
    if folder.is_dir():
        return folder
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_path, revision=revision))


def write_model(source: Path, out: Path, weights: dict[str, torch.Tensor]) -> Path:
    """Copy `source` to `out` with `weights` (checkpoint names) replaced; written to a
    temporary folder first, so `out` is either whole or absent."""
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    written: set[str] = set()
    for file in sorted(source.iterdir()):
        if file.is_file() and file.suffix != ".safetensors":
            shutil.copy2(file, partial / file.name)
    for shard in sorted(source.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            metadata = handle.metadata() or {"format": "pt"}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        for key, tensor in tensors.items():
            if key in weights:
                tensors[key] = weights[key].to(tensor.dtype).contiguous()
                written.add(key)
        save_file(tensors, str(partial / shard.name), metadata=metadata)
    missing = sorted(set(weights) - written)
    if missing:
        raise KeyError(f"{source}: no weight named {missing[0]} in its safetensors")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(partial, out)
    return out
