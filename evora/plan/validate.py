"""Range and cross-field checks of a composed config, run once before Ray starts.

Pure: they read the config and nothing else (no file, folder, model or package); what the
config names outside itself is looked up once, by `run_plan.build_plan`. Each failure is one
line: `<key>=<value>: <rule>`, naming the allowed values.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from evora.config.checks import choice, fail, require
from evora.config.schema import VLLM_LORA_RANKS, RunConfig, TaskConfig
from evora.engines.registry import engine_names, get_engine
from evora.lora.layout import AUTO
from evora.strategies import get_strategy

DTYPES = ("auto", "float32", "bfloat16", "float16")
UNITS = ("fixed", "whole")
TRACKERS = ("local", "wandb")
WANDB_MODES = ("online", "offline", "disabled")


def validate(run: RunConfig) -> None:
    """Raise ConfigError for the first rule `run` breaks."""
    for check in (
        _check_finite,
        _check_run,
        _check_model,
        _check_lora,
        _check_task,
        _check_decoding,
        _check_strategy,
        _check_engine,
        _check_hardware,
        _check_noise_device,
        _check_tracking,
    ):
        check(run)


def _check_finite(run: RunConfig) -> None:
    """Every float in the config, the strategy's too: an inf sigma or lr makes every candidate
    NaN and a run that "succeeds" with the base model."""
    for key, value in _floats(run, ""):
        require(math.isfinite(value), key, value, "must be a finite number")


def _floats(node: Any, key: str) -> Any:
    if dataclasses.is_dataclass(node):
        for field in dataclasses.fields(node):
            yield from _floats(getattr(node, field.name), f"{key}.{field.name}" if key else field.name)
    elif isinstance(node, dict):
        for name, value in node.items():
            yield from _floats(value, f"{key}.{name}")
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _floats(value, key)
    elif isinstance(node, float):
        yield key, node


def _check_run(run: RunConfig) -> None:
    from evora.tracking.summary import OBJECTIVE_SECTIONS

    require(run.generations >= 1, "generations", run.generations, "must be an integer >= 1")
    section, _, metric = run.objective.partition(".")
    rule = f"must be <{'|'.join(OBJECTIVE_SECTIONS)}>.<metric>, e.g. best.reward or final.accuracy"
    require(section in OBJECTIVE_SECTIONS and metric.isidentifier(), "objective", run.objective, rule)
    require(run.eval_every >= 0, "eval_every", run.eval_every, "must be an integer >= 0 (0: start and end only)")


def _check_model(run: RunConfig) -> None:
    model = run.model
    choice("model.dtype", model.dtype, DTYPES)
    require(model.max_model_len >= 16, "model.max_model_len", model.max_model_len, "must be >= 16")


def _check_lora(run: RunConfig) -> None:
    lora = run.lora
    choice("lora.rank", lora.rank, VLLM_LORA_RANKS)
    require(lora.alpha > 0, "lora.alpha", lora.alpha, "must be > 0")
    targets = lora.target_modules
    named = isinstance(targets, (list, tuple)) and len(targets) > 0 and all(isinstance(t, str) for t in targets)
    require(
        targets == AUTO or named,
        "lora.target_modules",
        targets if isinstance(targets, str) else list(targets),
        f"must be {AUTO} or name at least one module, e.g. [q_proj, v_proj]",
    )
    if lora.layers is not None:
        layers = list(lora.layers)
        require(len(layers) > 0, "lora.layers", layers, "must list at least one layer, or be null for all")
        require(len(set(layers)) == len(layers), "lora.layers", layers, "layers must be distinct")


def _check_task(run: RunConfig) -> None:
    from evora.tasks import get_task
    from evora.tasks.base import SPLITS
    from evora.tasks.fitness import parse_fitness
    from evora.tasks.prompts import FORMATS

    task = run.task
    get_task(task.name).check(task)  # its config's type, and the task's own rules
    require(task.train_size >= 1, "task.train_size", task.train_size, "must be >= 1")
    require(task.selection_size >= 0, "task.selection_size", task.selection_size, "must be >= 0")
    require(task.eval_size >= 1, "task.eval_size", task.eval_size, "must be >= 1")
    require(
        1 <= task.prompts_per_generation <= task.train_size,
        "task.prompts_per_generation",
        task.prompts_per_generation,
        f"must be in 1..task.train_size ({task.train_size})",
    )
    require(
        1 <= task.max_tokens < run.model.max_model_len,
        "task.max_tokens",
        task.max_tokens,
        f"must be in 1..model.max_model_len - 1 ({run.model.max_model_len - 1})",
    )
    choice("task.prompt_format", task.prompt_format, FORMATS)
    choice("task.split", task.split, SPLITS)
    require(task.reward_timeout_s > 0, "task.reward_timeout_s", task.reward_timeout_s, "must be > 0 (seconds)")
    require(task.reward_workers >= 1, "task.reward_workers", task.reward_workers, "must be >= 1")
    if task.reward_memory_mb is not None:
        require(task.reward_memory_mb >= 64, "task.reward_memory_mb", task.reward_memory_mb, "must be >= 64, or null")
    parse_fitness(task.fitness)
    _check_reward(task)


def _check_reward(task: TaskConfig) -> None:
    from evora.tasks.base import SERVED_REWARDS, load_object

    require(task.reward_batch_size >= 1, "task.reward_batch_size", task.reward_batch_size, "must be >= 1")
    if task.reward is None:
        return
    if task.reward not in SERVED_REWARDS:
        rule = f"must be a function, or one of {', '.join(SERVED_REWARDS)}"
        require(callable(load_object(task.reward, "task.reward")), "task.reward", task.reward, rule)
        return
    CHECKS[task.reward](task)


def _check_judge(task: TaskConfig) -> None:
    import re

    from evora.tasks.judge import JUDGE_APIS

    judge = task.judge
    require(judge.url is not None, "task.judge.url", None, "task.reward=judge needs the server's URL")
    require(judge.model is not None, "task.judge.model", None, "task.reward=judge needs the served model's name")
    choice("task.judge.api", judge.api, JUDGE_APIS)
    require("{completion}" in judge.template, "task.judge.template", "...", "must hold {completion}")
    try:
        re.compile(judge.score_pattern)
    except re.error as error:
        raise fail("task.judge.score_pattern", judge.score_pattern, f"not a regular expression ({error})") from None
    low_high = len(judge.score_range) == 2 and judge.score_range[0] < judge.score_range[1]
    require(low_high, "task.judge.score_range", judge.score_range, "must be [low, high] with low < high")
    require(judge.max_tokens >= 1, "task.judge.max_tokens", judge.max_tokens, "must be >= 1")
    require(judge.temperature >= 0, "task.judge.temperature", judge.temperature, "must be >= 0")
    require(judge.concurrency >= 1, "task.judge.concurrency", judge.concurrency, "must be >= 1")
    require(judge.retries >= 0, "task.judge.retries", judge.retries, "must be >= 0")
    require(judge.timeout_s > 0, "task.judge.timeout_s", judge.timeout_s, "must be > 0 (seconds)")
    require(judge.call_timeout_s > 0, "task.judge.call_timeout_s", judge.call_timeout_s, "must be > 0 (seconds)")
    rate = judge.max_error_rate
    require(0 <= rate <= 1, "task.judge.max_error_rate", rate, "must be in [0, 1]")


def _check_reward_model(task: TaskConfig) -> None:
    model = task.reward_model
    require(model.path is not None, "task.reward_model.path", None, "task.reward=reward_model needs it")
    require(model.label >= 0, "task.reward_model.label", model.label, "must be >= 0")
    require(model.batch_size >= 1, "task.reward_model.batch_size", model.batch_size, "must be >= 1")
    require(model.max_length >= 2, "task.reward_model.max_length", model.max_length, "must be >= 2")
    choice("task.reward_model.dtype", model.dtype, DTYPES)


CHECKS = {"judge": _check_judge, "reward_model": _check_reward_model}  # task.reward's served rewards


def _check_decoding(run: RunConfig) -> None:
    """Sampling, the aggregate of a cell's samples, and the KL penalty."""
    from evora.tasks.aggregate import AGGREGATES
    from evora.tasks.fitness import task_fitness

    task = run.task
    decodings = (
        ("", task.temperature, task.top_p, task.samples),
        ("eval_", task.eval_temperature, task.eval_top_p, task.eval_samples),
    )
    for prefix, temperature, top_p, samples in decodings:
        require(temperature >= 0, f"task.{prefix}temperature", temperature, "must be >= 0 (0: greedy)")
        require(0 < top_p <= 1, f"task.{prefix}top_p", top_p, "must be in (0, 1]")
        require(samples >= 1, f"task.{prefix}samples", samples, "must be an integer >= 1")
        require(
            samples == 1 or temperature > 0,
            f"task.{prefix}samples",
            samples,
            f"> 1 needs task.{prefix}temperature > 0: greedy samples are all the same completion",
        )
    choice("task.aggregate", task.aggregate, AGGREGATES)
    require(1 <= task.k <= task.samples, "task.k", task.k, f"must be in 1..task.samples ({task.samples})")
    if task.eval_k is not None:
        require(
            1 <= task.eval_k <= task.eval_samples,
            "task.eval_k",
            task.eval_k,
            f"must be in 1..task.eval_samples ({task.eval_samples}), or null",
        )
    require(task.kl_penalty >= 0, "task.kl_penalty", task.kl_penalty, "must be >= 0")
    if task_fitness(task.fitness, task.kl_penalty).needs_kl:
        require(
            get_strategy(run.strategy.name).runner is None,
            "task.kl_penalty" if task.kl_penalty else "task.fitness",
            task.kl_penalty or task.fitness,
            f"strategy={run.strategy.name} runs its own job and scores its own fitness (strategy.fitness); "
            "a KL term applies to the strategies the shared loop runs",
        )


def _check_strategy(run: RunConfig) -> None:
    entry = get_strategy(run.strategy.name)
    require(
        isinstance(run.strategy, entry.config),
        "strategy",
        run.strategy.name,
        f"its config is a {type(run.strategy).__name__}, the strategy needs a {entry.config.__name__}",
    )
    if entry.validate is not None:
        entry.validate(run.strategy, run)


def _check_engine(run: RunConfig) -> None:
    engine = run.engine
    choice("engine.name", engine.name, engine_names())
    entry, kind = get_engine(engine.name), get_strategy(run.strategy.name).kind
    require(
        isinstance(engine, entry.config),
        "engine",
        engine.name,
        f"its config is a {type(engine).__name__}, the engine needs a {entry.config.__name__}",
    )
    if entry.kinds is not None:
        require(
            kind.name in entry.kinds,
            "engine.name",
            engine.name,
            f"runs strategies of kind {', '.join(sorted(entry.kinds))}; "
            f"strategy={run.strategy.name} is of kind {kind.name}",
        )
    require(engine.max_loras >= 1, "engine.max_loras", engine.max_loras, "must be >= 1")
    choice("engine.units", engine.units, UNITS)
    require(engine.max_num_seqs >= 1, "engine.max_num_seqs", engine.max_num_seqs, "must be >= 1")
    timeout = engine.unit_timeout_s
    require(timeout is None or timeout > 0, "engine.unit_timeout_s", timeout, "must be > 0 (seconds) or null")
    judge_wait = run.task.judge.call_timeout_s
    if run.task.reward == "judge" and timeout is not None and judge_wait >= timeout:
        raise fail(
            "task.judge.call_timeout_s",
            judge_wait,
            f"must be below engine.unit_timeout_s={timeout:g}: a unit's generation and its wait on the judge "
            "share that deadline, and a worker past it is killed as hung (lower the one or raise the other)",
        )


def _check_hardware(run: RunConfig) -> None:
    hw = run.hardware
    if hw.num_workers is not None:
        require(hw.num_workers >= 1, "hardware.num_workers", hw.num_workers, "must be >= 1, or null (one per GPU)")
    require(
        hw.gpus_per_worker in (0, 1),
        "hardware.gpus_per_worker",
        hw.gpus_per_worker,
        "allowed: 0 (CPU engines), 1 (GPU engines); more GPUs per engine: hardware.tensor_parallel_size",
    )
    require(hw.tensor_parallel_size >= 1, "hardware.tensor_parallel_size", hw.tensor_parallel_size, "must be >= 1")
    if hw.host_memory_gib is not None:
        require(hw.host_memory_gib > 0, "hardware.host_memory_gib", hw.host_memory_gib, "must be > 0, or null")
    if hw.gpus_per_node is not None:
        require(hw.gpus_per_node >= 1, "hardware.gpus_per_node", hw.gpus_per_node, "must be >= 1, or null")
    if hw.tensor_parallel_size > 1:
        sharding = [name for name in engine_names() if get_engine(name).tensor_parallel]
        require(
            hw.gpus_per_worker == 1 and run.engine.name in sharding,
            "hardware.tensor_parallel_size",
            hw.tensor_parallel_size,
            f"> 1 needs GPU engines (hardware.gpus_per_worker=1) that shard a model: engine={' | '.join(sharding)}",
        )
    require(
        hw.num_workers is not None or hw.gpus_per_worker > 0,
        "hardware.num_workers",
        None,
        "null (one per GPU) needs hardware.gpus_per_worker=1",
    )
    require(hw.driver_restarts >= 0, "hardware.driver_restarts", hw.driver_restarts, "must be >= 0")
    require(hw.worker_replacements >= 0, "hardware.worker_replacements", hw.worker_replacements, "must be >= 0")
    require(hw.cpus_per_worker >= 0, "hardware.cpus_per_worker", hw.cpus_per_worker, "must be >= 0")
    require(
        hw.cpu_threads_per_worker >= 1, "hardware.cpu_threads_per_worker", hw.cpu_threads_per_worker, "must be >= 1"
    )
    require(hw.driver_cpus >= 0, "hardware.driver_cpus", hw.driver_cpus, "must be >= 0")
    threads = hw.driver_threads
    require(threads is None or threads >= 1, "hardware.driver_threads", threads, "must be >= 1 or null")
    require(hw.driver_gpus >= 0, "hardware.driver_gpus", hw.driver_gpus, "must be >= 0")
    require(
        0 < hw.gpu_memory_utilization <= 1,
        "hardware.gpu_memory_utilization",
        hw.gpu_memory_utilization,
        "must be in (0, 1]",
    )
    require(hw.kv_cache_gib >= 0, "hardware.kv_cache_gib", hw.kv_cache_gib, "must be >= 0")
    choice("hardware.master_weights", hw.master_weights, MASTER_PLACES)
    require(hw.min_units >= 1, "hardware.min_units", hw.min_units, "must be an integer >= 1")


def _check_noise_device(run: RunConfig) -> None:
    hw = run.hardware
    choice("hardware.noise_device", hw.noise_device, MASTER_PLACES)
    if hw.noise_device == "device":
        require(hw.gpus_per_worker > 0, "hardware.noise_device", "device", "needs GPU workers (hardware=gpu)")
        require(
            hw.tensor_parallel_size == 1,
            "hardware.noise_device",
            "device",
            "needs workers that hold their GPU (hardware.tensor_parallel_size=1; a tensor-parallel "
            "engine's shards hold it)",
        )
        require(
            get_strategy(run.strategy.name).device_noise,
            "hardware.noise_device",
            "device",
            f"strategy={run.strategy.name} redraws its noise on the driver, so it draws on the CPU's streams; "
            "use auto or host",
        )


MASTER_PLACES = ("auto", "device", "host")


def _check_tracking(run: RunConfig) -> None:
    tracking = run.tracking
    choice("tracking.name", tracking.name, TRACKERS)
    choice("tracking.wandb_mode", tracking.wandb_mode, WANDB_MODES)
    require(
        tracking.checkpoint_keep_every >= 0,
        "tracking.checkpoint_keep_every",
        tracking.checkpoint_keep_every,
        "must be >= 0",
    )
