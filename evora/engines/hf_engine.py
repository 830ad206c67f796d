"""transformers + PEFT: the reference engine for parity tests, and the fallback where
vLLM cannot run. One adapter at a time, its prompts batched (greedy or seeded sampling).

`kl_to_base` is exact: two teacher-forced forwards (adapter on, adapter disabled) and the
full-vocabulary sum of p_a * (log p_a - log p_b) from fp32 log-softmaxes at each
completion position.

Sampled generation (`Sampling` per request) runs greedy `generate` under `SeededSampler`,
which samples each row with its own seeded generator exactly as vLLM's fp64-Gumbel sampler
does (`engines/sampling.py`): where the two engines' logits agree, so do their completions."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence, TypeVar, cast

import torch

from evora.engines.base import AdapterRef, Completion, EngineSpec, Sampling, per_request
from evora.engines.sampling import SeededSampler
from evora.lora.noise import DenseNoise, in_parallel, perturb_into, perturbed_on

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}
T = TypeVar("T")


def pad(rows: Sequence[list[int]], value: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of rows padded to one width."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span] = torch.tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return ids, mask


def exact_kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row of [positions, vocab] log-probabilities: sum of p * (log p - log q)."""
    p = logp.exp()
    # 0 * log 0 = 0: a token p cannot emit adds nothing (and must not add nan from -inf - -inf).
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    # KL >= 0; fp32 summation over the vocabulary can land a hair below 0 when p = q.
    return terms.sum(dim=-1).clamp_min(0.0)


class HFEngine:
    loads_from_memory = False  # PEFT loads adapters from their folders

    def __init__(self, spec: EngineSpec):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.spec = spec
        self.device = torch.device("cuda" if spec.device == "cuda" and torch.cuda.is_available() else "cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(spec.cpu_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(
            spec.tokenizer or spec.model, revision=spec.revision, trust_remote_code=spec.trust_remote_code
        )
        eos, pad_id = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        self.pad_id = pad_id if pad_id is not None else eos
        self.model = (
            AutoModelForCausalLM.from_pretrained(
                spec.model, revision=spec.revision, dtype=DTYPES[spec.dtype], trust_remote_code=spec.trust_remote_code
            )
            # PreTrainedModel.to is decorated with functools.wraps, whose typeshed type (_Wrapped) has
            # no __get__: mypy calls it unbound and takes the device for `self`.
            .to(self.device)  # type: ignore[arg-type]  # functools.wraps'd method: mypy does not bind self
            .eval()
        )
        # The PeftModel around self.model once an adapter was loaded: it loads, activates and
        # deletes adapters; forward and generate run on self.model, whose injected LoRA layers
        # follow set_adapter (PeftModel's own forward fails once every adapter is deleted).
        self.peft: PeftModel | None = None

    def _by_adapter(self, adapters: Sequence[AdapterRef | None], run: Callable[[list[int]], list[T]]) -> list[T]:
        """Run `run` on the indices of each adapter's requests, one adapter at a time, in chunks."""
        groups: dict[AdapterRef | None, list[int]] = {}
        for i, adapter in enumerate(adapters):
            groups.setdefault(adapter, []).append(i)
        results: dict[int, T] = {}
        for adapter, indices in groups.items():
            with self._active(adapter):
                for start in range(0, len(indices), self.spec.max_num_seqs):
                    chunk = indices[start : start + self.spec.max_num_seqs]
                    for i, result in zip(chunk, run(chunk)):
                        results[i] = result
        return [results[i] for i in range(len(adapters))]

    def generate(
        self,
        prompts: Sequence[list[int]],
        adapters: Sequence[AdapterRef | None],
        max_tokens: int | Sequence[int],
        sampling: Sequence[Sampling] | None = None,
    ) -> list[Completion]:
        limits = per_request(max_tokens, len(prompts))
        if sampling is not None and len(sampling) != len(prompts):
            raise ValueError(f"sampling for {len(sampling)} requests, {len(prompts)} prompts")

        def run(chunk: list[int]) -> list[Completion]:
            rows = None if sampling is None else [sampling[i] for i in chunk]
            return self._decode([prompts[i] for i in chunk], [limits[i] for i in chunk], rows)

        return self._by_adapter(adapters, run)

    def score(
        self, prompts: Sequence[list[int]], targets: Sequence[list[int]], adapters: Sequence[AdapterRef | None]
    ) -> list[list[float]]:
        return self._by_adapter(
            adapters, lambda chunk: self._logprobs([prompts[i] for i in chunk], [targets[i] for i in chunk])
        )

    @contextmanager
    def _active(self, adapter: AdapterRef | None) -> Iterator[None]:
        if adapter is None:
            if self.peft is not None and self.peft.peft_config:
                with self.peft.disable_adapter():
                    yield
            else:  # no adapter loaded (or all released): the model is the base model
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
    def _decode(self, prompts: list[list[int]], limits: list[int], sampling: list[Sampling] | None) -> list[Completion]:
        """One batched `generate` to the chunk's largest limit (every row pays for the longest,
        as batched transformers generation does), each row then cut to its own limit. Greedy,
        or sampled by a `SeededSampler` that gives every row of the chunk its own generator."""
        from transformers import LogitsProcessorList

        ids, mask = pad(prompts, self.pad_id, left=True)
        max_tokens = max(limits)
        processors = LogitsProcessorList([] if sampling is None else [SeededSampler(sampling, self.device)])
        # ignore_eos: greedy rows get EOS masked (min_new_tokens), as before; sampled rows may draw
        # EOS and go on past it, as vLLM's do, so for them EOS is neither masked nor a stop.
        sampled_past_eos = self.spec.ignore_eos and sampling is not None
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=max_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            min_new_tokens=max_tokens if self.spec.ignore_eos and sampling is None else None,
            pad_token_id=self.pad_id,
            eos_token_id=None if sampled_past_eos else self.tokenizer.eos_token_id,
            logits_processor=processors,
        )
        rows = [row[:limit] for row, limit in zip(out[:, ids.shape[1] :].tolist(), limits)]
        if not self.spec.ignore_eos:
            rows = [self._until_eos(row) for row in rows]
        # decode: str | list[str]; one row of ids decodes to one string.
        texts = [cast(str, self.tokenizer.decode(row, skip_special_tokens=True)) for row in rows]
        return [Completion(text, len(row), tuple(row)) for text, row in zip(texts, rows)]

    def _until_eos(self, row: list[int]) -> list[int]:
        eos = self.tokenizer.eos_token_id
        if eos in row:  # batch padding follows a row's EOS only; before it, a pad id is a real token
            return row[: row.index(eos) + 1]  # EOS counts as a generated token, as in vLLM
        return row

    @torch.no_grad()
    def _next_token_logprobs(self, prompts: list[list[int]], targets: list[list[int]]) -> list[torch.Tensor]:
        """Per row, the fp32 next-token log-probabilities [len(target), vocab] at the positions
        that predict targets[i] after prompts[i] (one teacher-forced forward for the chunk)."""
        ids, mask = pad([p + t for p, t in zip(prompts, targets)], self.pad_id, left=False)
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
        # Only the target positions go through the fp32 softmax: [rows, width, vocab] in fp32 is
        # the largest tensor of a scoring pass on a real vocabulary.
        return [
            torch.log_softmax(logits[row, len(prompt) - 1 : len(prompt) - 1 + len(target)].float(), dim=-1).cpu()
            for row, (prompt, target) in enumerate(zip(prompts, targets))
        ]

    def _logprobs(self, prompts: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        rows = self._next_token_logprobs(prompts, targets)
        return [
            lp[torch.arange(len(target)), torch.tensor(target, dtype=torch.long)].tolist()
            for lp, target in zip(rows, targets)
        ]

    def kl_to_base(
        self,
        prompts: Sequence[list[int]],
        completions: Sequence[list[int]],
        adapters: Sequence[AdapterRef | None],
        base: Mapping[str, torch.Tensor] | None = None,
    ) -> list[list[float]]:
        def run(chunk: list[int]) -> list[list[float]]:
            against_itself = adapters[chunk[0]] is None and base is None
            if against_itself or not any(completions[i] for i in chunk):
                return [[0.0] * len(completions[i]) for i in chunk]  # the base model against itself: 0
            return self._kl([prompts[i] for i in chunk], [list(completions[i]) for i in chunk], base)

        return self._by_adapter(adapters, run)

    def _kl(
        self, prompts: list[list[int]], completions: list[list[int]], base: Mapping[str, torch.Tensor] | None
    ) -> list[list[float]]:
        """Exact per-token KL(adapter || base) of one chunk, the active adapter's."""
        adapted = self._next_token_logprobs(prompts, completions)
        with self._active(None), self._weights(base):  # PEFT's disable_adapter: LoRA layers bypassed
            reference = self._next_token_logprobs(prompts, completions)
        return [exact_kl(a, b).tolist() for a, b in zip(adapted, reference)]

    @contextmanager
    def _weights(self, weights: Mapping[str, torch.Tensor] | None) -> Iterator[None]:
        """`weights` in place of the current ones for the block (None: as they are); the current
        ones copied back after it, bitwise (the copies are in the engine's dtype)."""
        if weights is None:
            yield
            return
        current = self.base_weights(list(weights))
        self.set_base_weights(weights)
        try:
            yield
        finally:
            self.set_base_weights(current)

    def release(self, adapters: Sequence[AdapterRef]) -> None:
        if self.peft is None:
            return
        for adapter in adapters:
            if adapter.name in self.peft.peft_config:
                self.peft.delete_adapter(adapter.name)
        if not self.peft.peft_config:
            # With no adapter left, PEFT (0.21) still names the deleted one active, and loading the
            # next adapter of a model it converts (MoE experts) fails on it: unwrap instead.
            # unload returns the wrapped base model (typed torch.nn.Module): self.model itself.
            self.model, self.peft = cast("PreTrainedModel", self.peft.unload()), None

    def _base_parameter(self, name: str) -> torch.nn.Parameter:
        """A base weight by checkpoint name, also once PEFT has wrapped its module (base_layer)."""
        module_name, _, attribute = name.rpartition(".")
        try:
            module = self.model.get_submodule(module_name)
        except AttributeError:
            raise KeyError(f"{name}: no such base weight in {self.spec.model}") from None
        module = getattr(module, "base_layer", module)
        if not isinstance(getattr(module, attribute, None), torch.nn.Parameter):
            raise KeyError(f"{name}: no such base weight in {self.spec.model}")
        return getattr(module, attribute)

    def base_weights(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        return {name: self._base_parameter(name).detach().cpu().clone() for name in names}

    @torch.no_grad()
    def set_base_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        for name, value in weights.items():
            parameter = self._base_parameter(name)
            if tuple(value.shape) != tuple(parameter.shape):
                raise ValueError(f"{name}: shape {tuple(value.shape)}, the model has {tuple(parameter.shape)}")
            parameter.copy_(value)  # cast (and moved) as it is written: bitwise `.to(dtype)`

    @torch.no_grad()
    def perturb_base(self, master: Mapping[str, torch.Tensor], noise: Sequence[DenseNoise]) -> None:
        def perturb(term: DenseNoise) -> None:
            parameter = self._base_parameter(term.name)
            base = master[term.name]
            if tuple(base.shape) != tuple(parameter.shape):
                raise ValueError(f"{term.name}: shape {tuple(base.shape)}, the model has {tuple(parameter.shape)}")
            if base.device != parameter.device:  # master copies on the host: noise drawn there
                parameter.copy_(perturbed_on(base, term))
            else:
                perturb_into(parameter.data, base, term.key, term.scale)

        in_parallel(perturb, list(noise), self.device, cost=lambda term: master[term.name].numel())

    def shutdown(self) -> None:
        del self.model, self.peft
