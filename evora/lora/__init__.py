"""Adapter layout, PEFT I/O, seeded noise and initialisation. No Ray, vLLM or W&B here."""

import torch

Tensors = dict[str, torch.Tensor]  # an adapter (or any named set of tensors), by PEFT tensor name
