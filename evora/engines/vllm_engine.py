"""vLLM with multi-LoRA batching: one `generate` over every (candidate, prompt) pair.

The engine runs inside the worker's process (no engine-core or executor subprocesses
for tensor-parallel size 1), with prefix caching off so no cached prefix computed under
one adapter is reused under another.
"""

from __future__ import annotations

import os
from typing import Sequence

from evora.engines.base import AdapterRef, Completion, EngineSpec


class VLLMEngine:
    def __init__(self, spec: EngineSpec):
        self.ignore_eos = spec.ignore_eos
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if spec.device == "cpu":
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_gib)
            # evora sets the thread count itself (hardware.cpu_threads_per_worker): several
            # engines on one machine must not all bind the same cores.
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            from evora.engines import vllm_cpu_lora

            self.grouped_cpu_lora = vllm_cpu_lora.install()
        from vllm import LLM

        args = dict(
            model=spec.model, tokenizer=spec.tokenizer or spec.model, revision=spec.revision, dtype=spec.dtype,
            max_model_len=spec.max_model_len, enable_lora=True, max_loras=spec.max_loras,
            max_lora_rank=spec.max_lora_rank, max_cpu_loras=spec.max_cpu_loras, max_num_seqs=spec.max_num_seqs,
            enforce_eager=spec.enforce_eager, enable_prefix_caching=False,
            gpu_memory_utilization=spec.gpu_memory_utilization, seed=spec.seed,
            tensor_parallel_size=spec.tensor_parallel_size, trust_remote_code=spec.trust_remote_code,
            distributed_executor_backend="uni" if spec.tensor_parallel_size == 1 else "mp",
        )
        args.update(spec.vllm_args)
        self.llm = LLM(**args)

    def generate(self, prompts: Sequence[str], adapters: Sequence[AdapterRef | None],
                 max_tokens: int) -> list[Completion]:
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=self.ignore_eos)
        requests = [None if a is None else LoRARequest(a.name, a.lora_id, a.path) for a in adapters]
        outputs = self.llm.generate(list(prompts), params, lora_request=requests, use_tqdm=False)
        return [Completion(o.outputs[0].text, len(o.outputs[0].token_ids)) for o in outputs]

    def release(self, adapters: Sequence[AdapterRef]) -> None:
        for adapter in adapters:
            self.llm.llm_engine.remove_lora(adapter.lora_id)

    def shutdown(self) -> None:
        del self.llm
