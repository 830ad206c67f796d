"""`evora doctor --run`'s checks and report (evora/selfcheck): a check that cannot run is
skipped with its reason, one that raises has failed and the rest still run; an engine that
alters its tokens, registered by this test, fails "engine vs PEFT" by name, in the report and
in the exit code."""

from __future__ import annotations

import json
from dataclasses import replace

from conftest import TINY
from evora.engines import registry
from evora.engines.base import EngineSpec
from evora.engines.hf_engine import HFEngine
from evora.selfcheck.checks import FAILED, PASSED, SKIPPED, Check, Finding, Node, run_check
from evora.selfcheck.runner import IN_PROCESS, in_order, run_checks

NODE = Node("cpu", 64, 2, "hf", EngineSpec(model=str(TINY)), ("engine=hf",))


def in_process() -> list[Check]:
    """The checks that run in this process (the run through Ray is test_doctor_run.py's)."""
    return in_order(IN_PROCESS)


class TamperedEngine(HFEngine):
    """The transformers engine with the last token of every completion changed."""

    def generate(self, prompts, adapters, max_tokens, sampling=None):
        completions = super().generate(prompts, adapters, max_tokens, sampling)
        return [replace(c, token_ids=(*c.token_ids[:-1], c.token_ids[-1] + 1)) for c in completions]


def test_a_check_that_cannot_run_is_skipped_with_its_reason_and_one_that_raises_has_failed():
    def never(node: Node) -> Finding:
        raise AssertionError("a skipped check must not run")

    def breaks(node: Node) -> Finding:
        raise RuntimeError("no such kernel")

    skipped = run_check(Check("two gpus", "tensor parallel", never, skip=lambda node: "one GPU here"), NODE)
    assert (skipped.status, skipped.detail) == (SKIPPED, "one GPU here")
    failed = run_check(Check("kernel", "a kernel", breaks), NODE)
    assert (failed.status, failed.detail) == (FAILED, "RuntimeError: no such kernel")


def test_every_check_is_declared_once_in_the_reports_order():
    assert [c.name for c in in_order()] == [
        "noise",
        "es update",
        "eggroll update",
        "es_full update",
        "engine vs PEFT",
        "es_full in place",
        "mixture of experts",
        "memory at your model",
        "run through Ray",
        "tensor parallel 2",
    ]
    assert all(c.proves for c in in_order())


def test_an_engine_that_alters_its_tokens_fails_by_name_in_the_report_and_the_exit_code(tmp_path, monkeypatch, capsys):
    tampered = registry.EngineEntry(
        "tampered", f"{__name__}:TamperedEngine", "alters its tokens", registry.RESIDENT, "hf"
    )
    monkeypatch.setitem(registry._REGISTRY, "tampered", tampered)  # registered for this test only
    code = run_checks(replace(NODE, engine="tampered"), ["engine=tampered"], tmp_path, in_process())
    assert code == 1
    report = json.loads((tmp_path / "doctor-report.json").read_text())
    status = {c["name"]: c["status"] for c in report["checks"]}
    altered = ("engine vs PEFT", "mixture of experts")  # the second is the first on a tiny MoE
    assert [status.pop(name) for name in altered] == [FAILED, FAILED], report["checks"]
    assert status.pop("memory at your model") == SKIPPED and set(status.values()) == {PASSED}, report["checks"]
    failed = {c["name"]: c for c in report["checks"] if c["status"] == FAILED}["engine vs PEFT"]
    assert failed["detail"].startswith("0/8 completions token for token") and "engine=tampered" in failed["fix"]
    assert report["command"] == "evora doctor --run engine=tampered" and report["environment"]["packages"]["torch"]
    markdown = (tmp_path / "doctor-report.md").read_text()
    assert "| engine vs PEFT | failed | 0/8 completions" in markdown and "max \\|update - float64\\|" in markdown
    assert "verdict      2 failed: engine vs PEFT, mixture of experts" in capsys.readouterr().out


def test_the_bundled_model_passes_every_check_on_the_transformers_engine(tmp_path):
    assert run_checks(NODE, ["engine=hf"], tmp_path, in_process()) == 0
    report = json.loads((tmp_path / "doctor-report.json").read_text())
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status.pop("memory at your model") == SKIPPED and set(status.values()) == {PASSED}
