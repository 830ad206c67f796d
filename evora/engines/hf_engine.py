"""transformers + PEFT: the reference engine for parity tests, and the fallback where
vLLM cannot run. One adapter at a time, its prompts batched (left padding, greedy)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import torch

from evora.engines.base import AdapterRef, Completion, EngineSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


class HFEngine:
    def __init__(self, spec: EngineSpec):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.spec = spec
        self.device = torch.device("cuda" if spec.device == "cuda" and torch.cuda.is_available() else "cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(spec.cpu_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer or spec.model, revision=spec.revision,
                                                       trust_remote_code=spec.trust_remote_code)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(
            spec.model, revision=spec.revision, dtype=DTYPES[spec.dtype],
            trust_remote_code=spec.trust_remote_code).to(self.device).eval()
        self.peft = None  # the PeftModel around self.model, once an adapter was loaded

    def generate(self, prompts: Sequence[str], adapters: Sequence[AdapterRef | None],
                 max_tokens: int) -> list[Completion]:
        groups: dict[AdapterRef | None, list[int]] = {}
        for i, adapter in enumerate(adapters):
            groups.setdefault(adapter, []).append(i)
        results: list[Completion | None] = [None] * len(prompts)
        for adapter, indices in groups.items():
            with self._active(adapter):
                for start in range(0, len(indices), self.spec.max_num_seqs):
                    chunk = indices[start:start + self.spec.max_num_seqs]
                    for i, completion in zip(chunk, self._greedy([prompts[i] for i in chunk], max_tokens)):
                        results[i] = completion
        return results  # type: ignore[return-value]

    @contextmanager
    def _active(self, adapter: AdapterRef | None) -> Iterator[None]:
        if adapter is None:
            if self.peft is None:
                yield
            else:
                with self.peft.disable_adapter():
                    yield
            return
        if self.peft is None:
            from peft import PeftModel

            self.peft = PeftModel.from_pretrained(self.model, adapter.path, adapter_name=adapter.name)
        elif adapter.name not in self.peft.peft_config:
            self.peft.load_adapter(adapter.path, adapter_name=adapter.name)
        self.peft.set_adapter(adapter.name)
        yield

    @torch.no_grad()
    def _greedy(self, prompts: list[str], max_tokens: int) -> list[Completion]:
        batch = self.tokenizer(prompts, return_tensors="pt", padding=True).to(self.device)
        model = self.peft if self.peft is not None else self.model
        out = model.generate(**batch, max_new_tokens=max_tokens, do_sample=False, temperature=None, top_p=None,
                             top_k=None, min_new_tokens=max_tokens if self.spec.ignore_eos else None,
                             pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.tokenizer.eos_token_id)
        rows = out[:, batch["input_ids"].shape[1]:].tolist()
        if not self.spec.ignore_eos:
            rows = [self._until_eos(row) for row in rows]
        return [Completion(self.tokenizer.decode(row, skip_special_tokens=True), len(row)) for row in rows]

    def _until_eos(self, row: list[int]) -> list[int]:
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        if eos in row:
            return row[:row.index(eos) + 1]  # EOS counts as a generated token, as in vLLM
        return [t for t in row if t != pad]

    def release(self, adapters: Sequence[AdapterRef]) -> None:
        if self.peft is None:
            return
        for adapter in adapters:
            if adapter.name in self.peft.peft_config:
                self.peft.delete_adapter(adapter.name)

    def shutdown(self) -> None:
        del self.model, self.peft
