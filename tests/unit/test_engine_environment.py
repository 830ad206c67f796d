"""What an engine's process must have in its environment, and that library code leaves the
environment of the process it runs in alone (worker actors get theirs through Ray)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from evora.engines.base import EngineSpec
from evora.engines.environment import engine_environment, vllm_environment
from evora.engines.vllm_spec import VLLMSpec

EVORA = Path(__file__).resolve().parents[2] / "evora"


def test_a_vllm_engine_on_cpu_runs_in_its_process_unbound_with_the_runs_kv_cache_and_a_bounded_onednn_cache():
    spec = VLLMSpec(model="m", kv_cache_gib=3)
    assert vllm_environment(spec, environ={}) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_USE_V2_MODEL_RUNNER": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CPU_KVCACHE_SPACE": "3",
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128",
    }
    # A user's own engine-core process, log level or oneDNN cache is kept; the image's KV cache default is not.
    users = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024",
    }
    assert vllm_environment(spec, environ=users) == {
        **users,
        "VLLM_USE_V2_MODEL_RUNNER": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CPU_KVCACHE_SPACE": "3",
    }


def test_only_cpu_engines_get_cpu_settings_and_the_transformers_engine_needs_none():
    gpu = VLLMSpec(model="m", device="cuda")
    assert set(engine_environment("vllm", gpu)) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_LOGGING_LEVEL",
        "VLLM_USE_V2_MODEL_RUNNER",
    }
    assert engine_environment("hf", EngineSpec(model="m")) == {}


def test_vllm_picks_its_v1_model_runner_on_a_gpu_with_triton_in_evoras_environment(monkeypatch):
    """vLLM's own choice (VllmConfig.use_v2_model_runner), as on a GPU machine: Triton there and
    no feature V2 lacks. Without evora's environment it picks V2; with it, V1."""
    config = pytest.importorskip("vllm.config.vllm")
    monkeypatch.setattr(config, "HAS_TRITON", True)
    plain = SimpleNamespace(
        attention_config=SimpleNamespace(hisparse_config=None),
        watermark_config=None,
        _get_v2_model_runner_unsupported_features=lambda: [],
    )
    choose = config.VllmConfig.use_v2_model_runner.fget
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    assert choose(plain) is True
    for name, value in engine_environment("vllm", VLLMSpec(model="m", device="cuda")).items():
        monkeypatch.setenv(name, value)
    assert choose(plain) is False


WRITERS = {"os.putenv", "os.unsetenv", *(f"os.environ.{m}" for m in ("setdefault", "update", "pop", "clear"))}


def environment_writes(path: Path) -> list[int]:
    """Lines of `path` that assign to, delete from or otherwise change os.environ."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Assign, ast.Delete)):
            if any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ" for t in node.targets):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in WRITERS:
            lines.append(node.lineno)
    return lines


# Entry points set their own process's environment (doctor --run: for the engines it builds).
ENTRY_POINTS = {"cli.py", "commands/evaluate.py", "commands/doctor.py"}


def test_library_code_does_not_write_its_process_environment():
    writes = {
        str(path.relative_to(EVORA)): environment_writes(path)
        for path in sorted(EVORA.rglob("*.py"))
        if str(path.relative_to(EVORA)) not in ENTRY_POINTS
    }
    assert {name: lines for name, lines in writes.items() if lines} == {}
