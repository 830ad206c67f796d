"""Candidate adapters, each under a fresh LoRA id: on tmpfs (`/dev/shm`), removed after
use, or held in memory for an engine that loads tensors (vLLM in-process).

Folders are named `evora-<run tag>-<pid>`, so the driver can also sweep away what a
killed worker left behind (`sweep_run_scratch`).
"""

from __future__ import annotations

import os
import shutil
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from evora.engines.base import AdapterRef
from evora.lora.layout import AdapterLayout
from evora.lora.peft_io import adapter_config, check_tensors, save_adapter

if TYPE_CHECKING:  # annotations only: the launcher sweeps scratch (`sweep_run_scratch`) without torch
    import torch


class AdapterScratch:
    def __init__(self, root: str, run_tag: str):
        self.dir = Path(root) / f"evora-{run_tag}-{os.getpid()}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._next_id = 1
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.dir), True)

    def write(
        self, label: str, tensors: dict[str, torch.Tensor], layout: AdapterLayout, dtype: torch.dtype
    ) -> AdapterRef:
        lora_id = self._fresh_id()
        path = save_adapter(self.dir / str(lora_id), tensors, layout, dtype)
        return AdapterRef(lora_id, f"{label}#{lora_id}", str(path))

    def hold(
        self, label: str, tensors: dict[str, torch.Tensor], layout: AdapterLayout, dtype: torch.dtype
    ) -> AdapterRef:
        """The adapter in memory: the tensors `write` would save (cast, contiguous), and its config."""
        check_tensors(tensors, layout)
        lora_id = self._fresh_id()
        cast = {name: t.to(dtype).contiguous() for name, t in tensors.items()}
        return AdapterRef(lora_id, f"{label}#{lora_id}", "", cast, adapter_config(layout))

    def keep(
        self, label: str, tensors: dict[str, torch.Tensor], layout: AdapterLayout, dtype: torch.dtype, in_memory: bool
    ) -> AdapterRef:
        """`hold` for an engine that loads adapters from memory, else `write`."""
        return (self.hold if in_memory else self.write)(label, tensors, layout, dtype)

    def _fresh_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def remove(self, refs: list[AdapterRef]) -> None:
        for ref in refs:
            if ref.path:
                shutil.rmtree(ref.path, ignore_errors=True)

    def cleanup(self) -> None:
        self._finalizer()


def sweep_run_scratch(root: str, run_tag: str) -> int:
    """Remove every scratch folder of a run; returns how many were left behind."""
    leftovers = list(Path(root).glob(f"evora-{run_tag}-*"))
    for folder in leftovers:
        shutil.rmtree(folder, ignore_errors=True)
    return len(leftovers)
