"""Range and cross-field checks run before Ray starts.

Each failure is one line: `<key>=<value>: <rule>`, naming the allowed values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from evora.config.schema import VLLM_LORA_RANKS, ESConfig, GAConfig, PBTConfig, RunConfig
from evora.errors import ConfigError
from evora.models import ModelLocation, locate_model

DTYPES = ("auto", "float32", "bfloat16", "float16")
ENGINES = ("vllm", "hf")
TRACKERS = ("local", "wandb")
WANDB_MODES = ("online", "offline", "disabled")


def fail(key: str, value: Any, rule: str) -> ConfigError:
    shown = json.dumps(value) if isinstance(value, str) else value
    return ConfigError(f"{key}={shown}: {rule}")


def require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise fail(key, value, rule)


def choice(key: str, value: Any, allowed: tuple) -> None:
    require(value in allowed, key, value, "allowed: " + ", ".join(map(str, allowed)))


def validate(run: RunConfig) -> None:
    """Raise ConfigError for the first rule `run` breaks."""
    for check in (_check_run, _check_model, _check_lora, _check_task, _check_strategy,
                  _check_engine, _check_hardware, _check_tracking):
        check(run)


def _check_run(run: RunConfig) -> None:
    require(run.generations >= 1, "generations", run.generations, "must be an integer >= 1")
    require(run.eval_every >= 0, "eval_every", run.eval_every, "must be an integer >= 0 (0: start and end only)")
    if run.resume is not None:
        folder = Path(run.resume)
        require(folder.is_dir(), "resume", run.resume, "run folder not found")
        require((folder / "config.yaml").is_file(), "resume", run.resume, "not a run folder (no config.yaml)")


def _check_model(run: RunConfig) -> None:
    model = run.model
    choice("model.dtype", model.dtype, DTYPES)
    require(model.max_model_len >= 16, "model.max_model_len", model.max_model_len, "must be >= 16")
    location = locate_model(model.path, key="model.path")
    if model.tokenizer is not None:
        locate_model(model.tokenizer, key="model.tokenizer")
    _check_layers(run, location)
    if location.is_local:  # hub models are checked by the driver, once their config is fetched
        from evora.lora.layout import build_layout, linear_shapes_of_model

        lora = run.lora
        build_layout(linear_shapes_of_model(location.path, trust_remote_code=model.trust_remote_code),
                     rank=lora.rank, alpha=lora.alpha, target_modules=lora.target_modules, layers=lora.layers,
                     base_model=location.path)


def _check_layers(run: RunConfig, location: ModelLocation) -> None:
    if run.lora.layers is None or not location.is_local:
        return  # hub models are checked once their config is fetched, in the driver
    config = json.loads((Path(location.path) / "config.json").read_text())
    n_layers = config.get("num_hidden_layers") or config.get("n_layer")
    if n_layers is None:
        return
    for layer in run.lora.layers:
        require(0 <= layer < n_layers, "lora.layers", list(run.lora.layers),
                f"layer {layer} out of range; allowed: 0..{n_layers - 1} ({n_layers} layers)")


def _check_lora(run: RunConfig) -> None:
    lora = run.lora
    choice("lora.rank", lora.rank, VLLM_LORA_RANKS)
    require(lora.alpha > 0, "lora.alpha", lora.alpha, "must be > 0")
    require(len(lora.target_modules) > 0, "lora.target_modules", list(lora.target_modules),
            "must name at least one module, e.g. [q_proj, v_proj]")
    if lora.layers is not None:
        layers = list(lora.layers)
        require(len(layers) > 0, "lora.layers", layers, "must list at least one layer, or be null for all")
        require(len(set(layers)) == len(layers), "lora.layers", layers, "layers must be distinct")


def _check_task(run: RunConfig) -> None:
    from evora.tasks import task_names
    from evora.tasks.base import load_object
    from evora.tasks.fitness import parse_fitness
    from evora.tasks.prompts import FORMATS
    from evora.tasks.rewards.scorers import SCORERS

    task = run.task
    if ":" in task.name:
        load_object(task.name, "task.name")
    else:
        choice("task.name", task.name, task_names())
    require(task.train_size >= 1, "task.train_size", task.train_size, "must be >= 1")
    require(task.selection_size >= 0, "task.selection_size", task.selection_size, "must be >= 0")
    require(task.eval_size >= 1, "task.eval_size", task.eval_size, "must be >= 1")
    require(1 <= task.prompts_per_generation <= task.train_size, "task.prompts_per_generation",
            task.prompts_per_generation, f"must be in 1..task.train_size ({task.train_size})")
    require(1 <= task.max_tokens < run.model.max_model_len, "task.max_tokens", task.max_tokens,
            f"must be in 1..model.max_model_len - 1 ({run.model.max_model_len - 1})")
    choice("task.prompt_format", task.prompt_format, FORMATS)
    choice("task.scorer", task.scorer, tuple(SCORERS))
    parse_fitness(task.fitness)
    if task.reward is not None:
        require(callable(load_object(task.reward, "task.reward")), "task.reward", task.reward, "must be a function")
    if task.data_path is not None:
        require(Path(task.data_path).is_file(), "task.data_path", task.data_path, "file not found")
        from evora.tasks import build_task

        check_split_sizes(task, build_task(task, run.seed).splits())  # bad records stop here, before Ray
    elif task.name == "jsonl":
        raise fail("task.data_path", None, "task=jsonl needs a JSONL, JSON or parquet file")


def check_split_sizes(task: Any, splits: Any) -> None:
    """Enough examples for what the config asks (the data may hold fewer than its sizes)."""
    sizes = f"{len(splits.train)} train, {len(splits.selection)} selection, {len(splits.heldout)} held-out"
    require(len(splits.heldout) > 0, "task.eval_size", task.eval_size, f"the data gives no held-out examples ({sizes})")
    require(len(splits.train) >= task.prompts_per_generation, "task.prompts_per_generation",
            task.prompts_per_generation, f"the data gives only {sizes} examples")


def _check_es(es: ESConfig) -> None:
    require(es.population >= 2, "strategy.population", es.population, "must be an integer >= 2")
    if es.antithetic:
        require(es.population % 2 == 0, "strategy.population", es.population,
                "must be even when strategy.antithetic=true (allowed: 2, 4, 6, ...)")
    require(es.sigma > 0, "strategy.sigma", es.sigma, "must be > 0")
    require(es.lr > 0, "strategy.lr", es.lr, "must be > 0")
    require(es.weight_decay >= 0, "strategy.weight_decay", es.weight_decay, "must be >= 0")
    choice("strategy.shaping", es.shaping, ("zscore", "centered_rank", "none"))
    choice("strategy.optimizer", es.optimizer, ("sgd", "adam"))
    require(0 <= es.beta1 < 1, "strategy.beta1", es.beta1, "must be in [0, 1)")
    require(0 <= es.beta2 < 1, "strategy.beta2", es.beta2, "must be in [0, 1)")
    require(es.eps > 0, "strategy.eps", es.eps, "must be > 0")
    _check_init(es)


def _check_init(cfg: Any) -> None:
    choice("strategy.noise_scale", cfg.noise_scale, ("uniform", "per_layer"))
    choice("strategy.init", cfg.init, ("random", "path"))
    if cfg.init_a_std is not None:
        require(cfg.init_a_std >= 0, "strategy.init_a_std", cfg.init_a_std, "must be >= 0, or null")
    require(cfg.init_b_std >= 0, "strategy.init_b_std", cfg.init_b_std, "must be >= 0")
    if cfg.init == "path":
        path = cfg.init_path
        require(path is not None and (Path(path) / "adapter_config.json").is_file(),
                "strategy.init_path", path, "must be a PEFT adapter directory when strategy.init=path")


def _check_ga(ga: GAConfig) -> None:
    require(ga.population >= 2, "strategy.population", ga.population, "must be an integer >= 2")
    require(1 <= ga.keep_top < ga.population, "strategy.keep_top", ga.keep_top,
            f"must be in 1..strategy.population - 1 ({ga.population - 1}): elites leave room for offspring")
    require(ga.keep_top <= ga.parents <= ga.population, "strategy.parents", ga.parents,
            f"must be in strategy.keep_top..strategy.population ({ga.keep_top}..{ga.population})")
    choice("strategy.selection", ga.selection, ("truncation", "tournament"))
    require(1 <= ga.tournament_size <= ga.parents, "strategy.tournament_size", ga.tournament_size,
            f"must be in 1..strategy.parents ({ga.parents})")
    for key in ("crossover_rate", "mutation_rate"):
        value = getattr(ga, key)
        require(0 <= value <= 1, f"strategy.{key}", value, "must be in [0, 1]")
    if ga.crossover_rate > 0:
        require(ga.parents >= 2, "strategy.crossover_rate", ga.crossover_rate,
                "crossover needs two parents: set strategy.parents >= 2 or strategy.crossover_rate=0")
    choice("strategy.crossover", ga.crossover, ("module", "layer", "blend"))
    require(ga.mutation_scale > 0, "strategy.mutation_scale", ga.mutation_scale, "must be > 0")
    require(ga.adaptation_rate >= 0, "strategy.adaptation_rate", ga.adaptation_rate, "must be >= 0")
    choice("strategy.encoding", ga.encoding, ("tensors", "seeds"))
    if ga.encoding == "seeds":
        require(ga.crossover_rate == 0, "strategy.encoding", ga.encoding,
                "seeds (a chain of mutation seeds) needs strategy.crossover_rate=0")
    _check_init(ga)


def _nonempty(key: str, values: list) -> None:
    require(len(values) > 0, f"strategy.{key}", list(values), "must list at least one value")


def _check_pbt(pbt: PBTConfig) -> None:
    require(pbt.population >= 2, "strategy.population", pbt.population, "must be an integer >= 2")
    for key in ("steps_per_generation", "batch_size", "gradient_accumulation"):
        require(getattr(pbt, key) >= 1, f"strategy.{key}", getattr(pbt, key), "must be an integer >= 1")
    for key in ("ranks", "alpha_multipliers", "learning_rates", "lr_factors", "dropouts", "target_modules"):
        _nonempty(key, getattr(pbt, key))
    for rank in pbt.ranks:
        require(rank in VLLM_LORA_RANKS, "strategy.ranks", list(pbt.ranks),
                f"rank {rank} is not one vLLM serves; allowed: {', '.join(map(str, VLLM_LORA_RANKS))}")
    for rate in pbt.learning_rates:
        require(rate > 0, "strategy.learning_rates", list(pbt.learning_rates), "every learning rate must be > 0")
    require(0 < pbt.lr_min < pbt.lr_max, "strategy.lr_min", pbt.lr_min, f"must be in (0, strategy.lr_max={pbt.lr_max})")
    for factor in pbt.lr_factors:
        require(factor > 0, "strategy.lr_factors", list(pbt.lr_factors), "every factor must be > 0")
    for value in pbt.alpha_multipliers:
        require(value > 0, "strategy.alpha_multipliers", list(pbt.alpha_multipliers), "every multiplier must be > 0")
    for value in pbt.dropouts:
        require(0 <= value < 1, "strategy.dropouts", list(pbt.dropouts), "every dropout must be in [0, 1)")
    for modules in pbt.target_modules:
        require(len(modules) > 0, "strategy.target_modules", [list(m) for m in pbt.target_modules],
                "every option must name at least one module")
    for key in ("mutation_probability", "resample_probability"):
        require(0 <= getattr(pbt, key) <= 1, f"strategy.{key}", getattr(pbt, key), "must be in [0, 1]")
    require(0 < pbt.keep_top_fraction <= 0.5, "strategy.keep_top_fraction", pbt.keep_top_fraction,
            "must be in (0, 0.5]: the top fraction is cloned into the bottom fraction")
    require(pbt.weight_decay >= 0, "strategy.weight_decay", pbt.weight_decay, "must be >= 0")
    require(pbt.max_grad_norm > 0, "strategy.max_grad_norm", pbt.max_grad_norm, "must be > 0")
    require(0 <= pbt.warmup_ratio < 1, "strategy.warmup_ratio", pbt.warmup_ratio, "must be in [0, 1)")
    choice("strategy.eval_split", pbt.eval_split, ("selection", "heldout"))
    from evora.tasks.fitness import parse_fitness

    try:
        parse_fitness(pbt.fitness)
    except ConfigError as error:
        raise ConfigError(str(error).replace("task.fitness", "strategy.fitness")) from None


STRATEGY_CHECKS: dict[type, Callable[[Any], None]] = {ESConfig: _check_es, GAConfig: _check_ga,
                                                      PBTConfig: _check_pbt}


def _check_strategy(run: RunConfig) -> None:
    check = STRATEGY_CHECKS.get(type(run.strategy))
    require(check is not None, "strategy", type(run.strategy).__name__,
            "unknown strategy schema; allowed: " + ", ".join(c.__name__ for c in STRATEGY_CHECKS))
    check(run.strategy)
    if isinstance(run.strategy, PBTConfig):
        if run.strategy.eval_split == "selection":
            require(run.task.selection_size > 0, "strategy.eval_split", "selection",
                    "needs task.selection_size > 0, or strategy.eval_split=heldout")
        require(run.hardware.trial_cpus > 0 or run.hardware.trial_gpus > 0, "hardware.trial_cpus",
                run.hardware.trial_cpus, "a training trial needs CPUs or GPUs")


def _check_engine(run: RunConfig) -> None:
    engine = run.engine
    choice("engine.name", engine.name, ENGINES)
    require(engine.max_loras >= 1, "engine.max_loras", engine.max_loras, "must be >= 1")
    require(engine.max_num_seqs >= 1, "engine.max_num_seqs", engine.max_num_seqs, "must be >= 1")
    require(Path(engine.adapter_dir).is_dir(), "engine.adapter_dir", engine.adapter_dir, "directory not found")


def _check_hardware(run: RunConfig) -> None:
    hw = run.hardware
    if hw.num_workers is not None:
        require(hw.num_workers >= 1, "hardware.num_workers", hw.num_workers, "must be >= 1, or null (one per GPU)")
    require(hw.gpus_per_worker in (0, 1), "hardware.gpus_per_worker", hw.gpus_per_worker,
            "allowed: 0 (CPU engines), 1 (GPU engines); more GPUs per engine: hardware.tensor_parallel_size")
    require(hw.tensor_parallel_size >= 1, "hardware.tensor_parallel_size", hw.tensor_parallel_size, "must be >= 1")
    if hw.tensor_parallel_size > 1:
        require(hw.gpus_per_worker == 1 and run.engine.name == "vllm", "hardware.tensor_parallel_size",
                hw.tensor_parallel_size, "> 1 needs GPU engines (hardware.gpus_per_worker=1) and engine=vllm")
    require(hw.num_workers is not None or hw.gpus_per_worker > 0, "hardware.num_workers", None,
            "null (one per GPU) needs hardware.gpus_per_worker=1")
    require(hw.driver_restarts >= 0, "hardware.driver_restarts", hw.driver_restarts, "must be >= 0")
    require(hw.cpus_per_worker >= 0, "hardware.cpus_per_worker", hw.cpus_per_worker, "must be >= 0")
    require(hw.cpu_threads_per_worker >= 1, "hardware.cpu_threads_per_worker", hw.cpu_threads_per_worker,
            "must be >= 1")
    require(hw.driver_cpus >= 0, "hardware.driver_cpus", hw.driver_cpus, "must be >= 0")
    require(0 < hw.gpu_memory_utilization <= 1, "hardware.gpu_memory_utilization", hw.gpu_memory_utilization,
            "must be in (0, 1]")
    require(hw.kv_cache_gib >= 0, "hardware.kv_cache_gib", hw.kv_cache_gib, "must be >= 0")


def _check_tracking(run: RunConfig) -> None:
    tracking = run.tracking
    choice("tracking.name", tracking.name, TRACKERS)
    choice("tracking.wandb_mode", tracking.wandb_mode, WANDB_MODES)
    require(tracking.checkpoint_keep_every >= 0, "tracking.checkpoint_keep_every",
            tracking.checkpoint_keep_every, "must be >= 0")
