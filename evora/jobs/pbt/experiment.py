"""The Ray Tune experiment of a PBT run: the trainable with its resources, the search space
and its seeded initial members, the LoRALab scheduler, the callbacks and the storage (under
the run folder, so `resume=` restores it)."""

from __future__ import annotations

import logging
import random
import warnings
from pathlib import Path
from typing import Any

from ray import tune
from ray.tune.search.basic_variant import BasicVariantGenerator

from evora.config.schema import RunConfig
from evora.jobs.pbt.records import RoundLog, TrialLog
from evora.jobs.pbt.scheduler import LoraLabPBT
from evora.jobs.pbt.trial import TrialContext, pbt_trial
from evora.lora.keys import noise_key
from evora.strategies.pbt.config import PBTConfig
from evora.strategies.pbt.space import module_sets, sample

EXPERIMENT = "pbt"


def experiment_dir(run_dir: Path) -> Path:
    return run_dir.resolve() / "tune" / EXPERIMENT


def quiet_tune() -> None:
    """Tune's own log off the console; evora prints one line per result (its output settings
    are environment variables, which the CLI sets for its process: the registration's TUNE_ENVIRONMENT)."""
    for name in ("ray.tune", "ray.train", "ray.air"):
        logging.getLogger(name).setLevel(logging.ERROR)


def callbacks(run: RunConfig, run_dir: Path, context: TrialContext, parameters: int) -> list[Any]:
    """trials.jsonl and console lines; rounds through evora's sinks (metrics.jsonl, and the
    job's W&B run with tracking=wandb); there, each member also as a W&B run of the same group
    (Ray's W&B logger: a member's own curve)."""
    found: list[Any] = [
        TrialLog(str(run_dir), run.generations, quiet=not run.tracking.progress),
        RoundLog(run, str(run_dir), parameters, context.service),
    ]
    if run.tracking.name == "wandb":
        from ray.air.integrations.wandb import WandbLoggerCallback

        tracking = run.tracking
        found.append(
            WandbLoggerCallback(
                project=tracking.wandb_project,
                entity=tracking.wandb_entity,
                group=tracking.wandb_group or run.name,
                mode=tracking.wandb_mode,
                dir=str(run_dir),
                log_config=False,
            )
        )
    return found


def search_space(space: PBTConfig, seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Tune's search space and the population's initial members, drawn from the run seed."""
    rng = random.Random(noise_key(seed, "pbt-initial"))
    points = [sample(space, rng) for _ in range(space.population)]
    param_space = {
        "rank": tune.choice(space.ranks),
        "alpha_multiplier": tune.choice(space.alpha_multipliers),
        "learning_rate": tune.choice(space.learning_rates),
        "dropout": tune.choice(space.dropouts),
        "target_modules": tune.choice(module_sets(space)),
    }
    return param_space, points


def scheduler(run: RunConfig, run_dir: Path) -> LoraLabPBT:
    return LoraLabPBT(
        run.strategy,
        str(run_dir),
        run.seed,
        time_attr="training_iteration",
        metric="fitness",
        mode="max",
        perturbation_interval=1,
        quantile_fraction=run.strategy.keep_top_fraction,
        synch=True,
    )


def tuner(run: RunConfig, run_dir: Path, context: TrialContext, parameters: int, restore: bool) -> tune.Tuner:
    """A new experiment, or the run's own restored (unfinished and errored trials resume)."""
    hw, space = run.hardware, run.strategy
    trainable = tune.with_resources(
        tune.with_parameters(pbt_trial, context=context), {"cpu": hw.trial_cpus, "gpu": hw.trial_gpus}
    )
    experiment = experiment_dir(run_dir)
    if restore:
        return tune.Tuner.restore(str(experiment), trainable=trainable, resume_unfinished=True, resume_errored=True)
    param_space, points = search_space(space, run.seed)
    warnings.filterwarnings("ignore", message=".*num_to_keep.*PBT")
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            scheduler=scheduler(run, run_dir),
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
            callbacks=callbacks(run, run_dir, context, parameters),
            verbose=0,
        ),
    )
