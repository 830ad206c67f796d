"""LoRA supervised training (PEFT + transformers), as a PBT member trains: the task's train
split, prompt -> reference completion, loss on the completion only.

AdamW with weight decay, gradient clipping, linear warm-up over the first warmup_ratio
of all steps then linear decay, batch size and gradient accumulation from config,
bf16 autocast on GPUs that have it. `state()` and the constructor's `adapter`,
`optimizer_state` and `step` make it resumable from a checkpoint; the optimizer state is
dropped when the adapter's shape changed (another rank or other modules).

The LoRA comes as a typed `LoraSpec` (the one `GRPOTraining` takes) and the peak learning rate
in `TrainSettings`: PBT converts Tune's dict encoding of a member to these at the Tune
boundary (`evora/jobs/pbt/trial.py`).
"""

from __future__ import annotations

import random
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from evora.lora import Tensors
from evora.lora.keys import noise_key
from evora.training.lora_spec import LoraSpec

Pair = tuple[list[int], list[int]]  # (prompt ids, target ids)


@dataclass(frozen=True)
class TrainSettings:
    learning_rate: float  # the peak of the warm-up and decay schedule
    batch_size: int
    gradient_accumulation: int
    weight_decay: float
    max_grad_norm: float
    warmup_ratio: float
    total_steps: int
    seed: int


def lr_at(step: int, settings: TrainSettings) -> float:
    peak = settings.learning_rate
    warmup = max(1, int(settings.warmup_ratio * settings.total_steps))
    if step < warmup:
        return peak * (step + 1) / warmup
    remaining = max(settings.total_steps - warmup, 1)
    return peak * max(0.0, 1 - (step - warmup) / remaining)


def batch_of(pairs: list[Pair], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask, and labels that score only the targets."""
    rows = [p + t for p, t in pairs]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ((prompt, target), row) in enumerate(zip(pairs, rows)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        labels[i, len(prompt) : len(row)] = torch.tensor(target)
    return ids, mask, labels


class LoraSFT:
    def __init__(
        self,
        model_path: str,
        lora: LoraSpec,
        settings: TrainSettings,
        pairs: list[Pair],
        pad_id: int,
        adapter: Tensors | None = None,
        optimizer_state: dict | None = None,
        step: int = 0,
        device: str = "cpu",
    ):
        from peft import get_peft_model, set_peft_model_state_dict
        from transformers import AutoModelForCausalLM

        self.lora, self.settings, self.pairs, self.pad_id, self.step = lora, settings, pairs, pad_id, step
        self.tokens_trained = 0  # real (unpadded) tokens through forward and backward, for compute accounting
        self.device = torch.device(device if device != "cuda" or torch.cuda.is_available() else "cpu")
        base: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        base = base.to(self.device)
        with torch.random.fork_rng(devices=[]):  # a fresh adapter's A init is seeded: members are reproducible
            torch.manual_seed(noise_key(settings.seed, "sft-init"))
            self.model = get_peft_model(base, lora.peft_config())
        if adapter is not None:
            set_peft_model_state_dict(self.model, {k: v.to(self.device) for k, v in adapter.items()})
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        if optimizer_state is not None and self._fits(optimizer_state):
            self.optimizer.load_state_dict(optimizer_state)

    def _fits(self, optimizer_state: dict) -> bool:
        ours = [p.shape for group in self.optimizer.param_groups for p in group["params"]]
        theirs = [s["exp_avg"].shape for s in optimizer_state.get("state", {}).values()]
        return len(ours) == len(theirs) and all(a == b for a, b in zip(ours, theirs))

    def _autocast(self) -> AbstractContextManager[Any]:
        if self.device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    def train(self, steps: int) -> float:
        """`steps` optimizer steps; the mean loss over them."""
        self.model.train()
        losses = []
        for _ in range(steps):
            lr = lr_at(self.step, self.settings)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            rng = random.Random(noise_key(self.settings.seed, "sft-batch", self.step))
            for _ in range(self.settings.gradient_accumulation):
                ids, mask, labels = batch_of(rng.choices(self.pairs, k=self.settings.batch_size), self.pad_id)
                self.tokens_trained += int(mask.sum())
                with self._autocast():
                    loss = (
                        self.model(
                            input_ids=ids.to(self.device),
                            attention_mask=mask.to(self.device),
                            labels=labels.to(self.device),
                        ).loss
                        / self.settings.gradient_accumulation
                    )
                loss.backward()
                losses.append(loss.item() * self.settings.gradient_accumulation)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
        self.model.eval()
        return sum(losses) / max(len(losses), 1)

    def trained(self) -> Tensors:
        """The adapter in PEFT naming, fp32 on the CPU."""
        return self.lora.tensors(self.model)

    def state(self) -> dict[str, Any]:
        return {"step": self.step, "optimizer": self.optimizer.state_dict()}
