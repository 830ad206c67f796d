"""The run plan: everything a run resolves from its config, once, on the node that starts it.

`validate` (pure rules on the config) runs first; `build_plan` then does every look-up the
config implies, each bad one a one-line ConfigError before Ray starts: the model's location,
modules and parameter count, the adapter layout the engine will run (and whether it fits the
device), the task's splits, the run a budget matches, and the folders the run writes in.
The loop, `evora eval`, gradient training and PBT take the plan; none rebuilds a layout or a
task. A plan is plain data: it travels to the driver actor as its constructor argument.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evora.config.checks import fail, require
from evora.config.schema import RunConfig, TaskConfig
from evora.engines.registry import engine_names, get_engine
from evora.lora.layout import AdapterLayout, build_layout
from evora.lora.modules import ModelModules, model_modules
from evora.models import check_hub_model, hub_access, locate_model
from evora.models.parameters import count_parameters
from evora.strategies import get_strategy
from evora.strategies.budget import Budget, budget_of, matched_run
from evora.strategies.registry import StrategyEntry
from evora.tasks import build_task, get_task
from evora.tasks.base import AnswerTask, Splits, Task
from evora.tasks.fitness import FitnessExpression, task_fitness
from evora.tasks.registry import reads_hub_data

MIN_FREE_MIB = 64  # room for a run folder's config, metrics and first checkpoints


@dataclass(frozen=True)
class RunPlan:
    run: RunConfig
    model_path: str  # a local folder, or a hub id
    modules: ModelModules  # the model's adaptable modules and config, read on the meta device
    parameters: int  # every weight of the checkpoint (P in the compute accounting)
    layout: AdapterLayout  # the candidates' layout (a full-weight strategy's: its perturbation rank)
    task: Task
    splits: Splits
    matched_usage: dict[str, float] | None  # the search usage of the run strategy.match names
    master_device: str = "cpu"  # a full-weight strategy's fp32 master copies: cuda (beside the engine) | cpu
    noise_device: str = "cpu"  # where the workers draw LoRA noise: cuda (the engine's GPU) | cpu (noise_device())

    @property
    def entry(self) -> StrategyEntry:
        return get_strategy(self.run.strategy.name)

    @property
    def fitness(self) -> FitnessExpression:
        return task_fitness(self.run.task.fitness, self.run.task.kl_penalty)

    @property
    def budget(self) -> Budget | None:
        return budget_of(self.run.strategy, self.matched_usage)

    def with_run(self, run: RunConfig) -> RunPlan:
        """The same resolution for a config that differs only where nothing resolved depends on
        it (tracking, generations): a sweep job's tracking group, a resumed run's new length."""
        return dataclasses.replace(self, run=run)


def fetches_from_hub(run: RunConfig) -> bool:
    """Whether resolving the run downloads from the hub (a hub model's config, a hub dataset):
    the preflight leaves those to the job's start, on the node that starts it."""
    return not locate_model(run.model.path).is_local or reads_hub_data(run.task)


def build_plan(run: RunConfig) -> RunPlan:
    """Resolve a validated `run`; the first problem is a one-line ConfigError."""
    check_environment(run)
    location = locate_model(run.model.path)
    if not location.is_local:
        check_hub_model(location.path, run.model.revision)
    if run.model.tokenizer is not None and not locate_model(run.model.tokenizer, key="model.tokenizer").is_local:
        check_hub_model(run.model.tokenizer, run.model.revision, key="model.tokenizer")
    check_served_reward(run)
    with hub_access(run.model.path):  # a hub model's config is fetched here
        modules = model_modules(
            location.path, revision=run.model.revision, trust_remote_code=run.model.trust_remote_code
        )
    check_layers(run, modules)
    layout = model_layout(run, modules, location.path)
    from evora.plan.fit import check_fits, master_device, plan_memory

    memory = plan_memory(run, modules, layout)
    check_fits(run, memory)
    task = build_task(run.task, run.seed)
    check_answers(run, task)
    return RunPlan(
        run,
        location.path,
        modules,
        count_parameters(location.path, run.model.revision, run.model.trust_remote_code),
        candidate_layout(run, layout),
        task,
        task_splits(run, task),
        matched_usage(run.strategy),
        master_device(run, memory),
        noise_device(run),
    )


def noise_device(run: RunConfig) -> str:
    """Where the engine workers draw LoRA noise: `cuda`, the engine's GPU, for a strategy that
    draws it only there (registered with device_noise=True) on GPU workers, unless
    hardware.noise_device=host; else `cpu`, the CPU's streams (validate.py refuses `device`
    where it cannot be). A tensor-parallel engine's worker holds no GPU itself (its shards do,
    distributed/placement.py), and writes its candidates to folders: its noise stays on the CPU."""
    hardware = run.hardware
    if hardware.noise_device == "host" or hardware.gpus_per_worker == 0 or hardware.tensor_parallel_size > 1:
        return "cpu"
    return "cuda" if get_strategy(run.strategy.name).device_noise else "cpu"


def check_served_reward(run: RunConfig) -> None:
    """task.reward=reward_model: its model is a folder or a reachable hub id (the workers load it);
    task.reward=judge: the judge answers and serves its model."""
    path = run.task.reward_model.path
    if run.task.reward == "reward_model" and path is not None:
        if not locate_model(path, key="task.reward_model.path").is_local:
            check_hub_model(path, run.task.reward_model.revision, key="task.reward_model.path")
    if run.task.reward == "judge":
        from evora.tasks.judge import check_judge

        check_judge(run.task.judge)


def check_answers(run: RunConfig, task: Task) -> None:
    """task.aggregate=majority votes over the canonical answers of a task that has them."""
    if run.task.aggregate == "majority" and not isinstance(task, AnswerTask):
        raise fail(
            "task.aggregate",
            "majority",
            f"needs a task whose completions have a canonical answer (task={run.task.name} has none"
            f"{' with a task.reward' if run.task.reward else ''}); use mean or pass_at_k",
        )


def model_layout(run: RunConfig, modules: ModelModules, model_path: str) -> AdapterLayout:
    """The run's layout on the model (`auto` resolved); ConfigError when its engine cannot run LoRA on it."""
    from evora.engines.support import check_engine

    check_engine(run.engine.name, modules, "cuda" if run.hardware.gpus_per_worker > 0 else "cpu")
    lora = run.lora
    layout = build_layout(
        modules.adaptable,
        rank=lora.rank,
        alpha=lora.alpha,
        target_modules=lora.target_modules,
        layers=lora.layers,
        base_model=model_path,
    )
    if layout.has_experts and get_strategy(run.strategy.name).kind.moves_weights:
        raise fail(
            "lora.target_modules",
            list(layout.target_modules),
            f"strategy={run.strategy.name} moves base weights, and expert weights are not among those it moves "
            "yet; target the attention projections, e.g. [q_proj, k_proj, v_proj, o_proj]",
        )
    return layout


def candidate_layout(run: RunConfig, layout: AdapterLayout) -> AdapterLayout:
    """What candidates are: the run's LoRA, or for a full-weight strategy a LoRA of its own
    perturbation rank at scale 1 (alpha = rank) on the same modules."""
    entry = get_strategy(run.strategy.name)
    return entry.kind.candidates(lambda: entry.build(run.strategy, run.seed), layout)


def check_layers(run: RunConfig, modules: ModelModules) -> None:
    n_layers = modules.facts.layers
    if run.lora.layers is None or n_layers is None:
        return
    for layer in run.lora.layers:
        require(
            0 <= layer < n_layers,
            "lora.layers",
            list(run.lora.layers),
            f"layer {layer} out of range; allowed: 0..{n_layers - 1} ({n_layers} layers)",
        )


def task_splits(run: RunConfig, task: Task) -> Splits:
    """The task's splits (bad records and a data file too small stop here, before Ray)."""
    splits = task.splits()
    check_split_sizes(run.task, splits)
    return splits


def check_split_sizes(task: Any, splits: Splits) -> None:
    """Enough examples for what the config asks (the data may hold fewer than its sizes)."""
    sizes = f"{len(splits.train)} train, {len(splits.selection)} selection, {len(splits.heldout)} held-out"
    require(len(splits.heldout) > 0, "task.eval_size", task.eval_size, f"the data gives no held-out examples ({sizes})")
    require(
        len(splits.train) >= task.prompts_per_generation,
        "task.prompts_per_generation",
        task.prompts_per_generation,
        f"the data gives only {sizes} examples",
    )


def matched_usage(strategy_cfg: Any) -> dict[str, float] | None:
    """The search usage of the run a strategy matches (strategy.match), from its summary."""
    from evora.tracking.compute import usage_of_summary
    from evora.tracking.summary import read_summary

    folder = matched_run(strategy_cfg)
    if folder is None:
        return None
    require(Path(folder).is_dir(), "strategy.match", folder, "no such run folder")
    summary = read_summary(folder)
    require(summary is not None, "strategy.match", folder, "the run has no eval/summary.json (did it finish?)")
    assert summary is not None
    return usage_of_summary(summary["compute"])


# --- what the config names outside itself: files, folders, packages ------------------------------


def check_resume(folder: str) -> None:
    require(Path(folder).is_dir(), "resume", folder, "run folder not found")
    require((Path(folder) / "config.yaml").is_file(), "resume", folder, "not a run folder (no config.yaml)")


def check_environment(run: RunConfig) -> None:
    """What the config names outside itself; a resumed run's folder is checked before its
    config is read (`plan.jobs.job_run`)."""
    check_data(run.task)
    engine = run.engine
    try:  # made where missing, as each worker makes it on its node (a job's own scratch: launch/slurm.sbatch)
        Path(engine.adapter_dir).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise fail("engine.adapter_dir", engine.adapter_dir, f"cannot make it ({error.strerror or error})") from None
    entry = get_engine(engine.name)
    if entry.package is not None:
        others = " | ".join(name for name in engine_names() if name != engine.name)
        rule = f"{entry.package} is not installed here; {entry.install}, or use engine={others}"
        require(module_available(entry.package), "engine", engine.name, rule)
    check_writable("resume" if run.resume else "tracking.out_dir", run.resume or run.tracking.out_dir)


def check_data(task: TaskConfig) -> None:
    """task.data_path names a file; when not, the line says where the task's data comes from
    (its registry entry's `data_source`). The preflight asks this before `validate`: a missing file
    is the first thing to fix, whatever rules the model's limits break."""
    path = task.data_path
    if path is None or Path(path).is_file():
        return
    looked_in = "" if Path(path).is_absolute() else f" (looked for in {Path.cwd()})"
    source = get_task(task.name).data_source
    raise fail("task.data_path", path, f"file not found{looked_in}" + (f"; {source}" if source else ""))


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or blocked installation counts as absent
        return False


def check_writable(key: str, folder: str) -> None:
    """A folder (or the nearest existing parent it would be made in) takes files, and has room."""
    existing = Path(folder).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    require(existing.is_dir(), key, folder, f"{existing} is not a directory")
    try:
        Path(tempfile.mkdtemp(prefix=".evora-probe-", dir=existing)).rmdir()
    except OSError as error:
        raise fail(key, folder, f"cannot write in {existing} ({error.strerror or error})") from None
    free = shutil.disk_usage(existing).free / 2**20
    require(free >= MIN_FREE_MIB, key, folder, f"only {free:.0f} MiB free in {existing}")
