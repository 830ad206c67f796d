"""The engine registry: every engine is declared in engines/catalog/ with a YAML; planning,
`evora doctor` and the jobs ask the registry and name no engine; a new engine is one module and
one YAML."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from package_copy import run_in_copy

import evora
from evora.engines import engine_names, get_engine
from evora.engines.registry import POOLED, RESIDENT
from evora.errors import ConfigError
from evora.plan.compose import CONF_DIR, compose_run, run_config_from_dict

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

from dataclasses import dataclass

from evora.config.schema import EngineConfig
from evora.engines.base import EngineSpec
from evora.engines.registry import RESIDENT, Support, register_engine


@dataclass(frozen=True)
class EchoConfig(EngineConfig):
    prefix: str = ""  # a key of its own


@dataclass(frozen=True)
class EchoSpec(EngineSpec):
    prefix: str = ""


class EchoEngine:
    loads_from_memory = False

    def __init__(self, spec: EchoSpec):
        self.spec = spec


def echo_support(model, device):
    return Support("echo", model.experts == 0, "no mixtures of experts")


def echo_spec(base, engine, hardware):
    return EchoSpec(**vars(base), prefix=engine.prefix)


register_engine(
    "echo",
    engine="evora.engines.catalog.echo:EchoEngine",
    summary="echoes its prompts",
    memory=RESIDENT,
    lm_eval_backend="hf",
    support=echo_support,
    config=EchoConfig,
    spec=echo_spec,
    kinds=frozenset({"population"}),
)
'''

ECHO_YAML = """
defaults:
  - echo_schema
  - _self_

name: echo
prefix: "> "
"""

CHECK = """
from evora.distributed.worker_spec import worker_spec
from evora.engines import create_engine
from evora.errors import ConfigError
from evora.plan.compose import compose_run
from evora.plan.jobs import job_plan

run = compose_run(["engine=echo", "hardware.num_workers=1"])
plan = job_plan(run, [])  # the engine's support, its package, its memory model: planned like any
spec = worker_spec(run, plan.model_path, plan.layout, "tag").engine  # as a worker gets it
engine = create_engine("echo", spec)
targets = spec.lora_target_modules == plan.layout.target_modules
print(type(engine).__name__, type(spec).__name__, repr(engine.spec.prefix), targets)
for bad in (
    ["engine=echo", "hardware=gpu", "hardware.tensor_parallel_size=2"],
    ["engine=echo", "strategy=es_full"],
    ["engine=echo", "engine.vllm_args={a: 1}"],
):
    try:
        compose_run(bad)
    except ConfigError as error:
        print(str(error).splitlines()[0])
"""


def test_a_new_engine_is_one_module_and_one_yaml(tmp_path):
    """Its own keys (composed onto its config), its own spec (built for its workers), the
    strategy kinds it runs, its support and memory model: declared in the module, and asked."""
    files = {"engines/catalog/echo.py": ECHO, "conf/engine/echo.yaml": ECHO_YAML}
    created, sharding, kind, foreign = run_in_copy(tmp_path, files, CHECK)
    assert created == "EchoEngine EchoSpec '> ' True"
    assert sharding == (
        "hardware.tensor_parallel_size=2: > 1 needs GPU engines (hardware.gpus_per_worker=1) that shard a model: "
        "engine=vllm"
    )
    assert kind == 'engine.name="echo": runs strategies of kind population; strategy=es_full is of kind full_weight'
    assert foreign.startswith("engine.vllm_args")


def test_each_engine_composes_only_its_own_keys():
    """engine=hf has no vLLM keys (they were silently unused); engine=vllm's are typed."""
    vllm = compose_run(["engine=vllm", "engine.enforce_eager=true", "+engine.vllm_args.swap_space=4"])
    assert type(vllm.engine).__name__ == "VLLMEngineConfig" and vllm.engine.vllm_args == {"swap_space": 4}
    for key in ("enforce_eager=true", "adapters_in_memory=false", "vllm_args={}"):
        with pytest.raises(ConfigError, match=f"engine.{key.split('=')[0]}"):
            compose_run(["engine=hf", f"engine.{key}"])


def test_a_saved_config_is_typed_by_its_engine_name():
    for name, config in (("vllm", "VLLMEngineConfig"), ("hf", "EngineConfig")):
        run = compose_run([f"engine={name}"])
        saved = dataclasses.asdict(run)
        assert run_config_from_dict(saved) == run and type(run_config_from_dict(saved).engine).__name__ == config
    # An engine=hf run saved before engines were typed carries vLLM's keys, unused: they are dropped.
    old = {**saved, "engine": {**saved["engine"], "enforce_eager": None, "adapters_in_memory": True, "vllm_args": {}}}
    assert run_config_from_dict(old) == run
