"""vLLM with multi-LoRA batching: one `generate` over every (candidate, prompt) pair.

The engine runs inside the worker's process (no engine-core or executor subprocesses
for tensor-parallel size 1), with prefix caching off so no cached prefix computed under
one adapter is reused under another.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch

from evora.engines.base import AdapterRef, Completion, EngineSpec

# The base-weight hook is specified in engines/base.py; for vLLM it needs a worker extension
# (worker_extension_cls + collective_rpc), which strategy=eggroll brings.
NOT_YET = (
    "engine=vllm: changing base weights in place needs vLLM's worker extension, which arrives with "
    "strategy=eggroll; engine=hf supports it today"
)


class VLLMEngine:
    def __init__(self, spec: EngineSpec):
        self.ignore_eos = spec.ignore_eos
        self.grouped_cpu_lora = False
        self.device = spec.device
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
            model=spec.model,
            tokenizer=spec.tokenizer or spec.model,
            revision=spec.revision,
            dtype=spec.dtype,
            max_model_len=spec.max_model_len,
            enable_lora=True,
            max_loras=spec.max_loras,
            max_lora_rank=spec.max_lora_rank,
            max_cpu_loras=spec.max_cpu_loras,
            max_num_seqs=spec.max_num_seqs,
            enforce_eager=spec.enforce_eager,
            enable_prefix_caching=False,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            seed=spec.seed,
            tensor_parallel_size=spec.tensor_parallel_size,
            trust_remote_code=spec.trust_remote_code,
            # TP > 1: the worker sits in a placement group of one-GPU bundles (distributed/placement.py);
            # vLLM's Ray executor puts a shard on each bundle.
            distributed_executor_backend="uni" if spec.tensor_parallel_size == 1 else "ray",
        )
        args.update(spec.vllm_args)
        self.llm = LLM(**args)

    def _run(self, prompts: Sequence[list[int]], adapters: Sequence[AdapterRef | None], params: Any) -> list:
        from vllm.lora.request import LoRARequest

        requests = [None if a is None else LoRARequest(a.name, a.lora_id, a.path) for a in adapters]
        return self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], params, lora_request=requests, use_tqdm=False
        )

    def generate(
        self, prompts: Sequence[list[int]], adapters: Sequence[AdapterRef | None], max_tokens: int
    ) -> list[Completion]:
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=self.ignore_eos)
        if self.device == "cpu" and not self.grouped_cpu_lora:
            return self._base_apart(prompts, adapters, params)
        return [
            Completion(o.outputs[0].text, len(o.outputs[0].token_ids)) for o in self._run(prompts, adapters, params)
        ]

    def _base_apart(
        self, prompts: Sequence[list[int]], adapters: Sequence[AdapterRef | None], params: Any
    ) -> list[Completion]:
        """vLLM's own CPU LoRA ops apply the last slot's adapter to base-model rows of a mixed
        batch (see vllm_cpu_lora); without the replacement, base requests run on their own."""
        results: list[Completion | None] = [None] * len(prompts)
        for wanted in (True, False):
            indices = [i for i, a in enumerate(adapters) if (a is None) == wanted]
            if indices:
                outputs = self._run([prompts[i] for i in indices], [adapters[i] for i in indices], params)
                for i, o in zip(indices, outputs):
                    results[i] = Completion(o.outputs[0].text, len(o.outputs[0].token_ids))
        return results  # type: ignore[return-value]

    def score(
        self, prompts: Sequence[list[int]], targets: Sequence[list[int]], adapters: Sequence[AdapterRef | None]
    ) -> list[list[float]]:
        from vllm import SamplingParams

        # prompt_logprobs=0: the log-probability of each actual prompt token, nothing more. One
        # adapter per call: vLLM's CPU logits path cannot attribute prompt rows in mixed batches.
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
        groups: dict[AdapterRef | None, list[int]] = {}
        for i, adapter in enumerate(adapters):
            groups.setdefault(adapter, []).append(i)
        scores: list[list[float]] = [[] for _ in prompts]
        for adapter, indices in groups.items():
            outputs = self._run(
                [list(prompts[i]) + list(targets[i]) for i in indices], [adapter] * len(indices), params
            )
            for i, output in zip(indices, outputs):
                positions = output.prompt_logprobs[len(prompts[i]) :]
                scores[i] = [position[token].logprob for position, token in zip(positions, targets[i])]
        return scores

    def release(self, adapters: Sequence[AdapterRef]) -> None:
        for adapter in adapters:
            self.llm.llm_engine.remove_lora(adapter.lora_id)

    def base_weights(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        raise NotImplementedError(NOT_YET)

    def set_base_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        raise NotImplementedError(NOT_YET)

    def shutdown(self) -> None:
        del self.llm
