"""The run's engine on this node: several LoRA candidates in one batch against PEFT's own
`generate` of the same adapters (greedy, token for token, fp32), on the run's model and on a tiny
mixture of experts; and es_full's candidates set inside the engine from seeds and restored,
bitwise. The engine is the one `node.engine` names, built from `node.spec` through the engine
registry, as a worker builds it."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import torch

from evora.engines.base import AdapterRef, Engine
from evora.engines.registry import get_engine
from evora.lora.layout import AdapterLayout, build_layout
from evora.lora.modules import adaptable_modules
from evora.selfcheck.checks import Check, Finding, Node, register_check
from evora.strategies.full_weights import matrix_name
from evora.strategies.master_weights import MasterWeights
from evora.strategies.protocol import StrategyContext

SEED = 3
CANDIDATES = 4
MAX_TOKENS = 8


def create(node: Node, **changes: Any) -> Engine:
    """The node's engine. Its process environment (what vLLM reads on import) is the entry point's
    to set, as a worker's is set for it: `evora doctor --run` sets it before the checks run."""
    quiet()
    return get_engine(node.engine).create(dataclasses.replace(node.spec, **changes))


def quiet() -> None:
    """The report's lines, not a progress bar per model written or loaded."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def candidate_layout(model: str) -> AdapterLayout:
    """Rank-8 LoRA on every adaptable projection of the model."""
    modules = adaptable_modules(model)
    return build_layout(modules, rank=8, alpha=16, target_modules="auto", layers=None, base_model=model)


def check_engine_vs_peft(node: Node) -> Finding:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evora.lora.peft_io import save_adapter
    from evora.strategies.es import ESConfig, EvolutionStrategy

    lay = candidate_layout(node.spec.model)
    es = EvolutionStrategy(ESConfig(population=CANDIDATES, sigma=0.05, init_b_std=0.02), SEED)
    state = es.initial_state(StrategyContext(SEED, lay, node.spec.model))
    specs, payload = es.ask(state, 0)
    rows = [[1, 5 + i, 9 + 2 * i, 17] for i in range(node.prompts)]
    eos = AutoTokenizer.from_pretrained(node.spec.tokenizer or node.spec.model).eos_token_id
    engine = create(node, dtype="float32")
    with tempfile.TemporaryDirectory() as folder:
        refs = []
        for i, spec in enumerate(specs):
            save_adapter(Path(folder) / f"c{i}", es.materialise(payload, spec), lay)
            refs.append(AdapterRef(i + 1, f"c{i}", str(Path(folder) / f"c{i}")))
        # Every candidate's rows in one call: the batch mixes adapters, as a work unit does.
        ours = engine.generate([r for _ in refs for r in rows], [ref for ref in refs for _ in rows], MAX_TOKENS)
        engine.shutdown()
        same = 0
        base: Any = AutoModelForCausalLM.from_pretrained(node.spec.model, dtype=torch.float32)
        base = base.to(node.device)
        for i, ref in enumerate(refs):
            peft = PeftModel.from_pretrained(base, ref.path, adapter_name=ref.name).eval()
            for j, row in enumerate(rows):
                same += list(ours[i * len(rows) + j].token_ids) == peft_tokens(peft, row, eos, node.device)
            base = peft.unload()
    total = len(refs) * len(rows)
    detail = f"{same}/{total} completions token for token ({len(refs)} candidates in one batch, fp32)"
    return Finding(same == total, detail, "" if same == total else f"engine={node.engine} (its LoRA path)")


def peft_tokens(peft: Any, row: list[int], eos: int, device: str) -> list[int]:
    """PEFT's greedy completion of one prompt, up to and with its first EOS."""
    ids = torch.tensor([row], device=device)
    out = peft.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False)
    tokens = out[0, len(row) :].tolist()
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def check_in_place(node: Node) -> Finding:
    from evora.strategies.es_full import EsFullConfig, EsFullStrategy

    engine, lay = create(node), candidate_layout(node.spec.model)
    names = [matrix_name(s.name) for s in lay.modules]
    held = engine.base_weights(names)
    dtype = next(iter(held.values())).dtype
    master = MasterWeights({k: v.to(torch.float32).to(node.device) for k, v in held.items()})
    es = EsFullStrategy(EsFullConfig(population=4, sigma=0.01), SEED)
    state = es.initial_state(StrategyContext(SEED, lay, node.spec.model))
    specs, payload = es.ask(state, 0)
    exact = True
    for spec in specs[:2]:
        engine.perturb_base(master.tensors, es.perturbation(payload, spec))
        held, wanted = engine.base_weights(names), es.perturbed(master, payload, spec)
        exact &= all(torch.equal(held[k], wanted[k].to(dtype).cpu()) for k in names)
    engine.set_base_weights(master.tensors)
    held = engine.base_weights(names)
    restored = all(torch.equal(held[k], master.tensors[k].to(dtype).cpu()) for k in names)
    engine.shutdown()
    detail = f"perturbed bitwise: {exact}; restored bitwise: {restored} ({len(names)} matrices, {dtype})"
    return Finding(
        exact and restored, detail, "" if exact and restored else f"engine={node.engine} (its weight writes)"
    )


register_check(
    Check(
        "engine vs PEFT",
        "the run's engine generates, for several LoRA candidates in one batch, PEFT's own greedy tokens",
        check_engine_vs_peft,
    )
)
register_check(
    Check(
        "es_full in place",
        "es_full's candidates set inside the engine from seeds are the fp32 ones cast, and restore exactly",
        check_in_place,
    )
)


def check_mixture_of_experts(node: Node) -> Finding:
    """`engine vs PEFT` on a tiny random-weight Qwen3-MoE (4 experts, 2 a token), built here."""
    from evora.distributed.worker_spec import vllm_target_modules
    from evora.models.build_family import build_family

    quiet()
    with tempfile.TemporaryDirectory() as folder:
        model = str(build_family("qwen3_moe", folder))
        targets = vllm_target_modules(candidate_layout(model))
        spec = dataclasses.replace(node.spec, model=model, tokenizer=None, lora_target_modules=targets)
        finding = check_engine_vs_peft(dataclasses.replace(node, spec=spec))
    return dataclasses.replace(finding, detail=f"Qwen3-MoE, every expert adapted: {finding.detail}")


def moe_unsupported(node: Node) -> str | None:
    """Why the node's engine cannot run LoRA on a mixture of experts here, or None."""
    from evora.lora.modules import modules_of_config
    from evora.models.build_family import FAMILIES

    support = get_engine(node.engine).supports(modules_of_config(FAMILIES["qwen3_moe"]()), node.device)
    return None if support.runs else support.why


register_check(
    Check(
        "mixture of experts",
        "the engine vs PEFT check on a tiny Qwen3-MoE: LoRA on every expert, in one batch",
        check_mixture_of_experts,
        skip=moe_unsupported,
    )
)
