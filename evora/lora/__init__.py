"""Adapter layout, PEFT I/O, seeded noise and initialisation. No Ray, vLLM or W&B here."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# A string inside: `import evora.lora` (every CLI command's strategy registry) stays torch-free.
Tensors = dict[str, "torch.Tensor"]  # an adapter (or any named set of tensors), by PEFT tensor name
