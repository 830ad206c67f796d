"""KL(adapter || base) per completion token: the hf engine's exact value against an
independent transformers computation (B @ A merged into the weights, no PEFT, float64 sums),
the base model against itself, and vLLM's top-k estimator on known distributions (no vLLM)."""

import math

import numpy as np
import pytest
import torch

from evora.engines import EngineSpec, create_engine
from evora.engines.adapter_store import AdapterScratch
from evora.engines.vllm_engine import top_k_kl
from evora.lora.init import random_adapter
from evora.lora.layout import build_layout
from evora.tasks import build_task, task_config
from evora.tasks.prompts import PromptRenderer

# fp32 forwards: PEFT's x @ W + s * (x @ A) @ B against the merged (W + s * B @ A) differ by
# rounding, and the engine sums the vocabulary in fp32. Measured on the tiny model, per token:
# at most 2.9e-6 nats (mean KL 0.012 nats/token) and 1.2e-5 nats (mean KL 3.4 nats/token).
EXACT_ABS, EXACT_REL = 1e-5, 1e-5


@pytest.fixture(scope="module")
def tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    renderer = PromptRenderer(tokenizer, "plain")
    return [renderer.ids(e) for e in build_task(task_config("addition", eval_size=12), seed=0).splits().heldout]


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
def engine(tiny_path):
    # max_num_seqs=5: chunks of 5 rows, so padding and several chunks per adapter are exercised.
    return create_engine("hf", EngineSpec(model=tiny_path, dtype="float32", max_num_seqs=5))


@pytest.fixture(scope="module")
def scratch():
    store = AdapterScratch("/dev/shm", "pytest-kl")
    yield store
    store.cleanup()


def merged_model(tiny_path: str, layout, tensors: dict[str, torch.Tensor] | None) -> torch.nn.Module:
    """The tiny model with the adapter's s * B @ A added to its weights (None: the base model)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    with torch.no_grad():
        for slot in layout.modules if tensors is not None else ():
            model.get_parameter(f"{slot.name}.weight").add_(layout.scale * tensors[slot.b_key] @ tensors[slot.a_key])
    return model


@torch.no_grad()
def reference_kl(adapted, base, prompt: list[int], completion: list[int]) -> list[float]:
    """Full-vocabulary KL per completion token, one unpadded sequence at a time, summed in float64."""
    if not completion:
        return []
    ids = torch.tensor([prompt + completion])
    rows = slice(len(prompt) - 1, len(prompt) - 1 + len(completion))
    log_p = torch.log_softmax(adapted(input_ids=ids).logits[0, rows].double(), dim=-1)
    log_q = torch.log_softmax(base(input_ids=ids).logits[0, rows].double(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1).tolist()


@pytest.mark.parametrize("b_std", [0.1, 1.0])  # ~0.02 and ~4 nats per token
def test_hf_kl_is_exact_against_a_merged_transformers_model(engine, scratch, layout, tiny_path, prompts, b_std):
    tensors = random_adapter(layout, seed=3, a_std=None, b_std=b_std)
    ref = scratch.write("kl", tensors, layout, torch.float32)
    completions = [list(c.token_ids) for c in engine.generate(prompts, [ref] * len(prompts), 12)]
    assert all(len(c.token_ids) == c.num_tokens for c in engine.generate(prompts[:2], [ref, None], 12))
    completions[0] = []  # an empty completion has no positions
    completions[1] = completions[1][:1]
    got = engine.kl_to_base(prompts, completions, [ref] * len(prompts))
    adapted, base = merged_model(tiny_path, layout, tensors), merged_model(tiny_path, layout, None)
    errors = []
    for prompt, completion, values in zip(prompts, completions, got):
        expected = reference_kl(adapted, base, prompt, completion)
        assert len(values) == len(completion)
        errors += [(abs(a - b), EXACT_ABS + EXACT_REL * b) for a, b in zip(values, expected)]
        assert all(v >= 0.0 for v in values)
    mean_kl = float(np.mean([v for row in got for v in row]))
    print(f"b_std={b_std}: mean KL {mean_kl:.4f} nats/token, max |hf - reference| {max(e for e, _ in errors):.2e}")
    assert all(error <= bound for error, bound in errors)
    assert mean_kl > 0.005  # a nonzero adapter moves the distributions
    engine.release([ref])


def test_base_against_itself_is_zero(engine, scratch, layout, prompts):
    completions = [list(c.token_ids) for c in engine.generate(prompts, [None] * len(prompts), 8)]
    assert engine.kl_to_base(prompts, completions, [None] * len(prompts)) == [[0.0] * len(c) for c in completions]
    zero_b = scratch.write("zero", random_adapter(layout, seed=4, a_std=None, b_std=0.0), layout, torch.float32)
    mixed = [zero_b if i % 2 else None for i in range(len(prompts))]
    kl = engine.kl_to_base(prompts, completions, mixed)
    assert max(v for row in kl for v in row) <= 1e-7  # B = 0: the adapter adds exactly nothing
    engine.release([zero_b])


def _truncate(log_p: torch.Tensor, k: int, completion_token: int) -> dict[int, float]:
    """A vLLM prompt-logprobs entry: the top-k tokens plus the actual (completion) token."""
    top = torch.topk(log_p, k).indices.tolist()
    return {t: float(log_p[t]) for t in {*top, completion_token}}


@pytest.mark.parametrize("shift", [0.1, 0.5, 1.0, 3.0])
def test_top_k_estimate_is_a_lower_bound_that_tightens_with_k(shift):
    """Lumping fewer tokens refines the partition, so the estimate grows with k (data-processing
    inequality) up to the exact KL, reached when every token is listed."""
    generator = torch.Generator().manual_seed(int(shift * 10))
    log_q = torch.log_softmax(torch.randn(472, generator=generator, dtype=torch.float64) * 3, dim=0)
    log_p = torch.log_softmax(log_q + shift * torch.randn(472, generator=generator, dtype=torch.float64), dim=0)
    exact = float((log_p.exp() * (log_p - log_q)).sum())
    token = int(torch.argmax(log_p))
    estimates = [top_k_kl(_truncate(log_p, k, token), _truncate(log_q, k, token)) for k in (1, 5, 20, 100, 472)]
    assert 0.0 <= estimates[0]
    assert all(a <= b + 1e-12 for a, b in zip(estimates, estimates[1:])), estimates
    assert estimates[-2] <= exact + 1e-12
    assert math.isclose(estimates[-1], exact, rel_tol=1e-9)


def test_top_k_estimate_of_equal_distributions_is_zero():
    log_p = torch.log_softmax(torch.randn(472, generator=torch.Generator().manual_seed(0)), dim=0)
    listed = _truncate(log_p, 20, 7)
    assert top_k_kl(listed, listed) == 0.0
    assert top_k_kl({7: 0.0}, {7: 0.0}) == 0.0  # one certain token in both


def test_worker_reports_the_mean_kl_of_each_completion(scratch, layout, tiny_path):
    """A held-out unit with kl=True: [candidate, prompt] means over each completion's tokens,
    0 for the BASE row, and the forwards counted (prompt + completion, with and without the
    adapter). A real worker on the hf engine, without Ray."""
    from evora.distributed.worker import EngineWorker, WorkUnit
    from evora.distributed.worker_spec import worker_spec
    from evora.plan.compose import compose_run
    from evora.strategies.protocol import BASE, CENTER, CandidateSpec, EvalPayload

    run = compose_run(["engine=hf", "task.eval_size=8", "task.max_tokens=6"])
    worker = EngineWorker(worker_spec(run, tiny_path, layout, "pytest-kl-worker", with_strategy=False), 0)
    tensors = random_adapter(layout, seed=6, a_std=None, b_std=0.5)
    specs = (CandidateSpec(0, 0, op=BASE), CandidateSpec(0, 1, op=CENTER))
    indices = (0, 1, 2, 3, 4)
    result = worker.evaluate(EvalPayload(tensors, layout), WorkUnit(specs, "heldout", indices, kl=True))
    assert worker.evaluate(EvalPayload(tensors, layout), WorkUnit(specs, "heldout", indices)).kl is None
    prompts = [worker.prompt_ids("heldout", i) for i in indices]
    ref = scratch.write("again", tensors, layout, torch.float32)  # greedy: the same completions again
    completions = [list(c.token_ids) for c in worker.engine.generate(prompts, [ref] * len(prompts), 6)]
    per_token = worker.engine.kl_to_base(prompts, completions, [ref] * len(prompts))
    assert result.kl.shape == (2, len(indices))
    assert result.kl[0].tolist() == [0.0] * len(indices)
    np.testing.assert_allclose(result.kl[1], [np.mean(row) for row in per_token], rtol=1e-6)
    assert result.tokens[1].tolist() == [len(c) for c in completions]
    assert result.tokens_scored == 2 * sum(len(p) + len(c) for p, c in zip(prompts, completions))
    worker.engine.release([ref])
    worker.shutdown()


def test_split_outcome_reports_kl_only_when_measured():
    from evora.distributed.evaluate import SplitOutcome

    rows = np.zeros(2), np.zeros(2, dtype=bool), np.ones(2)
    assert "kl" not in SplitOutcome(*rows, None, None).metrics()
    assert SplitOutcome(*rows, None, None, kl=np.array([0.5, 1.5])).metrics()["kl"] == 1.0


def test_kl_to_given_base_weights_measures_moved_weights_and_puts_them_back(engine, prompts, tiny_path):
    """An engine whose weights a full-weight strategy moved measures the KL of its own weights
    (adapter None) against the model's, swapped in for the base's forward passes and out again."""
    from evora.lora.base_weights import read_weights

    name = "model.layers.1.mlp.down_proj.weight"
    original = read_weights(tiny_path, [name])
    completions = [list(c.token_ids) for c in engine.generate(prompts[:6], [None] * 6, 6)]
    unmoved = engine.kl_to_base(prompts[:6], completions, [None] * 6, original)
    assert all(v == 0.0 for row in unmoved for v in row) and any(completions)
    moved = {
        name: original[name] + 0.05 * torch.randn(original[name].shape, generator=torch.Generator().manual_seed(1))
    }
    engine.set_base_weights(moved)
    try:
        kl = engine.kl_to_base(prompts[:6], completions, [None] * 6, original)
        assert torch.equal(engine.base_weights([name])[name], moved[name])  # bitwise back
        assert engine.kl_to_base(prompts[:6], completions, [None] * 6) == [[0.0] * len(c) for c in completions]
    finally:
        engine.set_base_weights(original)
    assert all(v >= 0 for row in kl for v in row) and sum(map(sum, kl)) > 0
