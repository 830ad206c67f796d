"""The engine registry: every engine is declared in engines/catalog/ with a YAML; planning,
`evora doctor` and the jobs ask the registry and name no engine; a new engine is one module and
one YAML."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml
from package_copy import run_in_copy

import evora
from evora.engines import engine_names, get_engine
from evora.engines.registry import POOLED, RESIDENT
from evora.plan.compose import CONF_DIR, compose_run

PACKAGE = Path(evora.__file__).resolve().parent
CATALOG = PACKAGE / "engines" / "catalog"


def test_every_catalog_module_declares_an_engine_with_a_yaml():
    modules = {p.stem for p in CATALOG.glob("*.py")} - {"__init__"}
    assert set(engine_names()) == modules == {p.stem for p in (CONF_DIR / "engine").glob("*.yaml")}
    for name in engine_names():
        entry = get_engine(name)
        module, _, cls = entry.engine.partition(":")
        assert importlib.util.find_spec(module) is not None and cls, name  # found, not imported (vLLM is heavy)
        assert yaml.safe_load((CONF_DIR / "engine" / f"{name}.yaml").read_text())["name"] == name
        assert compose_run([f"engine={name}"], validated=False).engine.name == name
    assert get_engine("vllm").memory is POOLED and get_engine("vllm").tensor_parallel
    assert get_engine("hf").memory is RESIDENT and get_engine("hf").package is None


def test_no_module_outside_the_catalog_asks_which_engine_it_is():
    """A comparison of an engine's name, or one written as a string where its entry would
    answer, is a branch the registry should own."""
    branch = re.compile(r"engine(_name|\.name)\s*[!=]=|[\"'](vllm|hf)[\"']\s*(:|in)\s")
    sources = [
        p for p in PACKAGE.rglob("*.py") if not p.is_relative_to(PACKAGE / "engines") and "__pycache__" not in p.parts
    ]
    found = [
        f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for p in sorted(sources)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if branch.search(line)
    ]
    assert found == []


ECHO = '''
"""engine=echo: answers every prompt with itself (an engine added in one module and one YAML)."""

from evora.engines.registry import RESIDENT, Support, register_engine


class EchoEngine:
    loads_from_memory = False

    def __init__(self, spec):
        self.spec = spec


def echo_support(model, device):
    return Support("echo", model.experts == 0, "no mixtures of experts")


register_engine(
    "echo",
    engine="evora.engines.catalog.echo:EchoEngine",
    summary="echoes its prompts",
    memory=RESIDENT,
    lm_eval_backend="hf",
    support=echo_support,
)
'''

ECHO_YAML = """
defaults:
  - schema
  - _self_

name: echo
"""

CHECK = """
from evora.engines import EngineSpec, create_engine
from evora.errors import ConfigError
from evora.plan.compose import compose_run
from evora.plan.jobs import job_plan

run = compose_run(["engine=echo", "hardware.num_workers=1"])
plan = job_plan(run, [])  # the engine's support, its package, its memory model: planned like any
print(type(create_engine("echo", EngineSpec(model=plan.model_path))).__name__, plan.layout.rank)
try:
    compose_run(["engine=echo", "hardware=gpu", "hardware.tensor_parallel_size=2"])
except ConfigError as error:
    print(error)
"""


def test_a_new_engine_is_one_module_and_one_yaml(tmp_path):
    files = {"engines/catalog/echo.py": ECHO, "conf/engine/echo.yaml": ECHO_YAML}
    created, sharding = run_in_copy(tmp_path, files, CHECK)
    assert created == "EchoEngine 1"
    assert sharding == (
        "hardware.tensor_parallel_size=2: > 1 needs GPU engines (hardware.gpus_per_worker=1) that shard a model: "
        "engine=vllm"
    )
