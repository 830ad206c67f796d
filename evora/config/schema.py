"""Typed, frozen schemas of every config group (docs/architecture.md, "Configuration").

Hydra composes YAML onto these; `compose.to_run_config` turns the result into the
frozen dataclasses below, which the rest of evora reads. Ranges and cross-field rules
live in `validate.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

# vLLM's allowed `max_lora_rank` values (vllm.config.lora.MaxLoRARanks); a test checks
# this copy against the installed vLLM so validation needs no vLLM import.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """vLLM's max_lora_rank for adapters of `rank`: the smallest value vLLM allows that holds it."""
    return min(r for r in VLLM_LORA_RANKS if r >= rank)


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"
    path: str = "evora:tiny"  # hub id, local directory, or evora:<bundled asset>
    tokenizer: Optional[str] = None  # defaults to `path`
    revision: Optional[str] = None
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    max_model_len: int = 512
    trust_remote_code: bool = False


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 1
    alpha: float = 2.0
    # auto (the projections of the model's repeated layers, found from the model) or module-name suffixes
    target_modules: Any = "auto"
    layers: Optional[list[int]] = None  # None: every layer


@dataclass(frozen=True)
class JudgeConfig:
    """task.reward=judge: an LLM judge behind an OpenAI-compatible server (vLLM's, TGI's, a hosted API)."""

    url: Optional[str] = None  # the server's base URL, e.g. http://judge-host:8000/v1
    model: Optional[str] = None  # the served model's name
    api: str = "chat"  # chat: /chat/completions (the template is the user turn) | completions: /completions
    api_key_env: str = "EVORA_JUDGE_API_KEY"  # the environment variable holding the key ("none" when unset)
    template: str = (
        "Rate the response to the question from 0 to 10, where 10 is a correct and helpful answer.\n\n"
        "Question: {prompt}\n\nReference answer: {answer}\n\nResponse: {completion}\n\n"
        "Reply with the score only."
    )
    # The last match (its first group, if it has one) is the score: by default a line that is only a
    # number, or "Score: <number>"; "7/10", "-5", "1e400", "N/A" and a number inside prose are no score.
    score_pattern: str = r"(?im)^\s*(?:score:\s*)?(\d+(?:\.\d+)?)\s*$"
    score_range: list[float] = field(default_factory=lambda: [0.0, 10.0])  # a score outside it is invalid
    correct_at: Optional[float] = None  # a score at least this is correct; null: the top of score_range
    choices: list[str] = field(default_factory=list)  # vLLM's structured outputs: the answer is one of these
    max_tokens: int = 16
    temperature: float = 0.0
    concurrency: int = 32  # requests in flight per engine worker
    retries: int = 2  # the OpenAI client's retries, with its exponential back-off (connection errors, 408, 429, 5xx)
    # Deadline of one request: connecting, the reply's last byte, its retries and their waits (Retry-After too).
    timeout_s: float = 60.0
    # Deadline of one scoring call (a work unit's requests, however many): those still open then fail as
    # timeouts. Below engine.unit_timeout_s where that is set: a unit's generation and scoring share it.
    call_timeout_s: float = 600.0
    max_error_rate: float = 0.1  # a generation whose failed share of rewards passes this stops the run


@dataclass(frozen=True)
class RewardModelConfig:
    """task.reward=reward_model: a sequence-classification model scored on the engine worker's device."""

    path: Optional[str] = None  # a hub id or a local folder (AutoModelForSequenceClassification)
    revision: Optional[str] = None
    label: int = 0  # which logit is the reward (0 for the usual one-logit reward model)
    batch_size: int = 32
    dtype: str = "auto"  # auto: bfloat16 on GPUs, float32 on CPUs | float32 | bfloat16 | float16
    max_length: int = 1024  # prompt + completion tokens scored (truncated from the left)
    correct_at: float = 0.0  # a reward at least this counts as correct


@dataclass(frozen=True)
class TaskConfig:
    """The keys every task has; a task's own keys are in its config, a subclass registered with it
    (evora.tasks.registry)."""

    name: str = "addition"  # a registered task, or a class path like mypkg.tasks:MyTask
    train_size: int = 2048
    selection_size: int = 0
    eval_size: int = 256
    prompts_per_generation: int = 64
    max_tokens: int = 8
    data_path: Optional[str] = None
    dataset: Optional[str] = None  # hub dataset id, used when data_path is null
    dataset_config: Optional[str] = None
    prompt_format: str = "auto"  # auto: the chat template when the tokenizer has one | chat | plain
    system_prompt: Optional[str] = None
    # judge | reward_model | a user's reward function, mypkg.rewards:score (or one decorated with
    # @evora.batch_reward, which scores a batch: score_batch(completions, examples) -> list[float])
    reward: Optional[str] = None
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    fitness: str = "reward"  # per-candidate fitness from reward, accuracy, perplexity, tokens, kl
    kl_penalty: float = 0.0  # beta: fitness - beta * (mean per-token KL of the candidate's completions to the base)
    # Decoding during search (train prompts); greedy (temperature 0, one sample) is the ES paper's setting.
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    samples: int = 1  # completions per (candidate, prompt), each with its own seed
    aggregate: str = "mean"  # the samples of a cell -> its reward and correctness: mean | pass_at_k | majority
    k: int = 1  # aggregate=pass_at_k: k (<= samples)
    # Decoding on held-out and selection: pass@1 over eval_samples, and pass@eval_k (null: eval_samples).
    eval_temperature: float = 0.0
    eval_top_p: float = 1.0
    eval_samples: int = 1
    eval_k: Optional[int] = None
    # A completion whose reward failed (a user reward raised, hung or crashed; a judge did not
    # answer, or answered no score): null leaves its cell out of the fitness and the metrics
    # (counted); a number scores it that.
    reward_penalty: Optional[float] = None
    reward_timeout_s: float = 10.0  # deadline of one user reward call
    reward_workers: int = 2  # reward processes per engine worker (user rewards)
    reward_batch_size: int = 64  # a batched user reward: completions per call (each call with the deadline)
    reward_memory_mb: Optional[int] = 4096  # address-space limit of a reward process; null: none
    split: str = "shuffled"  # shuffled: seeded shuffle | ordered: train from the data's head, held-out from its tail


@dataclass(frozen=True)
class EngineConfig:
    """The keys every engine has; an engine with keys of its own extends it (registered with
    `register_engine(config=...)`, composed as engine/<name>_schema)."""

    name: str = "vllm"
    max_loras: int = 8
    max_num_seqs: int = 256
    adapter_dir: str = "/dev/shm"
    ignore_eos: bool = False  # generate exactly task.max_tokens tokens (benchmarks)
    units: str = "fixed"  # fixed: max_loras candidates per generate (bitwise across worker counts) | whole
    # A worker with a unit past this is taken for hung: killed, replaced, its units rerun elsewhere.
    # None: 600 s + task.max_tokens / (1 token/s) (evora.distributed.worker_spec.unit_deadline).
    unit_timeout_s: Optional[float] = None


@dataclass(frozen=True)
class HardwareConfig:
    name: str = "cpu"
    address: Optional[str] = None  # None: a local Ray; "auto" or ray://...: join a cluster
    num_workers: Optional[int] = 2  # None: one per GPU in the cluster
    gpus_per_worker: int = 0  # 1: engines on GPUs, 0: on CPUs
    tensor_parallel_size: int = 1  # GPUs per engine; > 1: a STRICT_PACK placement group per engine
    cpus_per_worker: float = 1.0
    cpu_threads_per_worker: int = 1
    driver_cpus: float = 0.0
    # torch's compute threads in the driver (sft's and grpo's training, updates on the host). Fixed
    # on CPU machines: two threads per process on an oversubscribed host stall small ops for whole
    # time slices. None: torch's default.
    driver_threads: Optional[int] = None
    driver_gpus: float = 0.0  # GPUs the driver actor reserves: gradient strategies (sft, grpo) train on it
    spread: bool = False  # place workers on as many nodes as possible (Ray's SPREAD)
    driver_restarts: int = 3  # a killed driver actor restarts from the last checkpoint this often
    worker_replacements: int = 8  # lost engine workers replaced per run (then the pool goes on smaller)
    gpu_memory_utilization: float = 0.05
    gpu_memory_gib: Optional[float] = None  # each GPU's memory (None: read from a GPU here, if any)
    host_memory_gib: Optional[float] = None  # each node's RAM, for GPU runs' host check (None: this host's)
    gpus_per_node: Optional[int] = None  # GPUs a node holds, for the host check (None: this host's, else 8)
    min_units: int = 2  # engine.units=fixed: a generation's prompts are cut too until it has this many units
    master_weights: str = "auto"  # full-weight strategies' fp32 copies: auto (on the GPU when they fit) | device | host
    # Where LoRA noise is drawn: auto (on the engines' GPU, for strategies that draw it only on the
    # workers) | device | host (the CPU's streams, as runs before it did).
    noise_device: str = "auto"
    kv_cache_gib: int = 1
    dashboard: bool = False
    trial_cpus: float = 1.0  # PBT: CPUs each training trial reserves
    trial_gpus: float = 0.0  # PBT: GPU fraction each training trial reserves


@dataclass(frozen=True)
class TrackingConfig:
    name: str = "local"
    out_dir: str = "runs"
    wandb_project: str = "evora"
    wandb_entity: Optional[str] = None
    wandb_group: Optional[str] = None  # None: the run's name (a multirun: the sweep folder's name)
    wandb_name: Optional[str] = None  # None: the run folder's name (a multirun: the job's overrides)
    wandb_mode: str = "online"  # online | offline | disabled
    checkpoint_keep_every: int = 0  # also keep checkpoints/gen_<n>.pt every n generations
    progress: bool = True
    worker_logs: bool = False  # echo engine workers' logs on the console


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    name: str = "run"
    generations: int = 30
    eval_every: int = 10  # held-out evaluation every k generations (0: start and end only)
    resume: Optional[str] = None
    objective: str = "best.reward"  # a multirun job's value (Optuna's): <base|final|best>.<metric> of its summary
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    strategy: Any = None  # typed by the chosen strategy's registered config (evora.strategies)
    engine: EngineConfig = field(default_factory=EngineConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
