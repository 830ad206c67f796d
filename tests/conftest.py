"""Shared fixtures. Tests never download: the tiny model is bundled with evora."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from shared_ray import HeadDidNotStart, SharedHead

from evora.engines.environment import vllm_environment
from evora.engines.vllm_spec import VLLMSpec

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "evora" / "models" / "tiny"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

# What worker actors get through Ray's runtime_env: engines the tests start in their own process.
ENGINE_ENVIRONMENT = vllm_environment(VLLMSpec(model=str(TINY)))


def pytest_configure(config):
    """Only in pytest's processes, not in Ray workers that import this module to unpickle a test's
    class; the CLI runs (run_evora) get none of it from here, as from a user's shell."""
    os.environ.update(ENGINE_ENVIRONMENT)


UNGROUPED = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook, which appends "@<group>" to node ids
def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup` (`make test`), tests marked xdist_group must reach the scheduler
    with their group in the node id; when they do not (pytest-dev/pytest-xdist#1386), groups
    silently split over the workers and each repeats the shared runs: such tests error instead."""
    if not getattr(config.option, "loadgroup", False):  # set in xdist workers under loadgroup
        return
    for item in items:
        marks = item.iter_markers("xdist_group")
        groups = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks}
        if groups and not item.nodeid.endswith("@" + "_".join(sorted(groups))):
            item.stash[UNGROUPED] = (
                "pytest-xdist did not put the test's xdist_group in its node id, so --dist loadgroup "
                "does not group tests with this pytest/pytest-xdist pair (pytest-dev/pytest-xdist#1386); "
                "see the pytest pin in pyproject.toml"
            )


def pytest_runtest_setup(item):
    if UNGROUPED in item.stash:
        pytest.fail(item.stash[UNGROUPED], pytrace=False)


@pytest.fixture(scope="session")
def tiny_path() -> str:
    return str(TINY)


@pytest.fixture(scope="session")
def tiny_shapes(tiny_path):
    from evora.lora.modules import adaptable_modules

    return adaptable_modules(tiny_path)


@functools.lru_cache(maxsize=None)
def family_path(family: str) -> str:
    """A tiny random-weight model of a real architecture (evora.models.build_family), built once
    per process."""
    from evora.models.build_family import build_family

    return str(build_family(family, tempfile.mkdtemp(prefix=f"evora-{family}-")))


def free_port() -> int:
    """A port free now on loopback, for a server that several test processes might otherwise all
    want (Ray's dashboard on 8265, a head's 6379)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def started(server: subprocess.Popen, log: list[str], limit_s: float = 600) -> bool:
    """Whether the server finished starting (uvicorn's line) within `limit_s`; its output goes to
    `log` meanwhile, read by a thread so that the pipe never fills."""
    up = threading.Event()

    def read() -> None:
        for line in server.stdout:  # type: ignore[union-attr]  # stdout=PIPE
            log.append(line)
            if "Application startup complete" in line:
                up.set()

    threading.Thread(target=read, daemon=True).start()
    return up.wait(limit_s)


def evora_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "evora", *args]


@functools.lru_cache(maxsize=1)
def shared_head() -> SharedHead:
    """This test process's Ray head, started at its first run (shared_ray.py). A head that did not
    start is started once more, on another port: Ray's raylet must register within a fixed 30 s,
    which a starved 2-core machine can miss as the suite starts (a suite's first test failed here on
    a head that did not start; its log was lost, which HeadDidNotStart now keeps)."""
    try:
        return SharedHead(cli_environment(), free_port())
    except HeadDidNotStart as failed:
        print(f"{failed}\nstarting another", file=sys.stderr)
        return SharedHead(cli_environment(), free_port())


def cli_environment(env: dict | None = None) -> dict[str, str]:
    """A CLI's environment as from a user's shell: none of what the tests' own engines need."""
    return {**{k: v for k, v in os.environ.items() if k not in ENGINE_ENVIRONMENT}, **(env or {})}


def run_evora(args: list[str], cwd: Path, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess. A run joins this process's shared Ray head; one given an
    environment of its own (a test about Ray's own start, folders or environment) starts its own
    local Ray, as a plain `evora` does."""
    if args[:1] not in (["analyze"], ["runs"], ["compare"], ["doctor"]):  # a run: Ray, config overrides
        command = args[:1] if args[:1] in (["eval"], ["-m"]) else []  # a subcommand or -m comes first
        args = [*command, "tracking.progress=false", *args[len(command) :]]
        env = env if env is not None else shared_head().environ
    full_env = cli_environment(env)
    return subprocess.run(evora_cmd(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)


def only_run_dir(out_dir: Path) -> Path:
    runs = [p for p in out_dir.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


# A small, fast variant of the quickstart: 8 candidates in units of 4, so two workers share work.
SMALL = [
    "strategy.population=8",
    "engine.max_loras=4",
    "task.prompts_per_generation=16",
    "task.eval_size=64",
    "eval_every=2",
]
# strategy=merge needs adapters to merge (two of the bundled tiny ones) and a rank that holds them.
MERGE_SOURCES = ("strategy.adapters=[evora:tiny_adapters/evolved,evora:tiny_adapters/noise]", "lora.rank=8")
# The es-run group's run (test_cli, test_benchmarks, test_serve share it): the quickstart's ES, small,
# on two workers.
ES_RUN = ("+experiment=quickstart/es", *SMALL, "generations=3", "hardware.num_workers=2")


def fresh_run(*args: str) -> tuple[Path, str]:
    """Run evora in a folder of its own; returns (run folder, stdout)."""
    out = Path(tempfile.mkdtemp(prefix="evora-test-"))
    result = run_evora([f"tracking.out_dir={out}", *args], cwd=out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return only_run_dir(out), result.stdout


@functools.lru_cache(maxsize=None)
def cli_run(*args: str) -> tuple[Path, str]:
    """`fresh_run` once per distinct argument list.

    The cache is per process: under pytest-xdist (`make test`), tests that share a run carry
    the same @pytest.mark.xdist_group so that they land in one worker and the run is made once.
    """
    return fresh_run(*args)


def resume_run(run_dir: Path, *overrides: str) -> str:
    """`evora resume=<run_dir>` with `overrides`, from the folder the run went to; its stdout."""
    result = run_evora([f"resume={run_dir}", *overrides], cwd=run_dir.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout


def make_summary(
    base: float,
    best: float,
    final: float | None = None,
    *,
    strategy: str = "es",
    generations: int = 6,
    best_generation: int | None = 3,
    best_member: str | None = None,
    details: dict | None = None,
    flops: float = 1e9,
) -> dict:
    """An eval/summary.json in the one schema (validated), for hand-built run folders."""
    from evora.tracking.summary import validate_summary

    def heldout(reward):
        return {"reward": reward, "accuracy": reward, "tokens": 4.0, "fitness": reward}

    spend = {
        "tokens_prompt": 100,
        "tokens_generated": 50,
        "tokens_scored": 0,
        "tokens_trained": 0,
        "flops_inference": flops,
        "flops_training": 0.0,
        "flops": flops,
    }
    summary = {
        "schema_version": 1,
        "strategy": strategy,
        "generations": generations,
        "center": "mean" if final is not None else None,
        "base": heldout(base),
        "final": heldout(final) if final is not None else None,
        "best": heldout(best),
        "best_generation": best_generation,
        "best_member": best_member,
        "best_chosen_on": "heldout",
        "best_vs_base": {"improvements": 3, "regressions": 0, "both_wrong": 1, "both_right": 4},
        "adapters": {"best": "adapters/best"},
        "compute": {
            "parameters": 1000,
            "search": spend,
            "evaluation": spend,
            "seconds": {"setup": 1.0, "search": 2.0, "evaluation": 1.0, "total": 4.0},
        },
        "details": details or {},
    }
    validate_summary(summary)
    return summary
