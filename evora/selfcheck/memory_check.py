"""The memory the run would need on one GPU (evora's estimate: weights, LoRA slots, KV cache,
master copies; evora/models/memory.py) against what the GPU has free now, which is what vLLM
checks its `gpu_memory_utilization` share against when it starts."""

from __future__ import annotations

from evora.models.memory import GIB
from evora.selfcheck.checks import Check, Finding, Node, register_check


def check_memory(node: Node) -> Finding:
    import torch

    from evora.lora.modules import model_modules
    from evora.models import locate_model
    from evora.plan.fit import memory_need, plan_memory
    from evora.plan.run_plan import model_layout

    run = node.run
    assert run is not None  # memory_unavailable skips without one
    path = locate_model(run.model.path).path
    modules = model_modules(path, revision=run.model.revision, trust_remote_code=run.model.trust_remote_code)
    memory = plan_memory(run, modules, model_layout(run, modules, path))
    need, budget = memory_need(run, memory)
    free, total = torch.cuda.mem_get_info(0)
    usable = min(budget, free)
    detail = (
        f"{run.model.path}: {need / GIB:.1f} GiB a worker (weights, LoRA slots, KV); the engine takes "
        f"{budget / GIB:.1f} of {total / GIB:.1f} GiB (hardware.gpu_memory_utilization), {free / GIB:.1f} free now"
    )
    fix = "hardware.gpu_memory_utilization, engine.max_num_seqs or model.max_model_len"
    return Finding(need <= usable, detail, "" if need <= usable else fix)


def memory_unavailable(node: Node) -> str | None:
    if node.run is None:
        return "no run config to estimate"
    return None if node.device == "cuda" else "no GPU here (`evora doctor` estimates a CPU run against the host)"


register_check(
    Check(
        "memory at your model",
        "the run's model, LoRA slots and KV cache fit in what the GPU has free now",
        check_memory,
        skip=memory_unavailable,
    )
)
