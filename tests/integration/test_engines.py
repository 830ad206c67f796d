"""The engines agree token for token, and an adapter is really applied, to exactly the
modules and layers it names. One vLLM engine serves the whole module."""

import os

import pytest
import torch

from evora.engines import AdapterRef, create_engine
from evora.engines.adapter_store import AdapterScratch, sweep_run_scratch
from evora.engines.vllm_spec import VLLMSpec
from evora.lora.init import random_adapter
from evora.lora.layout import build_layout
from evora.tasks import build_task, task_config
from evora.tasks.builtin.addition import heldout_pairs, prompt_of
from evora.tasks.builtin.countdown import countdown_prompt

PROMPT_TEXTS = [prompt_of(a, b) for a, b in heldout_pairs()[7::40]][:28] + [
    countdown_prompt([3, 5, 7], 22),
    countdown_prompt([10, 2, 4, 8], 40),
    "7+",
    "12",
]

# One xdist worker for the whole module: its vLLM and HF engines start once.
pytestmark = pytest.mark.xdist_group("engines")


@pytest.fixture(scope="module")
def tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(text).input_ids for text in PROMPT_TEXTS]


@pytest.fixture(scope="module")
def spec(tiny_path, layout):
    return VLLMSpec(
        model=tiny_path,
        dtype="float32",
        max_lora_rank=8,
        max_loras=4,
        max_cpu_loras=16,
        lora_target_modules=layout.target_modules,  # as workers start their engines
    )


@pytest.fixture(scope="module")
def vllm_engine(spec):
    return create_engine("vllm", spec)


@pytest.fixture(scope="module")
def hf_engine(spec):
    return create_engine("hf", spec)


@pytest.fixture(scope="module")
def scratch():
    store = AdapterScratch("/dev/shm", "pytest-engines")
    yield store
    store.cleanup()


@pytest.fixture(scope="module")
def layout(tiny_shapes, tiny_path):
    # Restricted to layer 1: vLLM ignores layers_to_transform, so this is the hard case.
    return build_layout(
        tiny_shapes,
        rank=8,
        alpha=16,
        target_modules=["q_proj", "v_proj", "down_proj"],
        layers=[1],
        base_model=tiny_path,
    )


def texts(engine, adapter, prompts, max_tokens=12):
    return [c.text for c in engine.generate(prompts, [adapter] * len(prompts), max_tokens)]


def test_parity_vllm_hf_for_a_nontrivial_adapter(vllm_engine, hf_engine, scratch, layout, prompts):
    assert len(prompts) >= 16
    ref = scratch.write("parity", random_adapter(layout, seed=0, a_std=None, b_std=1.0), layout, torch.float32)
    with_vllm, with_hf = texts(vllm_engine, ref, prompts), texts(hf_engine, ref, prompts)
    base_vllm, base_hf = texts(vllm_engine, None, prompts), texts(hf_engine, None, prompts)
    assert with_vllm == with_hf
    assert base_vllm == base_hf
    changed = sum(a != b for a, b in zip(with_vllm, base_vllm))
    assert changed >= len(prompts) // 2, f"adapter changed only {changed} completions: is it applied?"
    vllm_engine.release([ref])
    hf_engine.release([ref])


def test_vllm_applies_exactly_the_written_layers(vllm_engine, scratch, layout, tiny_path, prompts):
    """vLLM's output equals a transformers model with B@A merged into layer 1 only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tensors = random_adapter(layout, seed=5, a_std=None, b_std=1.0)
    ref = scratch.write("layers", tensors, layout, torch.float32)
    merged = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    with torch.no_grad():
        for slot in layout.modules:
            merged.get_parameter(f"{slot.name}.weight").add_(layout.scale * tensors[slot.b_key] @ tensors[slot.a_key])
    tok = AutoTokenizer.from_pretrained(tiny_path)
    expected = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = merged.generate(
            ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
        )[0, ids.shape[1] :].tolist()
        expected.append(tok.decode(out, skip_special_tokens=True))
    assert texts(vllm_engine, ref, prompts) == expected
    vllm_engine.release([ref])


def test_mixed_batch_serves_each_request_its_own_adapter(vllm_engine, scratch, layout, prompts):
    a = scratch.write("a", random_adapter(layout, seed=1, a_std=None, b_std=1.0), layout, torch.float32)
    b = scratch.write("b", random_adapter(layout, seed=2, a_std=None, b_std=1.0), layout, torch.float32)
    assert a.lora_id != b.lora_id
    alone_a, alone_b = texts(vllm_engine, a, prompts), texts(vllm_engine, b, prompts)
    assert alone_a != alone_b
    n = len(prompts)
    mixed = vllm_engine.generate(prompts * 3, [a] * n + [None] * n + [b] * n, 12)
    assert [c.text for c in mixed[:n]] == alone_a
    assert [c.text for c in mixed[n : 2 * n]] == texts(vllm_engine, None, prompts)
    assert [c.text for c in mixed[2 * n :]] == alone_b
    vllm_engine.release([a, b])


def test_interleaved_requests_more_adapters_than_slots_and_per_request_limits(
    vllm_engine, hf_engine, scratch, layout, prompts
):
    """Six adapters (max_loras is 4) with base requests, interleaved request by request, each
    request with its own token limit, in one call: every request gets its own adapter (vLLM's
    scheduler keeps at most max_loras in flight; the CPU LoRA path gathers rows by slot), and
    a completion under a limit is the start of the same request's longer completion."""
    refs = [
        scratch.write(f"i{k}", random_adapter(layout, seed=20 + k, a_std=None, b_std=1.0), layout, torch.float32)
        for k in range(6)
    ]
    adapters = [None, *refs]
    count = 3 * len(adapters)
    batch_prompts = [prompts[i % len(prompts)] for i in range(count)]
    batch_adapters = [adapters[i % len(adapters)] for i in range(count)]
    limits = [1 + (5 * i) % 12 for i in range(count)]
    mixed = vllm_engine.generate(batch_prompts, batch_adapters, limits)
    full = {a: texts(vllm_engine, a, batch_prompts) for a in adapters}
    for i, (completion, adapter, limit) in enumerate(zip(mixed, batch_adapters, limits)):
        assert completion.num_tokens <= limit
        alone = vllm_engine.generate([batch_prompts[i]], [adapter], 12)[0]
        assert completion.token_ids == alone.token_ids[:limit]
        assert alone.text == full[adapter][i]
    by_hf = hf_engine.generate(batch_prompts, batch_adapters, limits)
    assert [c.token_ids for c in by_hf] == [c.token_ids for c in mixed]
    vllm_engine.release(refs)
    hf_engine.release(refs)


def test_base_requests_stay_base_when_every_adapter_slot_is_busy(vllm_engine, scratch, layout, prompts):
    """vLLM's CPU LoRA ops gave base-model rows the last slot's adapter when max_loras
    adapters shared the batch; evora's replacement must not."""
    refs = [
        scratch.write(f"busy{i}", random_adapter(layout, seed=10 + i, a_std=None, b_std=1.0), layout, torch.float32)
        for i in range(4)
    ]  # max_loras=4: every slot in use
    n = len(prompts)
    mixed = vllm_engine.generate(prompts * 5, [r for r in refs for _ in prompts] + [None] * n, 12)
    assert [c.text for c in mixed[4 * n :]] == texts(vllm_engine, None, prompts)
    assert [c.text for c in mixed[3 * n : 4 * n]] == texts(vllm_engine, refs[3], prompts)
    vllm_engine.release(refs)


def test_scratch_ids_are_fresh_and_folders_are_removed(layout):
    tag = f"pytest-ids-{os.getpid()}"  # the sweep counts every process's folders of a tag: only ours
    store = AdapterScratch("/dev/shm", tag)
    tensors = random_adapter(layout, seed=0, a_std=None, b_std=0.1)
    refs = [store.write("x", tensors, layout, torch.float32) for _ in range(3)]
    assert [r.lora_id for r in refs] == [1, 2, 3]
    store.remove(refs[:1])
    assert not os.path.exists(refs[0].path)
    assert sweep_run_scratch("/dev/shm", tag) == 1
    assert not store.dir.exists()


def test_held_adapters_carry_cast_tensors_and_their_config_under_fresh_ids(layout):
    from evora.lora.peft_io import adapter_config

    store = AdapterScratch("/dev/shm", f"pytest-hold-{os.getpid()}")
    tensors = random_adapter(layout, seed=0, a_std=None, b_std=0.1)
    written = store.write("w", tensors, layout, torch.float32)
    held = store.hold("h", tensors, layout, torch.bfloat16)
    assert (written.lora_id, held.lora_id) == (1, 2) and held.name == "h#2" and held.path == ""
    assert set(held.tensors) == set(tensors) and held.config == adapter_config(layout)
    assert all(
        t.dtype == torch.bfloat16 and torch.equal(t, tensors[k].to(torch.bfloat16)) for k, t in held.tensors.items()
    )
    assert held == AdapterRef(2, "h#2", "")  # refs compare (and hash) by id, name and path only
    with pytest.raises(ValueError, match="do not match the layout"):
        store.hold("bad", dict(list(tensors.items())[1:]), layout, torch.float32)
    store.remove([written, held])
    store.cleanup()


def test_adapters_held_in_memory_serve_what_their_files_serve(vllm_engine, scratch, layout, prompts):
    """No file round trip: vLLM builds each adapter from the tensors its request carries
    (engines/vllm_patches.py), and serves exactly what it serves from the same adapter's folder."""
    assert vllm_engine.loads_from_memory
    tensors = [random_adapter(layout, seed=40 + k, a_std=None, b_std=1.0) for k in range(3)]
    files = [scratch.write(f"f{k}", t, layout, torch.float32) for k, t in enumerate(tensors)]
    held = [scratch.hold(f"m{k}", t, layout, torch.float32) for k, t in enumerate(tensors)]
    n = len(prompts)
    by_file = vllm_engine.generate(prompts * 4, [r for r in [*files, None] for _ in range(n)], 12)
    by_memory = vllm_engine.generate(prompts * 4, [r for r in [*held, None] for _ in range(n)], 12)
    assert [c.token_ids for c in by_memory] == [c.token_ids for c in by_file]
    assert len({tuple(c.token_ids for c in by_memory[k * n : (k + 1) * n]) for k in range(4)}) == 4
    vllm_engine.release(files + held)
    scratch.remove(files + held)


def test_tiny_model_base_accuracy_is_clearly_between_0_and_1(vllm_engine, tokenizer):
    """The quickstart needs room to improve: the base model answers just the sum about
    half the time (it knows most sums but often keeps writing)."""
    heldout = build_task(task_config("addition", eval_size=256), seed=0).splits().heldout
    pairs = [(e.data["a"], e.data["b"]) for e in heldout]
    out = vllm_engine.generate([tokenizer(e.prompt).input_ids for e in heldout], [None] * len(pairs), 8)
    exact = sum(c.text.strip() == str(a + b) for c, (a, b) in zip(out, pairs)) / len(pairs)
    first = sum(c.text.split(" ")[0] == str(a + b) for c, (a, b) in zip(out, pairs)) / len(pairs)
    assert 0.25 < exact < 0.75, exact
    assert first > 0.9, first


def test_grouped_cpu_lora_ops_are_installed_and_take_the_linear_layers(
    vllm_engine, scratch, layout, prompts, monkeypatch
):
    import vllm.lora.punica_wrapper.punica_cpu as punica_cpu

    from evora.engines import vllm_cpu_lora

    assert vllm_engine.grouped_cpu_lora
    assert punica_cpu.bgmv_shrink is vllm_cpu_lora.bgmv_shrink
    assert punica_cpu.PunicaWrapperCPU._evora_grouped
    calls = []
    grouped = vllm_cpu_lora.grouped_lora_linear

    def counted(y, x, groups, weights, scale):
        calls.append(len(groups.slots))
        return grouped(y, x, groups, weights, scale)

    monkeypatch.setattr(vllm_cpu_lora, "grouped_lora_linear", counted)
    refs = [
        scratch.write(f"g{i}", random_adapter(layout, seed=i, a_std=None, b_std=0.5), layout, torch.float32)
        for i in range(2)
    ]
    vllm_engine.generate(prompts[:4] * 2, [refs[0]] * 4 + [refs[1]] * 4, 4)
    vllm_engine.release(refs)
    scratch.remove(refs)
    assert calls and max(calls) == 2  # both adapters in one batched product, every step


def test_vllm_wraps_only_the_modules_the_layout_targets(vllm_engine):
    """No LoRA wrapper on the embedding, the logits or untargeted layers: their products would
    run every step and add nothing."""

    def wrapped(worker) -> list[str]:
        from vllm.lora.layers import BaseLayerWithLoRA

        model = worker.model_runner.model
        return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, BaseLayerWithLoRA)})

    assert vllm_engine.llm.collective_rpc(wrapped)[0] == ["down_proj", "qkv_proj"]


def test_perplexity_of_vllm_and_hf_agree_within_one_percent(vllm_engine, hf_engine, scratch, layout, tokenizer):
    from evora.tasks.fitness import perplexity
    from evora.tasks.prompts import PromptRenderer

    renderer = PromptRenderer(tokenizer, "plain")
    examples = build_task(task_config("addition", eval_size=32), seed=0).splits().heldout
    prompts = [renderer.ids(e) for e in examples]
    targets = [renderer.target_ids(e) for e in examples]
    ref = scratch.write("ppl", random_adapter(layout, seed=3, a_std=None, b_std=0.5), layout, torch.float32)
    mixed = [None if i % 2 else ref for i in range(len(prompts))]  # base and adapter in one call
    for adapters in ([None] * len(prompts), [ref] * len(prompts), mixed):
        ppl_vllm = [perplexity(lp) for lp in vllm_engine.score(prompts, targets, adapters)]
        ppl_hf = [perplexity(lp) for lp in hf_engine.score(prompts, targets, adapters)]
        for a, b in zip(ppl_vllm, ppl_hf):
            assert abs(a - b) <= 0.01 * b, (a, b)
    assert len(set(round(p, 3) for p in ppl_vllm)) > 1  # per-example values, not one constant
    vllm_engine.release([ref])
    hf_engine.release([ref])


def test_hf_engine_changes_its_base_weights_in_place_under_an_adapter(spec, scratch, layout, prompts):
    """The engine protocol's base-weight hook (full-weight ES updates engines through it)."""
    engine = create_engine("hf", spec)
    name = "model.layers.1.mlp.down_proj.weight"
    original = engine.base_weights([name])[name]
    before = texts(engine, None, prompts)
    adapter = scratch.write("hook", random_adapter(layout, 5, None, 0.05), layout, torch.float32)
    texts(engine, adapter, prompts)  # PEFT now wraps down_proj: the name must still reach its base weight
    changed = original + 0.5 * torch.randn(original.shape, generator=torch.Generator().manual_seed(0))
    engine.set_base_weights({name: changed})
    assert torch.equal(engine.base_weights([name])[name], changed)
    assert texts(engine, None, prompts) != before
    engine.set_base_weights({name: original})
    assert texts(engine, None, prompts) == before
    with pytest.raises(ValueError, match="shape"):
        engine.set_base_weights({name: original.T})
    with pytest.raises(KeyError, match="no such base weight"):
        engine.base_weights(["model.layers.9.mlp.down_proj.weight"])
    engine.release([adapter])
    scratch.remove([adapter])


def test_eggroll_updates_move_vllm_and_hf_weights_alike(vllm_engine, hf_engine, tiny_shapes, tiny_path, prompts):
    """After 3 EGGROLL updates (same seeds, same fitness) vLLM's weights equal transformers'
    exactly (fp32 on CPU: tolerance 0), through vLLM's fused qkv / gate_up layers and its CPU
    weight packing; greedy completions agree on every prompt and differ from the base model's."""
    import numpy as np

    from evora.lora.base_weights import read_weights
    from evora.strategies.eggroll import EggrollConfig, EggrollStrategy
    from evora.strategies.full_weights import matrix_name
    from evora.strategies.protocol import StrategyContext, fitness_results

    every = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    layout = build_layout(tiny_shapes, rank=1, alpha=1, target_modules=every, layers=[1], base_model=tiny_path)
    names = [matrix_name(slot.name) for slot in layout.modules]
    eggroll = EggrollStrategy(EggrollConfig(population=8, sigma=0.05, lr=0.01, optimizer="adam"), run_seed=0)
    state = eggroll.initial_state(StrategyContext(0, layout, tiny_path))
    original = read_weights(tiny_path, names)
    master = eggroll.start_master(original)
    for generation in range(3):
        specs, _ = eggroll.ask(state, generation)
        fitness = np.random.default_rng(generation).normal(size=8)
        state = eggroll.tell(state, specs, fitness_results(generation, fitness)).state
        eggroll.apply(master, eggroll.update_of(state, generation))
    before = texts(vllm_engine, None, prompts)
    assert all(torch.equal(vllm_engine.base_weights(names)[n], original[n]) for n in names)
    try:
        vllm_engine.set_base_weights(master.tensors)
        hf_engine.set_base_weights(master.tensors)
        from_vllm, from_hf = vllm_engine.base_weights(names), hf_engine.base_weights(names)
        assert all(
            torch.equal(from_vllm[n], from_hf[n]) and torch.equal(from_vllm[n], master.tensors[n]) for n in names
        )
        after_vllm, after_hf = texts(vllm_engine, None, prompts), texts(hf_engine, None, prompts)
        assert after_vllm == after_hf
        changed = sum(a != b for a, b in zip(after_vllm, before))
        assert changed >= len(prompts) // 4, f"the update changed only {changed} of {len(prompts)} completions"
    finally:  # the module's engines serve the other tests with the model's own weights
        vllm_engine.set_base_weights(original)
        hf_engine.set_base_weights(original)
    assert texts(vllm_engine, None, prompts) == before
    down = matrix_name(layout.modules[-1].name)  # 128 x 384: its transpose cannot fit
    with pytest.raises(ValueError, match="shape"):
        vllm_engine.set_base_weights({down: original[down].T})


# vLLM's top-k KL (KL_TOP_K = 20 of the tiny model's 472 tokens) against the hf engine's exact
# full-vocabulary KL (itself checked against a merged transformers model in tests/unit/test_kl.py),
# per completion (mean over its tokens). Measured: at ~0.017 nats/token at most 3.2e-5 nats and
# 0.4% off per completion, 0.02% on the mean; at ~2 nats/token the mean is 18% low (a lower bound).
KL_MILD_ABS, KL_MILD_REL = 1e-4, 0.02
KL_STRONG_MIN_RATIO = 0.75


def test_vllm_top_k_kl_is_close_to_the_exact_kl(vllm_engine, hf_engine, scratch, layout, tokenizer):
    from evora.tasks.prompts import PromptRenderer

    renderer = PromptRenderer(tokenizer, "plain")
    prompts = [renderer.ids(e) for e in build_task(task_config("addition", eval_size=32), seed=0).splits().heldout]
    n = len(prompts)
    mild, strong, zero = (
        scratch.write(f"kl{i}", random_adapter(layout, seed=3 + i, a_std=None, b_std=b_std), layout, torch.float32)
        for i, b_std in enumerate((0.1, 0.5, 0.0))
    )
    adapters = [mild] * n + [strong] * n + [zero] * n + [None] * n  # every kind in one call
    completions = [list(c.token_ids) for c in vllm_engine.generate(prompts * 4, adapters, 16)]
    completions[0] = []  # no positions: no value
    estimate = vllm_engine.kl_to_base(prompts * 4, completions, adapters)
    exact = hf_engine.kl_to_base(prompts * 4, completions, adapters)
    assert [len(row) for row in estimate] == [len(c) for c in completions]
    est = [float(sum(row) / len(row)) if row else 0.0 for row in estimate]
    ref = [float(sum(row) / len(row)) if row else 0.0 for row in exact]
    mild_est, mild_ref, strong_est, strong_ref = est[:n], ref[:n], est[n : 2 * n], ref[n : 2 * n]
    worst = max(abs(a - b) for a, b in zip(mild_est, mild_ref))
    mild_bias, strong_ratio = sum(mild_est) / sum(mild_ref) - 1, sum(strong_est) / sum(strong_ref)
    print(f"mild: exact {sum(mild_ref) / n:.5f} nats/token, vLLM {mild_bias:+.1e} relative, worst |error| {worst:.1e}")
    print(f"strong: exact {sum(strong_ref) / n:.3f} nats/token, vLLM {strong_ratio:.3f} of it")
    assert sum(mild_ref) / n > 0.005
    for a, b in zip(mild_est, mild_ref):
        assert abs(a - b) <= KL_MILD_ABS + KL_MILD_REL * b, (a, b)
    for a, b in zip(strong_est, strong_ref):  # a lower bound, up to the engines' fp32 differences
        assert a <= b * (1 + 1e-3) + 1e-4, (a, b)
    assert strong_ratio >= KL_STRONG_MIN_RATIO
    assert max(v for row in estimate[2 * n :] for v in row) <= 1e-6  # B = 0, and the base model: 0
    # A completion that fills the context (prompt + completion = max_model_len) is still scored.
    long_prompt, filler = (prompts[1] * 40)[: 512 - 12], (completions[1] * 12)[:12]
    (long_estimate,), (long_exact,) = (e.kl_to_base([long_prompt], [filler], [mild]) for e in (vllm_engine, hf_engine))
    assert len(long_estimate) == 12
    for a, b in zip(long_estimate, long_exact):
        assert abs(a - b) <= KL_MILD_ABS + KL_MILD_REL * b, (a, b)
    vllm_engine.release([mild, strong, zero])
    hf_engine.release([mild, strong, zero])
