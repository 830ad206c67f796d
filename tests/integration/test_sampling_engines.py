"""Seeded sampling in both engines. What is promised: on the tiny model in fp32, where vLLM's
and transformers' logits agree, the two engines sample the same completions token for token
(both run vLLM's fp64-Gumbel sampler with a generator per request, engines/sampling.py); a
request's completion depends on its seed only, not on the rest of its batch or on earlier calls.
One vLLM and one transformers engine serve the whole module."""

from dataclasses import replace

import pytest
import torch

from evora.engines import Sampling, create_engine
from evora.engines.adapter_store import AdapterScratch
from evora.engines.vllm_spec import VLLMSpec
from evora.lora.init import random_adapter
from evora.lora.layout import build_layout
from evora.tasks.builtin.addition import heldout_pairs, prompt_of
from evora.tasks.builtin.countdown import countdown_prompt

PROMPT_TEXTS = [prompt_of(a, b) for a, b in heldout_pairs()[5::40]][:14] + [countdown_prompt([3, 5, 7], 22), "7+"]
MAX_TOKENS = 12

pytestmark = pytest.mark.xdist_group("sampling-engines")


@pytest.fixture(scope="module")
def prompts(tiny_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    return [tokenizer(text).input_ids for text in PROMPT_TEXTS]


@pytest.fixture(scope="module")
def layout(tiny_shapes, tiny_path):
    return build_layout(
        tiny_shapes,
        rank=8,
        alpha=16,
        target_modules=["q_proj", "v_proj", "down_proj"],
        layers=[1],
        base_model=tiny_path,
    )


@pytest.fixture(scope="module")
def spec(tiny_path, layout):
    return VLLMSpec(
        model=tiny_path, dtype="float32", max_loras=4, max_cpu_loras=16, lora_target_modules=layout.target_modules
    )


@pytest.fixture(scope="module")
def vllm_engine(spec):
    return create_engine("vllm", spec)


@pytest.fixture(scope="module")
def hf_engine(spec):
    return create_engine("hf", spec)


@pytest.fixture(scope="module")
def scratch():
    store = AdapterScratch("/dev/shm", "pytest-sampling-engines")
    yield store
    store.cleanup()


def ids(engine, prompts, adapters, sampling, max_tokens=MAX_TOKENS):
    return [c.token_ids for c in engine.generate(prompts, adapters, max_tokens, sampling)]


def agreement(a, b):
    return sum(x == y for x, y in zip(a, b)), len(a)


def test_engines_sample_the_same_tokens(vllm_engine, hf_engine, prompts):
    """16 prompts x 2 seeds at temperature 1, and 16 with top-p 0.9: all agree (measured 48/48)."""
    batch = prompts * 2
    sampling = [Sampling(1.0, seed=100 + i) for i in range(len(batch))]
    sampling += [Sampling(1.0, top_p=0.9, seed=300 + i) for i in range(len(prompts))]
    batch = batch + prompts
    by_vllm = ids(vllm_engine, batch, [None] * len(batch), sampling)
    by_hf = ids(hf_engine, batch, [None] * len(batch), sampling)
    assert agreement(by_vllm, by_hf) == (len(batch), len(batch))
    greedy = ids(vllm_engine, prompts, [None] * len(prompts), None)
    assert sum(s != g for s, g in zip(by_vllm, greedy)) >= len(prompts) // 2  # really sampled


def test_a_seed_fixes_the_completion_whatever_the_batch(vllm_engine, hf_engine, prompts):
    """A request's completion depends on its seed only: alone, in a batch with other seeds and
    other prompts, or on a second call; other seeds give other completions for most prompts."""
    n = len(prompts)
    seeded = [Sampling(1.0, seed=7)] * n
    for engine in (vllm_engine, hf_engine):
        first = ids(engine, prompts, [None] * n, seeded)
        assert ids(engine, prompts, [None] * n, seeded) == first
        mixed_prompts = [p for pair in zip(prompts, reversed(prompts)) for p in pair]
        mixed_sampling = [s for i in range(n) for s in (Sampling(1.0, seed=7), Sampling(0.7, seed=1000 + i))]
        assert ids(engine, mixed_prompts, [None] * (2 * n), mixed_sampling)[::2] == first
        alone = [ids(engine, [prompts[i]], [None], [Sampling(1.0, seed=7)])[0] for i in (0, n - 1)]
        assert alone == [first[0], first[-1]]
        other = ids(engine, prompts, [None] * n, [Sampling(1.0, seed=8)] * n)
        assert sum(a != b for a, b in zip(first, other)) >= n // 2


def test_greedy_is_unchanged(vllm_engine, hf_engine, prompts):
    """sampling=None and temperature 0 are greedy decoding, equal in both engines."""
    n = len(prompts)
    greedy = ids(vllm_engine, prompts, [None] * n, None)
    assert ids(hf_engine, prompts, [None] * n, None) == greedy
    assert [c.token_ids for c in vllm_engine.generate(prompts, [None] * n, MAX_TOKENS)] == greedy
    cold = [Sampling(0.0, seed=i) for i in range(n)]
    assert ids(vllm_engine, prompts, [None] * n, cold) == greedy
    assert ids(hf_engine, prompts, [None] * n, cold) == greedy


def test_sampled_requests_with_adapters_agree(vllm_engine, hf_engine, scratch, layout, prompts, monkeypatch):
    """A batch mixing two adapters and the base model, each request sampled with its own seed;
    vLLM's base-apart path (CPU without evora's LoRA ops: per-request parameters split) too."""
    a = scratch.write("sa", random_adapter(layout, seed=1, a_std=None, b_std=1.0), layout, torch.float32)
    b = scratch.write("sb", random_adapter(layout, seed=2, a_std=None, b_std=1.0), layout, torch.float32)
    n = len(prompts)
    batch, adapters = prompts * 3, [a] * n + [None] * n + [b] * n
    sampling = [Sampling(1.0, top_p=0.95 if i % 2 else 1.0, seed=500 + i) for i in range(3 * n)]
    by_vllm = ids(vllm_engine, batch, adapters, sampling)
    by_hf = ids(hf_engine, batch, adapters, sampling)
    assert agreement(by_vllm, by_hf) == (3 * n, 3 * n)
    base = ids(vllm_engine, batch, [None] * (3 * n), sampling)
    assert sum(x != y for x, y in zip(by_vllm[:n], base[:n])) >= n // 2  # the adapter is applied
    monkeypatch.setattr(vllm_engine, "grouped_cpu_lora", False)
    assert ids(vllm_engine, batch, adapters, sampling) == by_vllm
    vllm_engine.release([a, b])
    hf_engine.release([a, b])


def test_ignore_eos_samples_past_eos_in_both_engines(vllm_engine, hf_engine, prompts, monkeypatch):
    """With ignore_eos a sampled request may draw EOS and goes on to max_tokens (vLLM's
    behaviour; transformers neither masks EOS nor stops there for sampled rows)."""
    monkeypatch.setattr(hf_engine, "spec", replace(hf_engine.spec, ignore_eos=True))
    monkeypatch.setattr(vllm_engine, "ignore_eos", True)
    n, eos = len(prompts), 2  # the tiny model's EOS id
    sampling = [Sampling(1.0, seed=900 + i) for i in range(n)]
    by_vllm = ids(vllm_engine, prompts, [None] * n, sampling, max_tokens=20)
    assert agreement(by_vllm, ids(hf_engine, prompts, [None] * n, sampling, max_tokens=20)) == (n, n)
    assert all(len(row) == 20 for row in by_vllm)
    assert any(eos in row[:-1] for row in by_vllm)  # EOS was drawn mid-completion, and sampling went on
