"""task.reward=reward_model: a sequence-classification model (a reward model, a classifier) scores
each completion, in batches of `task.reward_model.batch_size`, on the engine worker's device.

The text scored is the conversation under the reward model's chat template where its tokenizer
has one (user: the prompt, assistant: the completion; as TRL's reward models are trained), and
the prompt followed by the completion otherwise; cut to `task.reward_model.max_length` tokens
from the left, so the completion is kept. The reward is logit `task.reward_model.label` (0: the
one logit of a usual reward model). A non-finite logit fails its cell (counted). On a GPU the
model shares the device with the engine: leave it room (vLLM's `gpu_memory_utilization`).
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import torch

from evora.config.schema import TaskConfig
from evora.tasks.base import Example
from evora.tasks.scores import INVALID, Outcome, Scores

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def reward_model_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return DTYPES[name]


class RewardModelRewards:
    def __init__(self, cfg: TaskConfig, device: str):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.cfg, self.rm, self.device = cfg, cfg.reward_model, device
        assert self.rm.path is not None, "validated: task.reward=reward_model names task.reward_model.path"
        path = os.path.expanduser(self.rm.path)  # a folder or a hub id, checked by the plan (run_plan.py)
        self.tokenizer = AutoTokenizer.from_pretrained(path, revision=self.rm.revision)
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = reward_model_dtype(self.rm.dtype, device)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, revision=self.rm.revision, dtype=dtype)
        self.model.config.pad_token_id = self.tokenizer.pad_token_id  # where transformers finds each row's last token
        self.model.to(device).eval()

    def text(self, completion: str, example: Example) -> str:
        if self.tokenizer.chat_template:
            turns = [{"role": "user", "content": example.prompt}, {"role": "assistant", "content": completion}]
            text: Any = self.tokenizer.apply_chat_template(turns, tokenize=False)
            return str(text)
        return example.prompt + completion

    @torch.inference_mode()
    def logits(self, texts: list[str]) -> list[float]:
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.rm.max_length, return_tensors="pt"
        ).to(self.device)
        return self.model(**batch).logits[:, self.rm.label].float().tolist()

    def score(self, completions: Sequence[str], examples: Sequence[Example]) -> Scores:
        texts = [self.text(c, e) for c, e in zip(completions, examples)]
        size = self.rm.batch_size
        values = [v for start in range(0, len(texts), size) for v in self.logits(texts[start : start + size])]
        outcomes = [
            Outcome(v, v >= self.rm.correct_at) if math.isfinite(v) else Outcome(failure=INVALID, message=f"logit {v}")
            for v in values
        ]
        return Scores.of(outcomes, self.cfg.reward_penalty)

    def close(self) -> None:
        del self.model
