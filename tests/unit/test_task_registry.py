"""The task registry: every module in tasks/builtin registers its tasks, each with a typed config
and a YAML that composes onto it; a task's own keys and rules live with it (plan/validate.py
names no task); a new task is one module and one YAML."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import yaml
from package_copy import run_in_copy

import evora
from evora.config.schema import TaskConfig
from evora.errors import ConfigError
from evora.plan.compose import CONF_DIR, compose_run, group_options, run_config_from_dict
from evora.tasks import build_task, get_task, register_task, task_config, task_names
from evora.tasks.builtin.countdown import CountdownConfig
from evora.tasks.builtin.mix import MixConfig, shares, weighted
from evora.tasks.registry import entries

PACKAGE = Path(evora.__file__).resolve().parent
BUILTIN = PACKAGE / "tasks" / "builtin"
HUB_TASKS = ("gsm8k", "mmlu_pro", "lm_eval")  # need downloads or lm-eval's data to validate
BIG = ("countdown", "conciseness", "gsm8k", "mmlu_pro", "jsonl", "lm_eval")  # budgets beyond the tiny model's context


def test_every_builtin_module_registers_tasks_each_with_a_yaml_on_its_config():
    built_in = [e for e in entries() if e.task.__module__.startswith("evora.tasks.builtin.")]
    modules = {p.stem for p in BUILTIN.glob("*.py") if p.stem != "__init__"}
    assert {e.task.__module__.rsplit(".", 1)[1] for e in built_in} == modules
    for entry in built_in:
        path = CONF_DIR / "task" / f"{entry.name}.yaml"
        assert yaml.safe_load(path.read_text())["defaults"][0] == f"{entry.name}_schema", entry.name
        extra = ["model=qwen2_5_0_5b"] if entry.name in BIG else []
        run = compose_run([f"task={entry.name}", *extra], validated=False)
        assert type(run.task) is entry.config and run.task.name == entry.name
        assert entry.name in group_options("task")
    assert {"countdown", "jsonl", "mix", "lm_eval", "conciseness"} <= {
        e.name for e in built_in if e.config is not TaskConfig and e.validate is not None
    }


def test_a_task_key_belongs_to_its_task():
    run = compose_run(["task=countdown", "model=qwen2_5_0_5b", "task.number_rule=at_most_once"], validated=False)
    assert isinstance(run.task, CountdownConfig) and run.task.number_rule == "at_most_once"
    with pytest.raises(ConfigError) as error:
        compose_run(["task.number_rule=at_most_once"])  # addition has no such key
    assert str(error.value).startswith("task.number_rule: unknown key; allowed: name, train_size, ")
    with pytest.raises(ConfigError) as error:
        build_task(TaskConfig(name="countdown"), seed=0)
    assert str(error.value) == (
        "task.name=countdown: its config is a TaskConfig, the task needs a CountdownConfig; "
        "choose it with task=countdown"
    )


def test_validate_names_no_task():
    source = (PACKAGE / "plan" / "validate.py").read_text()
    quoted = {name for name in task_names() if re.search(rf"[\"']{name}[\"']", source)}
    assert quoted == set()
    assert not re.search(r"(getattr|hasattr)\(", source.split("def _check_task", 1)[1].split("\ndef ", 1)[0])


def test_a_saved_config_is_typed_by_its_task_name():
    run = compose_run(["task=mix", "model=tiny_mix"])
    saved = dataclasses.asdict(run)
    assert run_config_from_dict(saved) == run
    assert isinstance(run_config_from_dict(saved).task, MixConfig)
    # Written before tasks were typed: every task's keys on every task; the unused ones are dropped.
    flat = {**saved, "task": {**saved["task"], "number_rule": "all_exactly_once", "scorer": "exact"}}
    assert run_config_from_dict(flat) == run


def test_a_mix_gives_each_family_its_own_config_and_checks_it():
    base = ["task=mix", "model=qwen2_5_0_5b", "task.max_tokens=64", "+task.families.countdown=1"]
    run = compose_run([*base, "+task.family_options.countdown.number_rule=at_most_once"])
    family = build_task(run.task, seed=0).families["countdown"].cfg  # type: ignore[attr-defined]
    assert isinstance(family, CountdownConfig) and family.number_rule == "at_most_once"
    assert family.max_tokens == 64 and family.train_size == shares(run.task.train_size, weighted(run.task))["countdown"]
    bad = {
        "+task.family_options.countdown.number_rule=some": 'task.families.countdown: task.number_rule="some": allowed:',
        "+task.family_options.countdown.scorer=exact": "task.family_options.countdown.scorer: unknown key; allowed: "
        "answer_block, max_number, number_rule, numbers",
        "+task.family_options.reversal.x=1": "task.family_options.reversal: not one of task.families",
        "+task.families.jsonl=1": "task.families.jsonl: task.data_path=None: task=jsonl needs a JSONL",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError) as error:
            compose_run([*base, override])
        assert str(error.value).startswith(message) and "\n" not in str(error.value), override


def test_a_config_must_extend_task_config():
    @dataclasses.dataclass(frozen=True)
    class Loose:
        name: str = "loose"

    with pytest.raises(TypeError, match="TaskConfig"):
        register_task("loose", config=Loose)
    assert "loose" not in task_names()


def test_an_unknown_task_is_one_line_naming_the_options():
    with pytest.raises(ConfigError) as error:
        get_task("nope")
    assert str(error.value).startswith("task.name=nope: unknown task; allowed: addition, arithmetic, ")
    assert task_config("countdown", number_rule="at_most_once") == CountdownConfig(
        name="countdown", number_rule="at_most_once"
    )


@pytest.fixture
def examples_on_path(monkeypatch):
    """examples/ importable for one test; the registry forgets what the test registered."""
    from evora.tasks import registry

    monkeypatch.syspath_prepend(str(PACKAGE.parent / "examples"))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    yield
    sys.modules.pop("mypkg.tasks", None)


def test_a_user_task_by_import_path_brings_its_registered_config(examples_on_path):
    run = compose_run(["task.name=mypkg.tasks:ReverseTask", "task.max_letters=3"])
    assert type(run.task).__name__ == "ReverseConfig" and run.task.max_letters == 3
    assert run.task.name == "mypkg.tasks:ReverseTask" and run_config_from_dict(dataclasses.asdict(run)) == run
    assert max(len(e.answer) for e in build_task(run.task, seed=0).splits().train) == 3
    with pytest.raises(ConfigError) as error:
        compose_run(["task.name=mypkg.tasks:ReverseTask", "task.max_letters=9"])
    assert str(error.value) == "task.max_letters=9: must be in 2..8"
    unregistered = compose_run(["task.name=custom_example:EvenSumsTask"])  # tests/ is on the path
    assert type(unregistered.task) is TaskConfig


PALINDROME = '''
"""task=palindrome: is the word a palindrome? (a task added in one module and one YAML)"""

from dataclasses import dataclass

from evora.config.checks import require
from evora.config.schema import TaskConfig
from evora.tasks.base import Example, split_examples
from evora.tasks.registry import register_task


@dataclass(frozen=True)
class PalindromeConfig(TaskConfig):
    min_length: int = 3


def check_palindrome(cfg):
    require(cfg.min_length >= 2, "task.min_length", cfg.min_length, "must be >= 2")


@register_task("palindrome", config=PalindromeConfig, validate=check_palindrome)
class PalindromeTask:
    reward_range = (0.0, 1.0)

    def __init__(self, cfg, seed):
        self.cfg, self.seed = cfg, seed

    def splits(self):
        words = [w for w in ("abba", "abc", "level", "noon", "evora", "kayak", "radar", "tree", "xyx", "ab")
                 if len(w) >= self.cfg.min_length]
        examples = [Example(f"{w}?", "yes" if w == w[::-1] else "no") for w in words]
        return split_examples(examples, self.cfg, self.seed, "palindrome-split")

    def reward(self, completion, example):
        return float(completion.strip() == example.answer)

    def correct(self, completion, example):
        return self.reward(completion, example) == 1.0
'''

PALINDROME_YAML = """
defaults:
  - palindrome_schema
  - _self_

name: palindrome
min_length: 4
train_size: 4
eval_size: 2
prompts_per_generation: 2
max_tokens: 4
"""

CHECK = """
import dataclasses
from evora.errors import ConfigError
from evora.plan.compose import compose_run, group_options, run_config_from_dict
from evora.tasks import build_task

assert "palindrome" in group_options("task")
run = compose_run(["task=palindrome", "task.min_length=5"])
assert type(run.task).__name__ == "PalindromeConfig" and run.task.min_length == 5
assert run_config_from_dict(dataclasses.asdict(run)) == run
task = build_task(run.task, seed=0)
heldout = task.splits().heldout
print(sorted(e.prompt for e in task.splits().train + heldout))
print(task.reward("yes", heldout[0]) + task.reward("no", heldout[0]))
for bad in (["task=palindrome", "task.min_length=1"], ["task.min_length=4"]):
    try:
        compose_run(bad)
    except ConfigError as error:
        print(error)
"""


def test_a_new_task_is_one_module_and_one_yaml(tmp_path):
    """A copy of the package with a module added to tasks/builtin and a YAML to conf/task, and no
    other file touched: the task composes, validates, builds and resumes by name."""
    files = {"tasks/builtin/palindrome.py": PALINDROME, "conf/task/palindrome.yaml": PALINDROME_YAML}
    prompts, rewards, too_short, unknown = run_in_copy(tmp_path, files, CHECK)
    assert prompts == "['evora?', 'kayak?', 'level?', 'radar?']" and rewards == "1.0"
    assert too_short == "task.min_length=1: must be >= 2"
    assert unknown.startswith("task.min_length: unknown key; allowed: name, train_size, ")
