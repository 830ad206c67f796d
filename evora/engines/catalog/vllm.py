"""engine=vllm: vLLM's multi-LoRA batches, a whole unit of candidates in one generate call;
tensor parallel on GPUs. Its environment (`environment.vllm_environment`) reaches each worker's
process through Ray's runtime_env; vLLM itself is imported only when a worker creates one."""

from evora.engines.environment import vllm_environment
from evora.engines.registry import POOLED, register_engine
from evora.engines.support import vllm_support
from evora.engines.vllm_spec import VLLMEngineConfig, vllm_spec

register_engine(
    "vllm",
    engine="evora.engines.vllm_engine:VLLMEngine",
    summary="vLLM: a unit's candidates as one multi-LoRA batch, tensor parallel on GPUs",
    memory=POOLED,
    lm_eval_backend="vllm",
    support=vllm_support,
    environment=vllm_environment,
    package="vllm",
    install='pip install "evora[gpu]" (or "evora[cpu]" without a GPU)',
    tensor_parallel=True,
    config=VLLMEngineConfig,
    spec=vllm_spec,
)
