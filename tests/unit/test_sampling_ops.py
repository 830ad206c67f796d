"""The shared seeded sampler (evora/engines/sampling.py) is vLLM's fp64-Gumbel sampler: the
same tokens as vLLM's own functions on the same logits and seeds, and a correct sample of
softmax(logits / temperature)."""

import pytest
import torch

from evora.engines.base import Sampling
from evora.engines.sampling import (
    SeededSampler,
    effective_temperature,
    sample_rows,
    seeded_generator,
    top_p_mask,
    vllm_sampling_params,
)

VOCAB = 50


def logits_of(rows: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return 3 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def draw(logits: torch.Tensor, seeds: list[int], temperature: float = 1.0, top_p: float = 1.0) -> list[int]:
    rows = len(seeds)
    temps = torch.full((rows,), temperature)
    p = None if top_p == 1.0 else torch.full((rows,), top_p)
    return sample_rows(logits, temps, p, [seeded_generator(s, "cpu") for s in seeds]).tolist()


def test_a_seed_fixes_the_token_and_matches_a_direct_computation():
    logits = logits_of(6)
    seeds = [3, 1, 4, 1, 5, 9]
    tokens = draw(logits, seeds, temperature=0.7)
    assert tokens == draw(logits, seeds, temperature=0.7)
    for row, seed in enumerate(seeds):  # one row at a time, from scratch: argmax of probs / Exp(1) in fp64
        probs = torch.softmax(logits[row] / 0.7, dim=-1)
        q = torch.empty(VOCAB, dtype=torch.float64).exponential_(generator=torch.Generator().manual_seed(seed))
        assert tokens[row] == int((probs.double() / q).argmax())
    assert len(set(draw(logits[:1].expand(40, -1), list(range(40))))) > 5  # seeds differ, tokens vary


def test_tokens_equal_vllms_random_sample_and_top_p_mask():
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    logits = logits_of(8, seed=1)
    p = torch.tensor([0.9, 0.5, 1.0, 0.99, 0.1, 0.75, 0.95, 0.3])
    expected_mask = ops.apply_top_k_top_p_pytorch(logits.clone(), None, p)
    assert torch.equal(top_p_mask(logits, p), expected_mask)
    assert (expected_mask > -float("inf")).sum() < logits.numel()  # the mask masked something
    for top_p in (None, p):
        masked = logits if top_p is None else expected_mask
        probs = masked.softmax(dim=-1, dtype=torch.float32)
        generators = {i: seeded_generator(10 + i, "cpu") for i in range(8)}
        theirs = ops.random_sample(probs, generators, use_fp64_gumbel=True)
        ours = sample_rows(logits, torch.ones(8), top_p, [seeded_generator(10 + i, "cpu") for i in range(8)])
        assert ours.tolist() == theirs.tolist()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_frequencies_over_seeds_follow_the_tempered_softmax(temperature):
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    n = 6000
    tokens = torch.tensor(draw(logits.expand(n, -1), list(range(n)), temperature=temperature))
    freq = torch.bincount(tokens, minlength=6).double() / n
    expected = torch.softmax(logits[0].double() / temperature, dim=-1)
    # 4 standard errors of a binomial frequency, at most ~0.026 here
    assert torch.all((freq - expected).abs() <= 4 * (expected * (1 - expected) / n).sqrt() + 1e-3)


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    tokens = set(draw(logits.expand(400, -1), list(range(400)), top_p=0.7))
    assert tokens == {0, 1}  # 0.5 + 0.3 reaches 0.7; 0.15 and 0.05 fall outside


def test_temperatures_as_vllm_takes_them():
    assert effective_temperature(0.0) == 0.0 and effective_temperature(1e-6) == 0.0
    assert effective_temperature(1e-3) == 1e-2 and effective_temperature(0.8) == 0.8
    logits = logits_of(3, seed=2)
    sampler = SeededSampler([Sampling(0.0, seed=1), Sampling(1.0, seed=1), Sampling(1.0, seed=1)], "cpu")
    assert sampler.generators[0] is None and sampler.top_p is None
    assert sampler.generators[1] is not sampler.generators[2]  # rows never share a stream
    out = sampler(torch.zeros(3, 1, dtype=torch.long), logits)
    tokens = out.argmax(dim=-1)
    assert int(tokens[0]) == int(logits[0].argmax())  # temperature 0: greedy, no draw
    assert torch.isfinite(out).sum() == 3 and torch.all(out.gather(1, tokens[:, None]) == 0)
    assert tokens[1:].tolist() == draw(logits[1:], [1, 1])


def test_the_processor_draws_a_fresh_row_per_step():
    logits = logits_of(1, seed=3)
    sampler = SeededSampler([Sampling(1.0, seed=7)], "cpu")
    steps = [int(sampler(torch.zeros(1, 1, dtype=torch.long), logits).argmax()) for _ in range(30)]
    g = seeded_generator(7, "cpu")
    probs = torch.softmax(logits[0], dim=-1).double()
    expected = [
        int((probs / torch.empty(VOCAB, dtype=torch.float64).exponential_(generator=g)).argmax()) for _ in steps
    ]
    assert steps == expected and len(set(steps)) > 1


def test_vllm_params_carry_each_request_sampling():
    pytest.importorskip("vllm")
    params = vllm_sampling_params([4, 5], [Sampling(0.8, 0.9, 11), Sampling(1.0, seed=12)], ignore_eos=True)
    assert [(p.temperature, p.top_p, p.seed, p.max_tokens, p.ignore_eos) for p in params] == [
        (0.8, 0.9, 11, 4, True),
        (1.0, 1.0, 12, 5, True),
    ]
    assert [p.temperature for p in vllm_sampling_params([3], None, ignore_eos=False)] == [0.0]
    with pytest.raises(ValueError):
        vllm_sampling_params([3, 3], [Sampling(1.0)], ignore_eos=False)
