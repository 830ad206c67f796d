"""`evora resume=<run dir>`: the saved config, plus the few changes a resume may make.

Resuming continues the same trajectory, so only keys that do not change it may be
overridden: how many generations, how often to evaluate, hardware and tracking.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from evora.config.compose import run_config_from_dict
from evora.config.schema import RunConfig
from evora.errors import ConfigError
from evora.tracking.run_dir import CONFIG_FILE

RESUMABLE = ("generations", "eval_every", "hardware", "tracking")


def resumed_run_config(composed: RunConfig, overrides: list[str]) -> RunConfig:
    """`composed` is the command line's config; `overrides` its override strings."""
    saved_file = Path(composed.resume) / CONFIG_FILE
    saved = run_config_from_dict(yaml.safe_load(saved_file.read_text()))
    changes = {}
    for text in overrides:
        key = text.split("=", 1)[0].lstrip("+~")
        top = key.split(".")[0].split("/")[0]
        if top in ("resume", "hydra"):
            continue
        if top not in RESUMABLE:
            raise ConfigError(f"{key}: cannot change when resuming (it would change the trajectory); "
                              f"allowed: {', '.join(RESUMABLE)}")
        changes[top] = getattr(composed, top)
    return dataclasses.replace(saved, resume=composed.resume, **changes)
