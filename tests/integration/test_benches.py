"""Every bench of bench/ in its --smoke mode (docs/architecture.md, "Benchmarks"): the bench's own
code paths at the least size, so that a change that breaks a bench fails here, not at the next
real run of it. Each runs as a user runs it: `python bench/<name>.py --smoke`, from the
repository root, with the environment of a user's shell (not the engines' that
tests/conftest.py gives this process), writing to a temporary folder (never bench/results).
Their figures mean nothing at these sizes: what is checked is that they ran and wrote their
results."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, cli_environment, shared_head

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("benches")]

BENCH = ROOT / "bench"
# The benches' helper modules, imported by the benches (no entry point of their own).
HELPERS = {"bench_model.py", "scale_driver.py", "scale_engine.py"}


def run_bench(script: str, *args: str, timeout: int = 1800, joined: bool = False) -> subprocess.CompletedProcess:
    """`python bench/<script> --smoke <args>` from the repository root; asserts that it exited 0.
    `joined`: the bench's CLI runs join this process's shared Ray head (`RAY_ADDRESS`, as a user's
    runs join a cluster they started), each sparing a Ray start and stop of its own (3.4 CPU-s
    here). The timeout only guards against a hang: a smoke of several CLI runs took over 600 s in
    CI (the rollouts bench, beside the suite's other runs on 2 cores). A bench past it is killed
    with its whole process group (the CLI runs and local Rays it started), not left running beside
    the rest of the suite."""
    env = cli_environment(shared_head().environ if joined else None)
    command = [sys.executable, str(BENCH / script), "--smoke", *args]
    started = time.perf_counter()
    with subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    ) as bench:
        try:
            stdout, stderr = bench.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(bench.pid, signal.SIGKILL)
            stdout, stderr = bench.communicate()
            pytest.fail(f"{script} --smoke ran past {timeout} s: {stdout[-3000:]}{stderr[-6000:]}")
    print(f"{script} --smoke: {time.perf_counter() - started:.1f} s")
    result = subprocess.CompletedProcess(command, bench.returncode, stdout, stderr)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result


def read(path: Path, keys: set[str]) -> dict:
    assert path.is_file(), f"{path} not written"
    report = json.loads(path.read_text())
    assert keys <= report.keys(), sorted(keys - report.keys())
    return report


def test_every_bench_with_an_entry_point_has_a_smoke_test():
    """A new bench gets a --smoke mode and a test here (helpers listed in HELPERS)."""
    benches = {p.name for p in BENCH.glob("*.py")} - HELPERS
    tested = {name.removeprefix("test_") + ".py" for name in globals() if name.startswith("test_")}
    assert benches <= tested, f"benches without a smoke test here: {sorted(benches - tested)}"
    for name in benches:
        tree = ast.parse((BENCH / name).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), name
        assert '"--smoke"' in (BENCH / name).read_text(), f"{name} has no --smoke"


def test_throughput(tmp_path):
    """The `uneven` workload: per-request lengths through the engine protocol's generate."""
    run_bench("throughput.py", "--workload", "uneven", "--out", str(tmp_path))
    keys = {"workload", "setup", "measured", "tokens_per_second", "ratios", "round_trip"}
    report = read(tmp_path / "throughput_uneven.json", keys)
    assert report["setup"]["smoke"] and report["workload"]["name"] == "uneven"
    assert report["workload"]["population"] == 2 and report["workload"]["prompts"] == 2
    measured = report["measured"]
    assert 2 <= measured["mean_length"] <= 8  # the uneven lengths, within the smoke cap
    assert set(report["tokens_per_second"]) == {"evora", "evora_whole", "seeds_way", "base_only"}
    assert all(v > 0 for v in report["tokens_per_second"].values()), report["tokens_per_second"]
    assert 0 < measured["materialise_share_of_evaluate"] < 1
    assert 0 < measured["lora_op_share_of_evaluate"] < 1  # vLLM's CPU build runs evora's op
    assert not report["setup"]["overhead"]  # --smoke leaves the CLI run out (a minute of start-up)
    assert set(report["round_trip"]) == {"Qwen2.5-0.5B"}
    assert (tmp_path / "throughput.png").is_file()


def test_cpu_lora(tmp_path):
    out = tmp_path / "cpu_lora.json"
    run_bench("cpu_lora.py", "--out", str(out))
    report = read(out, {"setup", "rows", "worst_evora_vs_its_matmuls", "target"})
    assert len(report["rows"]) == 12  # 4 layers x 3 batch shapes
    assert all(t > 0 for row in report["rows"] for t in row["microseconds"].values())
    widths = report["widths"]  # the op against a decoder layer's base matmuls, at the smoke's widths
    assert [w["model"] for w in widths] == ["bench model", "Qwen2.5-0.5B"]
    assert all(w["evora_microseconds"] > 0 and w["base_layers_microseconds"] > 0 for w in widths)
    assert widths[0]["lora_share_of_flops"] > widths[1]["lora_share_of_flops"]  # LoRA's FLOPs fall with width


def test_eggroll(tmp_path):
    out = tmp_path / "eggroll.json"
    run_bench("eggroll.py", "--out", str(out))
    report = read(out, {"setup", "measured", "ratios", "targets"})
    assert report["measured"]["tokens_per_generation"] == 2 * 2 * 2  # candidates x prompts x tokens
    assert report["ratios"]["eggroll_vs_papers_way"] > 0


def test_eggroll_update(tmp_path):
    out = tmp_path / "eggroll_update.json"
    run_bench("eggroll_update.py", "--out", str(out))
    report = read(out, {"setup", "runs", "rows"})
    rows = report["rows"]
    assert [(r["model"], r["population"]) for r in rows] == [
        ("qwen2.5-1.5b", 2),
        ("qwen2.5-1.5b", 4),
        ("qwen2.5-7b", 2),
        ("qwen2.5-7b", 4),
    ]
    assert [r["growth_exponent"] is None for r in rows] == [True, False, True, False]


def test_hf_device(tmp_path):
    """Without CUDA, the CPU against itself: the same process, so parity is exact."""
    import torch

    out = tmp_path / "hf_device.json"
    run_bench("hf_device.py", "--out", str(out))
    report = read(out, {"setup", "accelerator", "parity_tiny_fp32", "throughput", "speedup_over_cpu"})
    assert report["setup"]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert [r["tokens"] for r in report["throughput"]][:2] == [2 * 2 * 2] * 2
    if report["setup"]["device"] == "cpu":
        parity = report["parity_tiny_fp32"]
        assert parity["greedy_completions_equal"] == parity["sampled_completions_equal"] == 1.0, parity


def test_scale(tmp_path):
    out = tmp_path / "scale.json"
    run_bench("scale.py", "--out", str(out))
    report = read(out, {"args", "results", "skipped", "growth_vs_population"})
    assert not report["skipped"], report["skipped"]  # a configuration's failure is reported there
    assert [(r["strategy"], r["population"], r["workers"]) for r in report["results"]] == [("eggroll", 8, 1)]
    for result in report["results"]:
        assert result["specs"] > 0 and result["total"] > 0 and result["generations"], result
        assert result["workers_with_cells"] == 1 and result["busy_share_min"] > 0  # its one worker had work
    assert (tmp_path / "scale_population.png").is_file()


def test_soak(tmp_path):
    run_bench("soak.py", "--out", str(tmp_path))
    report = read(tmp_path / "soak_es.json", {"generations", "warmup", "summary", "samples"})
    assert len(report["samples"]) == 3  # generations 1..3 (the last one's event comes during the finish)
    assert {"driver_rss_mb", "worker_rss_mb", "object_store_bytes", "state_bytes"} <= report["summary"].keys()
    assert report["summary"]["worker_rss_mb"]["start"] > 0  # the engine worker was found and measured
    assert (tmp_path / "soak_es.png").is_file()


def test_real_shapes(tmp_path):
    """Every strategy's steps at the smoke shape, each beside the device's limit; ES's update both
    ways (the driver redrawing the noise, the workers' sums) and on forked worker processes."""
    out = tmp_path / "real_shapes.json"
    run_bench("real_shapes.py", "--out", str(out))
    report = read(out, {"device", "threads", "limits", "args", "rows"})
    assert report["limits"]["randn_per_s"] > 0 and report["limits"]["bytes_per_s"] > 0
    steps = {(r["strategy"], r["step"]) for r in report["rows"]}
    for strategy, step in [
        ("es", "update: driver redraws (before)"),
        ("es", "update: workers' sums, summed"),
        ("es", "update: driver's part"),
        ("ga", "tell per generation"),
        ("eggroll", "update per generation"),
        ("es_full", "perturb + restore per candidate"),
        ("es_full", "per candidate, the paper's way"),
    ]:
        assert (strategy, step) in steps, (strategy, step)
    assert all(r["seconds"] > 0 and r["limit_seconds"] >= 0 for r in report["rows"]), report["rows"]
    summed = [r for r in report["rows"] if r["step"] == "update: workers' sums, summed"]
    assert all(r["wall_1_workers"] > 0 for r in summed)
    assert any(r.get("extrapolated") for r in report["rows"])  # es_full's update past the measured population


def test_reward_model_device(tmp_path):
    """task.reward=reward_model's scorer on the device (the CPU here) against the CPU: equal in fp32."""
    out = tmp_path / "reward_model_device.json"
    result = run_bench("reward_model_device.py", "--device", "cpu", "--out", str(out))
    report = read(out, {"device", "fp32_device_vs_cpu_max_abs", "bf16_vs_fp32_max_abs_over_max_reward", "per_second"})
    assert report["fp32_device_vs_cpu_max_abs"] == 0.0  # the same device: the same numbers, batched alike
    assert 0 < report["bf16_vs_fp32_max_abs_over_max_reward"] < 0.1 and len(report["per_second"]) == 3
    assert "completions scored per second" in result.stdout


def test_gpu_check(tmp_path):
    """The GPU check's own checks, on the CPU here: all pass (its goals apply on a GPU only)."""
    out = tmp_path / "gpu_check.json"
    result = run_bench("gpu_check.py", "--out", str(out))
    report = read(out, {"device", "checks", "shapes", "es_shapes"})
    names = [c["check"] for c in report["checks"]]
    assert names == [
        "noise",
        "es update",
        "eggroll update",
        "es_full update",
        "engine vs PEFT",
        "es_full in place",
        "mixture of experts",
        "memory at your model",
        "real shapes",
        "es shapes",
    ]
    assert [c["result"] for c in report["checks"]] == ["pass"] * 7 + ["skip", "pass", "pass"], report["checks"]
    assert {r["step"] for r in report["es_shapes"]} >= {"materialise per candidate", "update: workers' sums, summed"}
    assert "| check | result | detail | s |" in result.stdout  # the table to paste into a note


# The organism benches run whole CLI runs (minutes), joined to the shared head: a group of their own.
ORGANISM_GROUP = pytest.mark.xdist_group("organism")


@pytest.fixture(scope="module")
def organism_es(tmp_path_factory) -> tuple[Path, dict]:
    """organism.py's es at least sizes: (its folder, its row), for test_organism to add to and
    test_grpo_rollouts to match."""
    out = tmp_path_factory.mktemp("organism")
    run_bench("organism.py", "--strategies", "es", "--out", str(out), joined=True)
    [es] = read(out / "organism.json", {"machine", "rows"})["rows"]
    return out, es


@ORGANISM_GROUP
def test_organism(organism_es):
    """es, then sft added to its table (`--add`) and matched to the kept es run's FLOPs, at least
    sizes; the table, its plot and evora compare's files; then that table merged into another."""
    out, es_alone = organism_es
    machine = ("--machine", "the test machine")
    result = run_bench("organism.py", "--strategies", "sft", "--add", "--out", str(out), *machine, joined=True)
    report = read(out / "organism.json", {"machine", "rows"})
    assert [(r["strategy"], r["seed"]) for r in report["rows"]] == [("es", 0), ("sft", 0)]
    es, sft = report["rows"]
    assert es == es_alone  # kept, not run again
    assert abs(sft["flops"] - es["flops"]) / es["flops"] <= 0.5  # strategy.match stops at the step past es's FLOPs
    assert all(r["curve"] and r["seconds"] > 0 and 0 <= r["best_accuracy"] <= 1 for r in report["rows"])
    table = (out / "organism.md").read_text()
    assert "| es | 1 |" in table and "| sft | 1 |" in table and "the test machine" in result.stdout
    assert (out / "plots" / "organism_accuracy.png").stat().st_size > 0
    assert (out / "compare.md").is_file() and (out / "plots" / "reward_kl.png").is_file()
    run_bench("organism.py", "--merge", str(out), "--out", str(out / "merged"))  # runs nothing
    assert read(out / "merged" / "organism.json", {"rows"})["rows"] == report["rows"]
    assert (out / "merged" / "plots" / "organism_accuracy.png").is_file()


@ORGANISM_GROUP
def test_grpo_rollouts(organism_es, tmp_path):
    """GRPO's rollouts both ways, matched to a kept es run (not run again)."""
    es = organism_es[1]
    engine = ("--engine", "hf", "--workers", "1")
    result = run_bench("grpo_rollouts.py", "--es", es["run"], *engine, "--out", str(tmp_path), joined=True)
    rollouts = read(tmp_path / "grpo_rollouts.json", {"es", "grpo", "speedup"})
    assert set(rollouts["grpo"]) == {"driver", "engines"} and rollouts["es"]["run"] == es["run"]
    for mode in ("driver", "engines"):
        measured = rollouts["grpo"][mode]
        assert measured["tokens_generated"] > 0 and measured["tokens_per_second"] > 0
        assert measured["flops"] >= rollouts["es"]["flops"]  # matched: it stops at the step past es's FLOPs
    assert rollouts["speedup"] > 0 and "x transformers' generate on the driver" in result.stdout


@ORGANISM_GROUP
def test_organism_sweep(tmp_path):
    """An Optuna grid of es's sigma (2 trials at least sizes): its table from the sweep's own summary."""
    run_bench("organism_sweep.py", "--out", str(tmp_path), joined=True)
    [es] = read(tmp_path / "organism_sweep.json", {"machine", "sweeps"})["sweeps"]
    assert sorted(t["values"]["strategy.sigma"] for t in es["trials"]) == [0.05, 0.1]
    assert all(0 <= t["accuracy"] <= 1 for t in es["trials"]) and 0 < es["base"] < 1
    assert (Path(es["folder"]) / "optimization_results.yaml").is_file()  # Optuna's own result
    assert "| 0.05 |" in (tmp_path / "organism_sweep.md").read_text()


def test_separable(tmp_path):
    out = tmp_path / "separable.json"
    result = run_bench("separable.py", "--out", str(out))
    report = read(out, {"values", "threads", "es", "snes", "pgpe"})
    # 2 layers x rank 2 x (in + out) of q and o, k and v, gate, up and down
    assert report["values"] == 2 * 2 * (2 * 3072 + 2 * 1792 + 3 * 10496)
    assert all(report[s]["tell_vs_es"] > 0 and report[s]["materialise_s"] > 0 for s in ("snes", "pgpe"))
    assert "x ES's" in result.stdout
