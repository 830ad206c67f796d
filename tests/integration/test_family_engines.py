"""The architecture matrix at engine level (tiny random-weight models from transformers' config
classes): for each dense family, vLLM and the transformers engine give the same greedy
completions under an ES candidate's adapter on the `auto` layout and after an EGGROLL update of
every projection; the adapter, as written for the engines, reloads in PEFT with the engines'
completions. One vLLM engine per family, shut down before the next. GPT-2 and the mixture run on
the transformers engine only (vLLM refuses them before Ray: tests/integration/test_model_families.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import family_path
from evora.engines import create_engine
from evora.engines.adapter_store import AdapterScratch
from evora.engines.vllm_spec import VLLMSpec
from evora.lora.base_weights import read_weights
from evora.lora.layout import AdapterLayout, build_layout
from evora.lora.modules import adaptable_modules
from evora.strategies.eggroll import EggrollConfig, EggrollStrategy
from evora.strategies.es import ESConfig, EvolutionStrategy
from evora.strategies.full_weights import matrix_name, transposed_matrices
from evora.strategies.protocol import StrategyContext, fitness_results
from evora.tasks.builtin.addition import heldout_pairs, prompt_of

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("family-engines")]
DENSE = ["qwen2", "qwen3", "mistral", "gemma2", "phi3"]
HF_ONLY = ["gpt2", "qwen3_moe"]  # vLLM: no LoRA for GPT-2; no fused-MoE kernels on CPU
PROMPT_TEXTS = [prompt_of(a, b) for a, b in heldout_pairs()[3::50]][:16]
MAX_TOKENS = 10
# The candidate's B and noise: enough to change every completion. Gemma 2 on vLLM's CPU build parts
# from transformers (and PEFT) once q and k adapters push attention logits towards its soft cap
# (attn_logit_softcapping=50): measured, 2 of 16 prompts differ at 0.2 and all 16 at 0.5.
STD = 0.1


def auto_layout(path: str) -> AdapterLayout:
    return build_layout(adaptable_modules(path), rank=8, alpha=16, target_modules="auto", layers=None, base_model=path)


def es_candidate(layout: AdapterLayout, path: str) -> dict[str, torch.Tensor]:
    """The first candidate of ES's first generation, started away from B = 0 (a random model
    earns no reward, so nothing else would move it)."""
    es = EvolutionStrategy(ESConfig(population=4, sigma=STD, init_b_std=STD), run_seed=0)
    specs, payload = es.ask(es.initial_state(StrategyContext(0, layout, path)), 0)
    return es.materialise(payload, specs[0])


def eggroll_weights(layout: AdapterLayout, path: str) -> dict[str, torch.Tensor]:
    """Every projection's weight after two EGGROLL updates under arbitrary fitness."""
    eggroll = EggrollStrategy(EggrollConfig(population=8, sigma=0.05, lr=0.02, optimizer="adam"), run_seed=0)
    state = eggroll.initial_state(StrategyContext(0, layout, path))
    names = [matrix_name(slot.name) for slot in layout.modules]
    master = eggroll.start_master(read_weights(path, names), transposed_matrices(layout))  # GPT-2: [in, out]
    for generation in range(2):
        specs, _ = eggroll.ask(state, generation)
        fitness = np.random.default_rng(generation).normal(size=len(specs))
        state = eggroll.tell(state, specs, fitness_results(generation, fitness)).state
        eggroll.apply(master, eggroll.update_of(state, generation))
    return master.tensors


def greedy(engine, adapter, prompts: list[list[int]]) -> list[tuple[int, ...]]:
    return [c.token_ids for c in engine.generate(prompts, [adapter] * len(prompts), MAX_TOKENS)]


def peft_greedy(path: str, adapter_dir: str, prompts: list[list[int]]) -> list[tuple[int, ...]]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), adapter_dir)
    out = []
    for prompt in prompts:
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False)[0]
        out.append(tuple(ids[len(prompt) :].tolist()))
    return out


def eggroll_layout(layout: AdapterLayout, path: str) -> AdapterLayout:
    """EGGROLL moves linear and Conv1D weights; on a mixture, its attention."""
    if not layout.has_experts:
        return layout
    attention = ["q_proj", "k_proj", "v_proj", "o_proj"]
    return build_layout(
        adaptable_modules(path), rank=1, alpha=1, target_modules=attention, layers=None, base_model=path
    )


@pytest.mark.parametrize("family", [*DENSE, *HF_ONLY])
def test_the_engines_agree_on_a_family_under_lora_and_full_weight_updates(family, tmp_path):
    """Where vLLM runs the family, it and transformers give the same greedy tokens; everywhere,
    PEFT reloads the written adapter with the engine's tokens, and a full-weight update moves them."""
    from transformers import AutoTokenizer

    path = family_path(family)
    layout = auto_layout(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [tokenizer(text).input_ids for text in PROMPT_TEXTS]
    spec = VLLMSpec(
        model=path, dtype="float32", max_lora_rank=8, max_loras=2, lora_target_modules=layout.target_modules
    )
    scratch = AdapterScratch(str(tmp_path), family)  # its folders last as long as it does
    adapter = scratch.write("es", es_candidate(layout, path), layout, torch.float32)
    engines = [create_engine(name, spec) for name in (("hf",) if family in HF_ONLY else ("hf", "vllm"))]
    try:
        base, adapted = agreed(engines, None, prompts), agreed(engines, adapter, prompts)
        assert sum(a != b for a, b in zip(adapted, base)) >= len(prompts) // 2, "is the adapter applied?"
        assert peft_greedy(path, adapter.path, prompts) == adapted
        updated = eggroll_weights(eggroll_layout(layout, path), path)
        for engine in engines:
            engine.set_base_weights(updated)
        assert agreed(engines, None, prompts) != base
    finally:
        for engine in engines:
            engine.shutdown()


def agreed(engines: list, adapter, prompts: list[list[int]]) -> list[tuple[int, ...]]:
    """The engines' greedy tokens, asserted equal across them."""
    first, *others = [greedy(engine, adapter, prompts) for engine in engines]
    assert all(other == first for other in others), f"the engines disagree: {first} != {others}"
    return first
