"""vLLM with multi-LoRA batching: one `generate` over every (candidate, prompt) pair.

The engine runs inside the worker's process (no engine-core or executor subprocesses
for tensor-parallel size 1), with prefix caching off so no cached prefix computed under
one adapter is reused under another.

Sampled requests (one `Sampling` each) carry their seed, so each gets its own generator and its
tokens do not depend on the rest of the batch; with `use_fp64_gumbel` vLLM's sampler is the one
that `engines/sampling.py` reproduces for the transformers engine.

`kl_to_base` estimates KL(adapter || base) per completion token from vLLM's top-k prompt
logprobs (k = KL_TOP_K), since vLLM returns no full next-token distributions: the exact KL
of the two distributions coarse-grained to {each token in both top-k lists (every completion
token but the last is: vLLM adds the actual prompt token)} + {every other token}. By the
data-processing inequality it is a lower bound of the full-vocabulary KL, >= 0 and 0 for
identical distributions; its bias is the divergence inside the lumped tail. On the tiny
model (472 tokens), against the exact KL (tests/integration/test_engines.py): at ~0.017
nats/token within 3.2e-5 nats (0.4%) per completion and 0.02% on the mean; at ~2 nats/token
(a far-off adapter) 15-18% low.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from typing import Any, Mapping, Sequence, cast

import torch
from safetensors.torch import save_file

from evora.engines import vllm_patches
from evora.engines.base import AdapterRef, Completion, Sampling, per_request
from evora.engines.environment import vllm_environment
from evora.engines.sampling import vllm_sampling_params
from evora.engines.vllm_spec import VLLMSpec
from evora.engines.vllm_weights import EXTENSION, check_vllm, whole_matrices
from evora.lora.noise import DenseNoise, perturbed_on

log = logging.getLogger(__name__)

# Top-k of the KL estimate: vLLM's default max_logprobs, so no engine argument has to change.
# (vLLM's prompt_logprob_token_ids would give the base's logprobs of the adapter's very tokens,
# but needs the V2 model runner, which the CPU LoRA path here does not use.)
# On the tiny model k = 50 lowered the bias at ~1.7 nats/token only from 15% to 14%, and the
# Python-side cost grows with k at every position of every sequence.
KL_TOP_K = 20
# Weights handed to tensor-parallel ranks go through a file here: tmpfs where the system has one.
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None
# fp32 logprobs summed over ~k tokens carry ~1e-6 rounding: a leftover mass below this is noise.
REST_FLOOR = 1e-6


def completion(output: Any) -> Completion:
    ids = tuple(output.outputs[0].token_ids)
    return Completion(output.outputs[0].text, len(ids), ids)


def position_logprobs(prompt_logprobs: Any, position: int) -> dict[int, float]:
    """token id -> logprob at one position of vLLM's prompt or sample logprobs (list of dicts or FlatLogprobs)."""
    return {token: entry.logprob for token, entry in prompt_logprobs[position].items()}


def distributions(output: Any, start: int) -> list[dict[int, float]]:
    """The top-k next-token distributions from position `start` of a scored sequence to the
    token vLLM generated after it: prompt logprobs, then the sampled token's logprobs."""
    prompt = [position_logprobs(output.prompt_logprobs, j) for j in range(start, len(output.prompt_token_ids))]
    return [*prompt, position_logprobs(output.outputs[0].logprobs, 0)]


def top_k_kl(adapted: Mapping[int, float], base: Mapping[int, float]) -> float:
    """KL(p_a || p_b) of two next-token distributions known by their top-k logprobs, lumped to
    {tokens in both lists} + {the rest}: a lower bound of the full-vocabulary KL (see the module)."""
    kl, mass_a, mass_b = 0.0, 0.0, 0.0
    for token, logp_a in adapted.items():
        if token in base:
            p_a = math.exp(logp_a)
            kl += p_a * (logp_a - base[token])
            mass_a += p_a
            mass_b += math.exp(base[token])
    rest_a = max(1.0 - mass_a, 0.0)
    # Raising the base's rest to the floor only lowers rest_a * log(rest_a / rest_b): still a lower bound.
    rest_b = max(1.0 - mass_b, REST_FLOOR)
    if rest_a > REST_FLOOR:
        kl += rest_a * math.log(rest_a / rest_b)
    return max(kl, 0.0)  # >= 0 exactly; rounding can leave -1e-9 for equal distributions


def lora_request(adapter: AdapterRef) -> Any:
    from vllm.lora.request import LoRARequest

    if adapter.tensors is None:
        return LoRARequest(adapter.name, adapter.lora_id, adapter.path)
    return vllm_patches.memory_request(adapter.name, adapter.lora_id, adapter.tensors, adapter.config)


def llm_args(spec: VLLMSpec) -> dict[str, Any]:
    """vLLM's `LLM` keyword arguments for an engine spec (its own vllm_args last, so a user's win)."""
    args: dict[str, Any] = dict(
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
        worker_extension_cls=EXTENSION,  # base weights by checkpoint name (full-weight strategies)
        lora_target_modules=None if spec.lora_target_modules is None else list(spec.lora_target_modules),
        # Seeded sampling through fp64 exponential noise drawn from each request's generator
        # (`random_sample`), which the transformers engine reproduces (engines/sampling.py);
        # without it vLLM's CPU build samples with a fused C++ Gumbel kernel instead.
        use_fp64_gumbel=True,
    )
    if spec.device == "cpu":  # for a process without VLLM_CPU_KVCACHE_SPACE
        args["kv_cache_memory_bytes"] = spec.kv_cache_gib * 2**30
    elif not spec.enforce_eager:  # CUDA graphs for the batch sizes a unit can reach, no larger
        args["compilation_config"] = {"max_cudagraph_capture_size": min(spec.max_num_seqs, spec.max_batch)}
    args.update(spec.vllm_args)
    return args


class VLLMEngine:
    def __init__(self, spec: VLLMSpec):
        self.ignore_eos = spec.ignore_eos
        self.grouped_cpu_lora = False
        self.device = spec.device
        self.tensor_parallel_size = spec.tensor_parallel_size
        missing = {k: v for k, v in vllm_environment(spec).items() if os.environ.get(k) != v}
        if missing:  # (worker actors get it through Ray's runtime_env)
            log.warning("vLLM engine started without %s in its environment (see vllm_environment)", missing)
        if spec.device == "cpu":
            self.grouped_cpu_lora = vllm_patches.install_cpu_lora()
        # A request object reaches the model runner only in this process (no engine-core
        # process, no tensor-parallel workers): then adapters may travel as tensors.
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0" and spec.tensor_parallel_size == 1
        self.loads_from_memory = spec.adapters_in_memory and in_process and vllm_patches.install_memory_adapters()
        from vllm import LLM

        check_vllm()
        self.llm = LLM(**llm_args(spec))

    def _run(self, prompts: Sequence[list[int]], adapters: Sequence[AdapterRef | None], params: Any) -> list:
        from vllm.inputs import TokensPrompt

        requests = [None if a is None else lora_request(a) for a in adapters]
        return self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            params,
            # None entries (base-model requests) are accepted (LLM._lora_request_to_seq), though
            # LLM.generate's annotation is Sequence[LoRARequest].
            lora_request=cast(Any, requests),
            use_tqdm=False,
        )

    def generate(
        self,
        prompts: Sequence[list[int]],
        adapters: Sequence[AdapterRef | None],
        max_tokens: int | Sequence[int],
        sampling: Sequence[Sampling] | None = None,
    ) -> list[Completion]:
        from vllm import SamplingParams

        if isinstance(max_tokens, int) and sampling is None:
            params: Any = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=self.ignore_eos)
        else:  # one limit or sampling per request: vLLM takes a list of sampling parameters
            params = vllm_sampling_params(per_request(max_tokens, len(prompts)), sampling, self.ignore_eos)
        if self.device == "cpu" and not self.grouped_cpu_lora:
            return self._base_apart(prompts, adapters, params)
        return [completion(o) for o in self._run(prompts, adapters, params)]

    def _base_apart(
        self, prompts: Sequence[list[int]], adapters: Sequence[AdapterRef | None], params: Any
    ) -> list[Completion]:
        """vLLM's own CPU LoRA ops apply the last slot's adapter to base-model rows of a mixed
        batch (see vllm_cpu_lora); without the replacement, base requests run on their own."""
        results: dict[int, Completion] = {}
        for wanted in (True, False):
            indices = [i for i, a in enumerate(adapters) if (a is None) == wanted]
            if indices:
                subset = params if not isinstance(params, list) else [params[i] for i in indices]
                outputs = self._run([prompts[i] for i in indices], [adapters[i] for i in indices], subset)
                for i, o in zip(indices, outputs):
                    results[i] = completion(o)
        return [results[i] for i in range(len(prompts))]

    def _one_adapter_per_call(
        self, sequences: Sequence[list[int]], adapters: Sequence[AdapterRef | None], params: Any
    ) -> list[Any]:
        """vLLM's outputs for each sequence: on a GPU in one call; on a CPU one adapter per call,
        since vLLM's CPU logits path cannot attribute prompt rows (prompt logprobs) in mixed batches."""
        if self.device != "cpu":
            return self._run(sequences, adapters, params)
        groups: dict[AdapterRef | None, list[int]] = {}
        for i, adapter in enumerate(adapters):
            groups.setdefault(adapter, []).append(i)
        results: list[Any] = [None] * len(sequences)
        for adapter, indices in groups.items():
            outputs = self._run([sequences[i] for i in indices], [adapter] * len(indices), params)
            for i, output in zip(indices, outputs):
                results[i] = output
        return results

    def score(
        self, prompts: Sequence[list[int]], targets: Sequence[list[int]], adapters: Sequence[AdapterRef | None]
    ) -> list[list[float]]:
        from vllm import SamplingParams

        # prompt_logprobs=0: the log-probability of each actual prompt token, nothing more.
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
        sequences = [list(p) + list(t) for p, t in zip(prompts, targets)]
        outputs = self._one_adapter_per_call(sequences, adapters, params)
        return [
            [position[token].logprob for position, token in zip(output.prompt_logprobs[len(prompt) :], target)]
            for output, prompt, target in zip(outputs, prompts, targets)
        ]

    def kl_to_base(
        self,
        prompts: Sequence[list[int]],
        completions: Sequence[list[int]],
        adapters: Sequence[AdapterRef | None],
        base: Mapping[str, torch.Tensor] | None = None,
    ) -> list[list[float]]:
        from vllm import SamplingParams

        kl = [[0.0] * len(c) for c in completions]  # base rows (and empty completions) stay 0
        measured = [base is not None or a is not None for a in adapters]
        rows = [i for i, wanted in enumerate(measured) if wanted and len(completions[i]) > 0]
        if not rows:
            return kl
        # The last completion token stays out of the sequence: the distribution that predicted it
        # is the one vLLM samples the next token from (logprobs=k), so a completion that filled
        # the context (prompt + completion = max_model_len) still fits. Flat logprobs and no
        # detokenising: k + 1 entries come back for every position of every sequence.
        params = SamplingParams(
            temperature=0.0,
            max_tokens=1,
            logprobs=KL_TOP_K,
            prompt_logprobs=KL_TOP_K,
            detokenize=False,
            flat_logprobs=True,
        )
        sequences = [list(prompts[i]) + list(completions[i][:-1]) for i in rows]
        adapted = self._one_adapter_per_call(sequences, [adapters[i] for i in rows], params)
        current = None if base is None else self.base_weights(list(base))
        if base is not None:
            self.set_base_weights(base)
        try:
            reference = self._one_adapter_per_call(sequences, [None] * len(rows), params)
        finally:
            if current is not None:  # the engine's own values back, bitwise (they are in its dtype)
                self.set_base_weights(current)
        for i, with_adapter, without in zip(rows, adapted, reference):
            start = len(prompts[i])
            kl[i] = [top_k_kl(a, b) for a, b in zip(distributions(with_adapter, start), distributions(without, start))]
        return kl

    def release(self, adapters: Sequence[AdapterRef]) -> None:
        for adapter in adapters:
            self.llm.llm_engine.remove_lora(adapter.lora_id)

    def base_weights(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        ranks = self.llm.collective_rpc("evora_base_weights", args=(list(names),))
        return ranks[0] if self.tensor_parallel_size == 1 else whole_matrices(ranks)

    def set_base_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        if self.tensor_parallel_size == 1:  # in this process: `weights` pass by reference
            self.llm.collective_rpc("evora_set_base_weights", args=(dict(weights),))
            return
        # Ranks are processes of their own: the matrices are written once, and each rank reads
        # only its block of them (not every whole matrix pickled to every rank).
        with tempfile.TemporaryDirectory(prefix="evora-weights-", dir=SCRATCH) as folder:
            path = os.path.join(folder, "weights.safetensors")
            save_file({name: value.contiguous() for name, value in weights.items()}, path)
            self.llm.collective_rpc("evora_set_base_weights_from", args=(path,))

    def perturb_base(self, master: Mapping[str, torch.Tensor], noise: Sequence[DenseNoise]) -> None:
        if self.tensor_parallel_size == 1:  # in this process: `master` passes by reference
            self.llm.collective_rpc("evora_perturb_base", args=(master, list(noise)))
            return
        # Tensor-parallel ranks are processes of their own: each would be sent the master copies.
        # They are sent the candidate's matrices instead (each rank's weight_loader keeps its shard).
        self.set_base_weights({term.name: perturbed_on(master[term.name], term) for term in noise})

    def shutdown(self) -> None:
        del self.llm
