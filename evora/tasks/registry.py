"""The task registry: the one place config, validation and the run learn what tasks exist.

A task registers itself from its module in `tasks/builtin/` (or from a user's module), with the
config that holds its own keys and the rules that check them:

    @dataclass(frozen=True)
    class CountdownConfig(TaskConfig):
        number_rule: str = "all_exactly_once"

    @register_task("countdown", config=CountdownConfig, validate=check_countdown, data_source="...")
    class CountdownTask: ...

Hydra composes conf/task/<name>.yaml onto the config (its `defaults` start with `<name>_schema`),
so a key the task does not have is an error while composing; `validate(cfg)` runs before Ray.
Adding a task touches its module and its YAML. `task.name` may also be an import path,
`mypkg.tasks:MyTask`: a class registered with `register_task` brings its config; any other
class gets `TaskConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from evora.config.schema import TaskConfig
from evora.errors import ConfigError
from evora.tasks.base import SERVED_REWARDS, CustomReward, Task, is_user_reward, load_object

T = TypeVar("T")


@dataclass(frozen=True)
class TaskEntry:
    name: str
    task: type  # built as task(config, seed); a tasks.base.Task
    config: type[TaskConfig] = TaskConfig  # the task's keys: TaskConfig's and its own
    validate: Callable[[Any], None] | None = None  # (task config) -> None; raises ConfigError
    hub_data: bool = False  # its data comes from the hub unless task.data_path is set
    data_source: str | None = None  # where a task.data_path file comes from: said when it is not found
    # Its reward runs third-party code (reasoning-gym's scorers): scored in reward processes,
    # bounded in time and memory, as a user's reward is (tasks/reward_pool.py); a function of
    # the task's config where that depends on it (task=mix: on its families).
    isolated: bool | Callable[[Any], bool] = False
    # task=mix: a family named "<task>_<value>" is this task with task.<family_key>=<value>
    # (reasoning_gym_countdown: task=reasoning_gym task.dataset=countdown).
    family_key: str | None = None
    local_dataset: bool = False  # task.dataset names data made here (reasoning-gym's), not a hub dataset

    def check(self, cfg: TaskConfig) -> None:
        """The config is the task's type, and its own rules hold."""
        if not isinstance(cfg, self.config):
            raise ConfigError(
                f"task.name={cfg.name}: its config is a {type(cfg).__name__}, the task needs a "
                f"{self.config.__name__}; choose it with task={self.name}"
            )
        if self.validate is not None:
            self.validate(cfg)


_REGISTRY: dict[str, TaskEntry] = {}


def register_task(
    name: str, *, config: type[TaskConfig] = TaskConfig, validate: Callable[[Any], None] | None = None, **fields: Any
) -> Callable[[T], T]:
    """Class decorator: the task `name`, composed onto `config`, checked by `validate`."""
    if not (isinstance(config, type) and issubclass(config, TaskConfig) and dataclasses.is_dataclass(config)):
        raise TypeError(f"task {name}: config must be a dataclass extending evora.config.schema.TaskConfig")

    def add(cls: Any) -> Any:
        cls.name = name
        cls.plain_template = getattr(cls, "plain_template", "{prompt}")  # a class default, not a probe of a config
        _REGISTRY[name] = TaskEntry(name, cls, config, validate, **fields)
        return cls

    return add


def task_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def entries() -> list[TaskEntry]:
    return [_REGISTRY[n] for n in task_names()]


def get_task(name: str) -> TaskEntry:
    """The entry of a registered task, or of a task class named by import path (module:Class)."""
    if ":" in name:
        cls = load_object(name, "task.name")
        registered = [entry for entry in _REGISTRY.values() if entry.task is cls]
        return registered[0] if registered else TaskEntry(name, cls)
    if name not in _REGISTRY:
        raise ConfigError(
            f"task.name={name}: unknown task; allowed: {', '.join(task_names())}, "
            "or a class path like mypkg.tasks:MyTask"
        )
    return _REGISTRY[name]


def task_config(name: str, **fields: Any) -> TaskConfig:
    """The config of task `name` with its defaults and `fields` (the way code, not Hydra, makes one)."""
    return get_task(name).config(name=name, **fields)


def reads_hub_data(cfg: TaskConfig) -> bool:
    """Whether building the task downloads its data (a hub dataset, not a local file)."""
    if cfg.data_path is not None:
        return False
    entry = get_task(cfg.name)
    return entry.hub_data or (cfg.dataset is not None and ":" not in cfg.name and not entry.local_dataset)


def isolated_reward(cfg: TaskConfig) -> bool:
    """Whether scoring runs code evora does not own (a user's reward or task class, a third-party
    scorer): then it runs in reward processes. task=mix: whether any family's does."""
    if is_user_reward(cfg):
        return True
    if cfg.reward is not None:  # a served reward (judge, reward_model) replaces the task's
        return False
    isolated = get_task(cfg.name).isolated
    return isolated(cfg) if callable(isolated) else isolated


def family_entry(name: str) -> tuple[TaskEntry, dict[str, str]]:
    """task=mix's family `name`: its task, and the key its name sets (`family_key`)."""
    if name in _REGISTRY:
        return _REGISTRY[name], {}
    for entry in _REGISTRY.values():
        if entry.family_key is not None and name.startswith(f"{entry.name}_") and len(name) > len(entry.name) + 1:
            return entry, {entry.family_key: name[len(entry.name) + 1 :]}
    raise ConfigError(
        f"task.families.{name}: unknown task family; allowed: {', '.join(t for t in task_names() if t != 'mix')}, "
        f"or {', '.join(f'{e.name}_<{e.family_key}>' for e in entries() if e.family_key)}"
    )


def build_task(cfg: TaskConfig, seed: int) -> Task:
    entry = get_task(cfg.name)
    if not isinstance(cfg, entry.config):
        entry.check(cfg)  # the one-line error
    task: Task = entry.task(cfg, seed)
    if cfg.reward is not None and cfg.reward not in SERVED_REWARDS:
        return CustomReward(task, load_object(cfg.reward, "task.reward"))
    return task
