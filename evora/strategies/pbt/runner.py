"""strategy=pbt's runner: the LoRALab-style hyperparameter GA, distributed as Ray Tune
population-based training (synchronous: every generation, all members train, then the bottom fraction
clones the top fraction and explores).

A trial trains its LoRA by gradient descent (`sft.py`) for `steps_per_generation` steps,
then is scored by the run's engine workers (one shared EvaluationService actor, so
trials do not each load an inference engine) on the selection split: accuracy,
perplexity of the reference answers and the composite fitness. Exploit copies the
parent's checkpoint; explore follows LoRALab's rules (`space.py`); a changed rank
resizes the copied adapter by truncated SVD or zero-padding (`lora/resize.py`).
"""

from __future__ import annotations

import json
import logging
import random
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ray
import torch
from ray import tune
from ray.tune import Callback
from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining
from ray.tune.search.basic_variant import BasicVariantGenerator

from evora.config.schema import RunConfig
from evora.distributed.evaluate import EvaluationService
from evora.distributed.finish import Outcome, final_event, report_against_base, write_run_summary
from evora.distributed.ray_session import init_ray
from evora.distributed.worker import engine_spec, load_tokenizer, worker_spec
from evora.errors import ConfigError
from evora.lora.layout import Adaptable, AdapterLayout, build_layout
from evora.lora.modules import adaptable_modules
from evora.lora.noise import noise_key
from evora.lora.peft_io import load_adapter_tensors, save_adapter
from evora.lora.resize import resize_adapter
from evora.models import locate_model
from evora.models.parameters import count_parameters
from evora.strategies.pbt.space import KEYS, explore, member_id, module_sets, modules_of, sample
from evora.tasks import build_task
from evora.tasks.fitness import parse_fitness
from evora.tasks.prompts import PromptRenderer
from evora.tracking.compute import ComputeLedger, Spend
from evora.tracking.metrics import read_trials
from evora.tracking.run_dir import LINEAGE_FILE, METRICS_FILE, TRIALS_FILE, run_tag, write_config
from evora.training.lora_sft import LoraSFT, TrainSettings

EXPERIMENT = "pbt"


@dataclass(frozen=True)
class TrialContext:
    run: RunConfig
    model_path: str
    service: str  # name of the EvaluationService actor
    shapes: dict[str, Adaptable]  # adaptable module name -> shape and kind


def layout_for(hp: dict[str, Any], context: TrialContext) -> AdapterLayout:
    return build_layout(
        context.shapes,
        rank=hp["rank"],
        alpha=hp["rank"] * hp["alpha_multiplier"],
        target_modules=modules_of(hp["target_modules"]),
        layers=context.run.lora.layers,
        base_model=context.model_path,
    )


@dataclass
class Start:
    """What a trial starts from: nothing, its own checkpoint, or another trial's (exploit)."""

    adapter: dict | None = None
    optimizer: dict | None = None
    step: int = 0
    generation: int = 0
    parent: str = ""
    member: str = ""  # kept on a resume; a new member (fresh or cloned) is named from its hyperparameters


def starting_point(folder: Path | None, hp: dict[str, Any], trial_id: str, context: TrialContext) -> Start:
    if folder is None:
        return Start()
    meta = torch.load(folder / "trainer.pt", map_location="cpu", weights_only=True)
    adapter = load_adapter_tensors(folder / "adapter")
    old, new = layout_for(meta["hp"], context), layout_for(hp, context)
    if (old.rank, old.scale, old.target_modules) != (new.rank, new.scale, new.target_modules):
        adapter = resize_adapter(adapter, old, new, noise_key(context.run.seed, "pbt-resize", trial_id, meta["step"]))
    if meta["trial"] == trial_id:  # its own checkpoint: a resume, the same member
        return Start(adapter, meta["optimizer"], meta["step"], meta["generation"], meta["parent"], meta["member"])
    return Start(adapter, meta["optimizer"], meta["step"], meta["generation"], parent=meta["member"])


def training_pairs(run: RunConfig, model_path: str) -> tuple[list[tuple[list[int], list[int]]], int]:
    task = build_task(run.task, run.seed)
    tokenizer = load_tokenizer(engine_spec(run, model_path))
    renderer = PromptRenderer(tokenizer, run.task.prompt_format, task.plain_template, run.task.system_prompt)
    pairs = [(renderer.ids(e), renderer.target_ids(e)) for e in task.splits().train]
    return pairs, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _trainer(context: TrialContext, hp: dict[str, Any], start: Start, trial_id: str) -> LoraSFT:
    """The member's trainer, from where it starts (fresh, its own checkpoint, or a clone)."""
    run, space = context.run, context.run.strategy
    pairs, pad_id = training_pairs(run, context.model_path)
    settings = TrainSettings(
        space.batch_size,
        space.gradient_accumulation,
        space.weight_decay,
        space.max_grad_norm,
        space.warmup_ratio,
        run.generations * space.steps_per_generation,
        tuple(run.lora.layers) if run.lora.layers else None,
        noise_key(run.seed, "pbt-trial", trial_id),
    )
    modules = layout_for(hp, context).target_modules  # an `auto` option resolved for PEFT
    return LoraSFT(
        context.model_path,
        {**hp, "target_modules": ",".join(modules)},
        settings,
        pairs,
        pad_id,
        start.adapter,
        start.optimizer,
        start.step,
        device="cuda" if run.hardware.trial_gpus > 0 else "cpu",
    )


def pbt_trial(config: dict[str, Any], context: TrialContext) -> None:
    """One member: train, score, report with a checkpoint; repeat until the last generation."""
    run, space = context.run, context.run.strategy
    hp = {key: config[key] for key in KEYS}
    trial_id = tune.get_context().get_trial_id()
    checkpoint = tune.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else tempfile.TemporaryDirectory() as folder:
        start = starting_point(Path(folder) if checkpoint else None, hp, trial_id, context)
    trainer = _trainer(context, hp, start, trial_id)
    service, layout, fitness = ray.get_actor(context.service), layout_for(hp, context), parse_fitness(space.fitness)
    member, generation = start.member or member_id(hp, start.generation), start.generation
    while generation < run.generations:
        trained_before = trainer.tokens_trained
        loss = trainer.train(space.steps_per_generation)
        generation += 1
        adapter = trainer.adapter()
        metrics = ray.get(service.metrics.remote(adapter, layout, space.eval_split))
        with tempfile.TemporaryDirectory() as folder:
            save_adapter(Path(folder) / "adapter", adapter, layout)
            torch.save(
                {
                    "trial": trial_id,
                    "member": member,
                    "parent": start.parent,
                    "generation": generation,
                    "hp": hp,
                    **trainer.state(),
                },
                Path(folder) / "trainer.pt",
            )
            tune.report(
                {
                    "fitness": fitness(metrics),
                    **metrics,
                    "loss": loss,
                    "generation": generation,
                    "member": member,
                    "parent": start.parent,
                    "step": trainer.step,
                    "tokens_trained": trainer.tokens_trained - trained_before,
                },
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


class LoraLabPBT(PopulationBasedTraining):
    """Ray's PBT with LoRALab's explore step, and every exploit written to lineage.jsonl."""

    def __init__(self, space: Any, run_dir: str, seed: int, **kwargs: Any):
        mutations = {
            "rank": list(space.ranks),
            "alpha_multiplier": list(space.alpha_multipliers),
            "learning_rate": list(space.learning_rates),
            "dropout": list(space.dropouts),
            "target_modules": module_sets(space),
        }
        super().__init__(hyperparam_mutations=mutations, **kwargs)
        self.space = space
        self.lineage_path = str(Path(run_dir) / LINEAGE_FILE)
        self.rng = random.Random(noise_key(seed, "pbt-explore"))

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        """Ray's synchronous PBT deadlocks after Tuner.restore when members resumed at
        different generations: an exploit copies the leader's train time to the clones,
        every member ends at or past the next sync point, and none may run
        (ray-project/ray#48616). Then the sync point moves to the laggards' next step."""
        trial = super().choose_trial_to_run(tune_controller)
        trials = tune_controller.get_trials()
        waiting = [t for t in trials if t.status in (Trial.PENDING, Trial.PAUSED)]
        if trial is None and waiting and not any(t.status == Trial.RUNNING for t in trials):
            self._next_perturbation_sync = (
                min(self._trial_state[t].last_train_time for t in waiting) + self._perturbation_interval
            )
            trial = super().choose_trial_to_run(tune_controller)
        return trial

    def _get_new_config(self, trial: Any, trial_to_clone: Any) -> tuple[dict, dict]:
        old = trial_to_clone.config
        new, operations = explore(old, self.space, self.rng)
        # The result PBT ranked the parent by (its own record), not the trial's latest result,
        # which Tune can reset when it pauses and restarts the trial.
        state = self._trial_state.get(trial_to_clone)
        last = (state.last_result if state is not None else None) or trial_to_clone.last_result or {}
        generation = int(last.get("generation", 0))
        record = {
            "generation": generation,
            "op": "exploit",
            "trial": trial.trial_id,
            "from_trial": trial_to_clone.trial_id,
            "parent": last.get("member", ""),
            "id": member_id(new, generation),
            "fitness": last.get("fitness"),
            "changes": {k: [old[k], new[k]] for k in KEYS if old[k] != new[k]},
            "operations": operations,
        }
        with open(self.lineage_path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        return new, operations


class TrialLog(Callback):
    """Every trial result to trials.jsonl and a console line (picklable: Tune stores it)."""

    def __init__(self, run_dir: str, generations: int, quiet: bool):
        self.path, self.generations, self.quiet = str(Path(run_dir) / TRIALS_FILE), generations, quiet

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        keys = (
            "generation",
            "member",
            "parent",
            "fitness",
            "reward",
            "accuracy",
            "perplexity",
            "loss",
            "step",
            "tokens_trained",
        )
        record = {"trial": trial.trial_id, **{k: result.get(k) for k in keys}, **{k: trial.config[k] for k in KEYS}}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if not self.quiet:
            print(
                f"gen {record['generation']:>3}/{self.generations}  {record['member']:<28} fitness "
                f"{record['fitness']:.3f}  accuracy {record['accuracy']:.3f}  perplexity {record['perplexity']:.2f}"
                f"  loss {record['loss']:.3f}",
                flush=True,
            )


def generation_records(trials: list[dict[str, Any]], parameters: int, scoring: Spend) -> list[dict[str, Any]]:
    """metrics.jsonl: one line per generation, over the trials that reported it, with its compute:
    training 6 x P x tokens trained, and the members' scoring (every member is scored on the same
    split every generation, so the scoring total is shared out evenly)."""
    generations = sorted({t["generation"] for t in trials})
    scoring_flops = scoring.flops(parameters)["flops"] / max(len(generations), 1)
    records, cumulative = [], 0.0
    for generation in generations:
        rows = [t for t in trials if t["generation"] == generation]
        fitness = [t["fitness"] for t in rows]
        best = max(rows, key=lambda t: t["fitness"])
        trained = sum(t.get("tokens_trained") or 0 for t in rows)
        flops = 6.0 * parameters * trained + scoring_flops
        cumulative += flops
        records.append(
            {
                "generation": generation,
                "fitness_max": max(fitness),
                "fitness_median": statistics.median(fitness),
                "fitness_min": min(fitness),
                "accuracy_max": max(t["accuracy"] for t in rows),
                "best_member": best["member"],
                "trials": len(rows),
                "tokens_trained": trained,
                "flops": flops,
                "cumulative_flops": cumulative,
            }
        )
    return records


def converged(best_by_generation: list[float], window: int = 5, threshold: float = 0.01) -> bool | None:
    """LoRALab's convergence flag: the best fitness improved by less than 1% over the last
    5 generations (reported, never used to stop). None with too few generations."""
    if len(best_by_generation) <= window:
        return None
    before, now = best_by_generation[-window - 1], best_by_generation[-1]
    return (now - before) <= threshold * max(abs(before), 1e-9)


def _callbacks(run: RunConfig, run_dir: Path) -> list[Any]:
    """trials.jsonl and console lines always; W&B's logger with tracking=wandb."""
    callbacks: list[Any] = [TrialLog(str(run_dir), run.generations, quiet=not run.tracking.progress)]
    if run.tracking.name == "wandb":
        from ray.air.integrations.wandb import WandbLoggerCallback

        tracking = run.tracking
        callbacks.append(
            WandbLoggerCallback(
                project=tracking.wandb_project,
                entity=tracking.wandb_entity,
                group=tracking.wandb_group or run_dir.name,
                mode=tracking.wandb_mode,
                dir=str(run_dir),
                log_config=False,
            )
        )
    return callbacks


def _tuner(run: RunConfig, run_dir: Path, context: TrialContext, restore: bool) -> tune.Tuner:
    hw, space = run.hardware, run.strategy
    trainable = tune.with_resources(
        tune.with_parameters(pbt_trial, context=context), {"cpu": hw.trial_cpus, "gpu": hw.trial_gpus}
    )
    experiment = run_dir.resolve() / "tune" / EXPERIMENT
    if restore:
        return tune.Tuner.restore(str(experiment), trainable=trainable, resume_unfinished=True, resume_errored=True)
    rng = random.Random(noise_key(run.seed, "pbt-initial"))
    points = [sample(space, rng) for _ in range(space.population)]
    param_space = {
        "rank": tune.choice(space.ranks),
        "alpha_multiplier": tune.choice(space.alpha_multipliers),
        "learning_rate": tune.choice(space.learning_rates),
        "dropout": tune.choice(space.dropouts),
        "target_modules": tune.choice(module_sets(space)),
    }
    scheduler = LoraLabPBT(
        space,
        str(run_dir),
        run.seed,
        time_attr="training_iteration",
        metric="fitness",
        mode="max",
        perturbation_interval=1,
        quantile_fraction=space.keep_top_fraction,
        synch=True,
    )
    callbacks = _callbacks(run, run_dir)
    warnings.filterwarnings("ignore", message=".*num_to_keep.*PBT")
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            scheduler=scheduler,
            num_samples=space.population,
            search_alg=BasicVariantGenerator(points_to_evaluate=points),
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=EXPERIMENT,
            storage_path=str(experiment.parent),
            stop={"training_iteration": run.generations},
            failure_config=tune.FailureConfig(max_failures=2),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=4),
            callbacks=callbacks,
            verbose=0,
        ),
    )


def _service(run: RunConfig, model_path: str, shapes: dict, name: str) -> Any:
    """The shared EvaluationService; its engines accept the largest rank of the search space."""
    from dataclasses import replace

    # num_workers=null means one engine per GPU for es/ga; here trials train on the GPUs, so one engine.
    hardware = replace(run.hardware, num_workers=run.hardware.num_workers or 1)
    widest = max(run.strategy.ranks)
    layout = build_layout(
        shapes,
        rank=widest,
        alpha=widest,
        target_modules=sorted({m for ts in run.strategy.target_modules for m in ts}),
        layers=run.lora.layers,
        base_model=model_path,
    )
    splits = build_task(run.task, run.seed).splits()
    sizes = {name_: len(splits.get(name_)) for name_ in ("train", "selection", "heldout")}
    spec = worker_spec(run, model_path, layout, name.rsplit("-", 1)[-1], with_strategy=False, max_lora_rank=widest)
    return ray.remote(EvaluationService).options(name=name, num_cpus=0).remote(spec, hardware, sizes)


def check_trial_resources(run: RunConfig) -> None:
    """Fail now, not hang in Tune's queue, when no member fits beside the engine workers."""
    free = ray.available_resources()
    for key, resource in (("trial_cpus", "CPU"), ("trial_gpus", "GPU")):
        wanted = getattr(run.hardware, key)
        if wanted > free.get(resource, 0.0) + 1e-9:
            raise ConfigError(
                f"hardware.{key}={wanted}: only {free.get(resource, 0.0):g} {resource} left beside "
                f"the engine workers; lower hardware.{key} or hardware.num_workers"
            )


def quiet_tune() -> None:
    """Tune's own log off the console; evora prints one line per result (its output settings
    are environment variables, which the CLI sets for its process: cli.TUNE_ENVIRONMENT)."""
    for name in ("ray.tune", "ray.train", "ray.air"):
        logging.getLogger(name).setLevel(logging.ERROR)


def run_pbt(run: RunConfig, run_dir: str, on_event: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    started = time.perf_counter()
    quiet_tune()
    random.seed(noise_key(run.seed, "pbt-scheduler"))  # Ray's PBT picks whom to clone with `random`
    folder = Path(run_dir)
    restore = (folder / "tune" / EXPERIMENT / "tuner.pkl").exists()
    if not restore:
        write_config(folder, run)
    init_ray(run)
    model_path = locate_model(run.model.path).path
    shapes = adaptable_modules(model_path, revision=run.model.revision, trust_remote_code=run.model.trust_remote_code)
    name = f"evora-eval-{run_tag(run_dir)}"
    service = _service(run, model_path, shapes, name)
    # Engines first: trials started earlier could take the CPUs/GPUs the engine workers need.
    workers = ray.get(service.workers.remote())
    check_trial_resources(run)
    context = TrialContext(run, model_path, name, shapes)
    on_event(
        {
            "kind": "start",
            "strategy": "pbt",
            "population": run.strategy.population,
            "generations": run.generations,
            "start": 0,
            "workers": workers,
            "resumed": restore,
            "base_heldout": None,
            "adapter_parameters": None,
            "setup_seconds": time.perf_counter() - started,
        }
    )
    ledger = ComputeLedger(count_parameters(model_path, run.model.revision, run.model.trust_remote_code))
    ledger.add_seconds("setup", time.perf_counter() - started)
    try:
        searched = time.perf_counter()
        results = _tuner(run, folder, context, restore).fit()
        ledger.add_seconds("search", time.perf_counter() - searched)
        final = _finish(run, folder, context, service, results, ledger)
        on_event(final)
        return final
    finally:
        ray.get(service.shutdown.remote())
        ray.kill(service)


def _members(run: RunConfig, context: TrialContext, service: Any, results: Any) -> list[dict[str, Any]]:
    """Every member's last checkpoint and its held-out metrics."""
    if results.errors:
        raise RuntimeError(f"{len(results.errors)} PBT member(s) failed; the first: {results.errors[0]}")
    fitness = parse_fitness(run.strategy.fitness)
    members = []
    for result in results:
        if result.checkpoint is None:
            continue
        with result.checkpoint.as_directory() as directory:
            meta = torch.load(Path(directory) / "trainer.pt", map_location="cpu", weights_only=True)
            adapter = load_adapter_tensors(Path(directory) / "adapter")
        layout = layout_for(meta["hp"], context)
        heldout = ray.get(service.metrics.remote(adapter, layout, "heldout", bucket="evaluation"))
        members.append(
            {
                "member": meta["member"],
                "hp": meta["hp"],
                "selection_fitness": result.metrics["fitness"],
                "heldout": {**heldout, "fitness": fitness(heldout)},
                "adapter": adapter,
                "layout": layout,
            }
        )
    return members


def _finish(
    run: RunConfig, folder: Path, context: TrialContext, service: Any, results: Any, ledger: ComputeLedger
) -> dict[str, Any]:
    """Best member's adapter, every member's held-out fitness, the base comparison, the summary."""
    started = time.perf_counter()
    members = _members(run, context, service, results)
    best = max(members, key=lambda m: m["selection_fitness"])  # chosen without looking at held-out
    save_adapter(folder / "adapters" / "best", best["adapter"], best["layout"])
    examples = build_task(run.task, run.seed).splits().heldout
    report = report_against_base(
        lambda theta, layout, ops: ray.get(
            service.evaluate.remote(theta, layout, "heldout", with_base=True, keep_texts=True, bucket="evaluation")
        ),
        best["adapter"],
        best["layout"],
        examples,
        task=run.task.name,
        split="heldout",
        adapter_name="adapters/best",
        out_dir=folder / "eval",
        stem="best_vs_base",
    )
    fitness = parse_fitness(run.strategy.fitness)
    base = {**report["base_metrics"], "fitness": fitness(report["base_metrics"])}
    trials, scoring = read_trials(folder), ray.get(service.spend.remote("search"))  # each read once
    ledger.search.add(scoring)
    ledger.search.tokens_trained += sum(t.get("tokens_trained") or 0 for t in trials)
    ledger.evaluation.add(ray.get(service.spend.remote("evaluation")))
    generations = generation_records(trials, ledger.parameters, scoring)
    (folder / METRICS_FILE).write_text("".join(json.dumps(g) + "\n" for g in generations))
    ledger.add_seconds("evaluation", time.perf_counter() - started)
    details = {
        "best_hyperparameters": best["hp"],
        "converged": converged([g["fitness_max"] for g in generations]),
        "median_member_heldout_fitness": statistics.median(m["heldout"]["fitness"] for m in members),
        "members": {m["member"]: m["heldout"]["fitness"] for m in members},
        "members_selection_fitness": [[m["member"], m["selection_fitness"]] for m in members],
    }
    summary = write_run_summary(
        folder,
        strategy="pbt",
        generations=run.generations,
        center=None,
        outcome=Outcome(base, None, best["heldout"], None, best["member"], run.strategy.eval_split),
        counts=report["counts"],
        adapters={"best": "adapters/best"},
        compute=ledger.summary(sum(ledger.seconds.values())),
        details=details,
    )
    return final_event(summary, folder)
