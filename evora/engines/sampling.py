"""Seeded sampling that both engines share: vLLM's sampler with `use_fp64_gumbel`, in pure torch.

vLLM (0.32, v1) samples a seeded request as follows (`Sampler.sample`, `TopKTopPSampler`,
`random_sample`): logits in fp32, divided by the temperature; if the batch asks for a top-p,
the sort-based top-p mask of `apply_top_k_top_p_pytorch`; fp32 softmax; then, from the
request's own `torch.Generator` seeded with its seed, one fp64 Exp(1) draw `q` over the whole
vocabulary row per generated token, and the token is argmax(probs * (1 / q)) in fp64 (the
exponential race: an exact sample of probs). Reproducing every step here, bit for bit, makes
the transformers engine emit vLLM's very tokens wherever the two engines' logits agree.
Without `use_fp64_gumbel` vLLM's CPU build samples with a fused C++ kernel instead
(`fused_gumbel_argmax`), which is why the vLLM engine turns it on. On a GPU with Triton, vLLM
masks top-p with a Triton kernel (`apply_top_k_top_p_triton`) rather than the sort here: the
same nucleus but for rounding at its edge, so there a top-p below 1 may rarely pick differently.

The transformers side runs as a `LogitsProcessor` under greedy `generate`: it samples each
row and returns logits that are -inf everywhere but at the sampled token, so the greedy
argmax takes it and transformers keeps its own caching, padding and EOS handling.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import LogitsProcessor

from evora.engines.base import Sampling

# vLLM's `_SAMPLING_EPS`: a temperature below it is greedy decoding (no random draw).
SAMPLING_EPS = 1e-5
# vLLM's `_MAX_TEMP`: SamplingParams raises a positive temperature below it to it.
MIN_TEMPERATURE = 1e-2


def effective_temperature(temperature: float) -> float:
    """The temperature vLLM samples with: 0 (greedy) below SAMPLING_EPS, else at least
    MIN_TEMPERATURE, as SamplingParams clamps it (to keep the division finite)."""
    if temperature < SAMPLING_EPS:
        return 0.0
    return max(temperature, MIN_TEMPERATURE)


def seeded_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A request's own random stream, made as vLLM's model runner makes it."""
    return torch.Generator(device=device).manual_seed(seed)


def top_p_mask(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """vLLM's `apply_top_k_top_p_pytorch` with top-p only (no top-k), on a copy: the
    smallest-first sort, fp32 cumulative probabilities, every token whose cumulative sum stays
    <= 1 - p set to -inf, the most likely token always kept."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    mask = probs_sum <= 1 - top_p.unsqueeze(dim=1)
    mask[:, -1] = False
    logits_sort.masked_fill_(mask, -float("inf"))
    return logits.clone().scatter_(dim=-1, index=logits_idx, src=logits_sort)


def exponential_noise(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """fp64 Exp(1) noise of probs' shape, each row drawn whole from its own generator (as
    vLLM's `q[i].exponential_(generator=...)`); a row without one (greedy) gets ones."""
    q = torch.ones(probs.shape, dtype=torch.float64, device=probs.device)
    for i, generator in enumerate(generators):
        if generator is not None:
            q[i].exponential_(generator=generator)
    return q


def sample_rows(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_p: torch.Tensor | None,
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """The next token of each row of [rows, vocab] logits, as vLLM's seeded fp64-Gumbel
    sampler picks it. temperatures: fp32 per row (0: greedy, no draw); top_p: per row, or None
    for no top-p mask (vLLM's p=None when no request of the batch asks for one)."""
    logits = logits.to(torch.float32)
    greedy = temperatures < SAMPLING_EPS
    tokens = logits.argmax(dim=-1)
    # vLLM divides greedy rows of a mixed batch by 1 (their draw is discarded anyway).
    scaled = logits / torch.where(greedy, torch.ones_like(temperatures), temperatures).unsqueeze(dim=1)
    if top_p is not None:
        scaled = top_p_mask(scaled, top_p)
    probs = scaled.softmax(dim=-1, dtype=torch.float32)
    q = exponential_noise(probs, generators)
    # vLLM's sample_with_exponential_noise with fp64 q: reciprocal first, then times probs.
    sampled = q.reciprocal_().mul_(probs).argmax(dim=-1)
    return torch.where(greedy, tokens, sampled)


class SeededSampler(LogitsProcessor):
    """Samples each row of a transformers `generate` batch with its own seeded stream (one
    generator per row: rows never share one) and leaves only the sampled token finite, so that
    greedy decoding (`do_sample=False`) emits it. transformers hands over fp32 scores; rows that
    already finished keep drawing (their tokens are cut at EOS afterwards), which only advances
    their own streams."""

    def __init__(self, sampling: Sequence[Sampling], device: torch.device | str):
        temperatures = [effective_temperature(s.temperature) for s in sampling]
        self.temperatures = torch.tensor(temperatures, dtype=torch.float32, device=device)
        top_ps = [s.top_p for s in sampling]
        # vLLM masks only when some request asks for top-p (then every row, p = 1 a no-op).
        self.top_p = torch.tensor(top_ps, dtype=torch.float32, device=device) if min(top_ps) < 1.0 else None
        self.generators = [seeded_generator(s.seed, device) if t > 0 else None for s, t in zip(sampling, temperatures)]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tokens = sample_rows(scores, self.temperatures, self.top_p, self.generators)
        only = torch.full_like(scores, -float("inf"))
        return only.scatter_(1, tokens.unsqueeze(dim=1), 0.0)  # type: ignore[return-value]


def vllm_sampling_params(limits: Sequence[int], sampling: Sequence[Sampling] | None, ignore_eos: bool) -> list[Any]:
    """One vLLM `SamplingParams` per request: greedy (temperature 0) where sampling is None,
    else the request's temperature, top-p and seed (a seed gives the request its own generator
    in vLLM's model runner, so its tokens do not depend on the rest of the batch)."""
    from vllm import SamplingParams

    if sampling is None:
        return [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=ignore_eos) for m in limits]
    if len(sampling) != len(limits):
        raise ValueError(f"sampling for {len(sampling)} requests, {len(limits)} prompts")
    return [
        SamplingParams(temperature=s.temperature, top_p=s.top_p, seed=s.seed, max_tokens=m, ignore_eos=ignore_eos)
        for s, m in zip(sampling, limits)
    ]
