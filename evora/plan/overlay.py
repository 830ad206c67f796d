"""Command-line overrides applied onto a saved run's config (resume, eval).

A dotted override (`generations=60`, `hardware.num_workers=1`) changes that key; a group
override (`task=countdown`) replaces the whole group with that option's config. Resume
continues the same trajectory, so only keys that do not change it may be overridden.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from evora.config.schema import RunConfig
from evora.errors import ConfigError
from evora.plan.compose import GROUPS, compose, parse_overrides, run_config_from_dict, to_run_config
from evora.plan.store import unfreeze
from evora.plan.validate import validate
from evora.tracking.run_dir import CONFIG_FILE

# Top-level groups, or single keys, that a resume may change: where a run's scratch lives
# (a SLURM job's own folder) does not change what it computes, nor does how the judge is reached
# (a judge restarted at another address; its model and prompt stay).
JUDGE_ACCESS = tuple(
    f"task.judge.{key}" for key in ("url", "api_key_env", "concurrency", "retries", "timeout_s", "max_error_rate")
)
RESUMABLE = ("generations", "eval_every", "hardware", "tracking", "engine.adapter_dir", *JUDGE_ACCESS)
SKIPPED = ("resume", "hydra")


def saved_run_config(run_dir: str | Path) -> RunConfig:
    return run_config_from_dict(yaml.safe_load((Path(run_dir) / CONFIG_FILE).read_text()))


def overlay(
    saved: RunConfig, overrides: list[str], allowed: tuple[str, ...] | None = None, purpose: str = ""
) -> RunConfig:
    node = unfreeze(OmegaConf.structured(saved))
    for text, override in zip(overrides, parse_overrides(overrides)):
        key = override.key_or_group.lstrip("+~")
        top = key.split(".")[0].split("/")[0]
        if top in SKIPPED:
            continue
        if allowed is not None and top not in allowed and key not in allowed:
            raise ConfigError(f"{key}: cannot change {purpose}; allowed: {', '.join(allowed)}")
        if override.is_sweep_override():
            raise ConfigError(f"malformed override '{text}': a sweep is not allowed here")
        if key in GROUPS:
            option = getattr(to_run_config(compose([text])), key)  # validated below, with the rest
            node[key] = unfreeze(OmegaConf.structured(option))
        else:
            try:
                OmegaConf.update(node, key, override.value(), merge=False)
            except Exception as error:  # unknown key or wrong type, reported like the preflight does
                raise ConfigError(f"{key}: {str(error).splitlines()[0]}") from None
    run = OmegaConf.to_object(node)
    assert isinstance(run, RunConfig)  # the structured node of a RunConfig
    validate(run)
    return run


def resumed_run_config(composed: RunConfig, overrides: list[str]) -> RunConfig:
    """`composed` is the command line's config; `overrides` its override strings."""
    assert composed.resume is not None
    resumed = overlay(
        saved_run_config(composed.resume), overrides, RESUMABLE, "when resuming (it would change the trajectory)"
    )
    return dataclasses.replace(resumed, resume=composed.resume)
