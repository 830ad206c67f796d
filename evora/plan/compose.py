"""Composing configs: malformed overrides, unknown group options, wrong types, unknown keys and
range rules all become one-line ConfigErrors naming the key and the allowed values. The
preflight over every job of a command line is `plan.jobs.preflight`."""

from __future__ import annotations

import dataclasses
import itertools
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from evora.config import schema
from evora.engines import get_engine
from evora.errors import ConfigError
from evora.plan.store import register, register_option, writable_schema
from evora.plan.validate import validate
from evora.strategies import get_strategy, strategy_names
from evora.tasks import get_task, task_names

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("model", "task", "strategy", "engine", "hardware", "tracking")
MAX_PREFLIGHT_JOBS = 512
# Hydra flags that take a value; their values are not overrides.
_FLAGS_WITH_VALUE = {
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-name",
    "-cn",
    "--config-path",
    "-cp",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
    "--info",
    "-i",
}
_PASSIVE_FLAGS = {
    "--help",
    "-h",
    "--hydra-help",
    "--version",
    "--info",
    "-i",
    "--cfg",
    "-c",
    "--shell-completion",
    "-sc",
    "--resolve",
}

# Hydra's modes, of which it takes one: flag -> the mode's name in an error.
_MODE_FLAGS = {
    **dict.fromkeys(("-m", "--multirun"), "-m"),
    **dict.fromkeys(("-r", "--run"), "--run"),
    **dict.fromkeys(("-c", "--cfg"), "--cfg"),
    **dict.fromkeys(("-i", "--info"), "--info"),
    **dict.fromkeys(("-sc", "--shell-completion"), "--shell-completion"),
}


def new_run_dir(out_dir: str, name: str, now: datetime | None = None) -> str:
    stamp = (now or datetime.now()).strftime("%Y-%m-%d_%H-%M-%S")
    safe = re.sub(r"[^\w.-]+", "-", name)  # a user's task or strategy may be named module:Class
    return str(Path(out_dir) / f"{stamp}_{safe}")


def _run_dir(out_dir: str, name: str, resume: Any) -> str:
    return str(resume) if resume not in (None, "", "None", "null") else new_run_dir(out_dir, name)


def setup() -> None:
    """Register schemas and resolvers (idempotent); call before Hydra composes."""
    register()
    if not OmegaConf.has_resolver("evora_run_dir"):
        OmegaConf.register_new_resolver("evora_run_dir", _run_dir, use_cache=True)


def _strategy_named(value: str) -> tuple[str, type] | None:
    entry = get_strategy(value)
    return entry.name, entry.config


def _task_named(value: str) -> tuple[str, type] | None:
    entry = get_task(value)
    return (entry.name, entry.config) if entry.name in task_names() else None  # a class not registered: no option


# group -> (its registered names, what a name or import path resolves to: (option, config), or None)
REGISTRIES: dict[str, tuple[Callable[[], Iterable[str]], Callable[[str], tuple[str, type] | None]]] = {
    "strategy": (strategy_names, _strategy_named),
    "task": (task_names, _task_named),
}


def group_options(group: str) -> list[str]:
    """A group's options: its YAML files (and, for strategy and task, every registered name)."""
    options = {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
    if group in REGISTRIES:
        options |= set(REGISTRIES[group][0]())
    return sorted(options)


def is_option(group: str, name: str) -> bool:
    """Whether `<group>=<name>` composes: a YAML or registered name, or an import path (or an
    entry point's name) that the group's registry resolves."""
    if name in group_options(group):
        return True
    try:
        return group in REGISTRIES and REGISTRIES[group][1](name) is not None
    except ConfigError:
        return False


def resolve_named_overrides(overrides: list[str]) -> list[str]:
    """`strategy.name=<module>:<class>` or `strategy=<module>:<class>` (or an entry point's
    name) becomes `strategy=<registered name>`, with that strategy's config as the option; the
    same for a task class registered with its config (`task.name=mypkg.tasks:MyTask`)."""
    resolved = []
    for text in overrides:
        key, _, value = text.partition("=")
        group = key.removesuffix(".name")
        named = group in REGISTRIES and (
            ":" in value or (key == group and value not in group_options(group) and "," not in value)
        )
        if not named:
            resolved.append(text)
            continue
        try:
            found = REGISTRIES[group][1](value)
        except ConfigError:
            if ":" in value:
                raise
            found = None  # not an entry point either: the group check names the options
        if found is None:
            resolved.append(text)
            continue
        option, config = found
        register_option(group, option, config, value)
        resolved.append(f"{group}={option}")
    return resolved


def compose(overrides: list[str]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    setup()
    if GlobalHydra.instance().is_initialized():  # inside the CLI's @hydra.main (on CONF_DIR): PBT's finish runs there
        return hydra_compose(config_name="config", overrides=overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def to_run_config(cfg: DictConfig) -> schema.RunConfig:
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]  # a structured RunConfig node gives a RunConfig


def run_config_from_dict(data: dict[str, Any]) -> schema.RunConfig:
    """A RunConfig from a saved config.yaml (resume), its strategy, task and engine typed by name."""
    base = writable_schema(schema.RunConfig)
    base.strategy = writable_schema(get_strategy(data["strategy"]["name"]).config)
    typed: dict[str, type[schema.TaskConfig] | type[schema.EngineConfig]] = {
        "task": get_task(data["task"]["name"]).config,
        "engine": get_engine(data["engine"]["name"]).config,
    }
    saved = dict(data)
    for section, config in typed.items():
        base[section] = writable_schema(config)
        # A saved config was valid when written, so a key its section's config lacks comes from
        # before tasks and engines were typed, when each carried every one's keys: it was unused.
        known = {f.name for f in dataclasses.fields(config)}
        saved[section] = {k: v for k, v in data[section].items() if k in known}
    return OmegaConf.to_object(OmegaConf.merge(base, saved))  # type: ignore[return-value]  # as above


def overrides_of(argv: list[str]) -> list[str] | None:
    """The override arguments of a command line; None when Hydra only prints something."""
    modes = sorted({_MODE_FLAGS[arg] for arg in argv if arg in _MODE_FLAGS})
    if len(modes) > 1:
        raise ConfigError(
            f"{' and '.join(modes)} cannot go together: Hydra does one of them "
            "(drop -m to print one job's config: evora <overrides> --cfg job)"
        )
    overrides, skip_next = [], False
    for arg in argv:
        if skip_next:
            skip_next = False
        elif arg in _PASSIVE_FLAGS:
            return None
        elif arg in _FLAGS_WITH_VALUE:
            skip_next = True
        elif not arg.startswith("-"):
            overrides.append(arg)
    return overrides


def parse_overrides(overrides: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed.append(parser.parse_override(text))
        except HydraException as error:
            reason = str(error).strip().splitlines()[-1].strip()
            raise ConfigError(
                f"malformed override '{text}': {reason}; expected key=value, e.g. strategy.sigma=0.002"
            ) from None
    return parsed


def expand_jobs(overrides: list[str]) -> list[list[str]]:
    """One override list per job of a (multi)run, as Hydra's basic sweeper expands them; a search
    space's interval (`interval(a,b)`, for hydra/sweeper=optuna) as its two ends, so that the
    preflight checks both."""
    from hydra.core.override_parser.types import IntervalSweep

    axes = []
    for text, override in zip(overrides, parse_overrides(overrides)):
        key = override.get_key_element()
        if isinstance(override.value(), IntervalSweep):
            interval = override.value()
            axes.append([f"{key}={interval.start}", f"{key}={interval.end}"])
        elif override.is_sweep_override():
            axes.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            axes.append([text])
    return [list(job) for job in itertools.islice(itertools.product(*axes), MAX_PREFLIGHT_JOBS)]


def _check_group_choices(overrides: list[str]) -> None:
    for override in parse_overrides(overrides):
        group = override.key_or_group.lstrip("+~")
        if group in GROUPS and override.package is None and not override.is_delete():
            value = override.value()
            allowed = group_options(group)
            if value not in allowed:
                raise ConfigError(f"{group}={value}: unknown option; allowed: {', '.join(allowed)}")


def _composition_error(error: Exception) -> ConfigError:
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__ or cause.__context__
    if (
        isinstance(cause, (ConfigKeyError, ConfigAttributeError))
        and getattr(cause, "object_type", None) is not None
        and dataclasses.is_dataclass(cause.object_type)
    ):
        allowed = ", ".join(f.name for f in dataclasses.fields(cause.object_type))
        return ConfigError(f"{cause.full_key}: unknown key; allowed: {allowed}")
    if isinstance(cause, ValidationError):
        message = str(cause.msg).splitlines()[0]
        return ConfigError(f"{cause.full_key}: {message}")
    return ConfigError(str(error).strip().splitlines()[0])


def compose_run(overrides: list[str], validated: bool = True) -> schema.RunConfig:
    """Compose and validate one job; every problem is a one-line ConfigError."""
    overrides = resolve_named_overrides([o for o in overrides if not o.lstrip("+~").startswith("hydra")])
    _check_group_choices(overrides)
    try:
        run = to_run_config(compose(overrides))
    except ConfigError:
        raise
    except Exception as error:  # Hydra and OmegaConf raise many types; all are config errors here
        raise _composition_error(error) from None
    if validated:
        validate(run)
    return run
