"""strategy=eggroll through the real CLI and Ray, on the transformers engine (full-weight runs on
vLLM, with the same weight machinery: test_es_full_run.py): 1 and 2 workers give bitwise the
same exported weights, a resumed run equals the uninterrupted one, the exported model folder
loads in transformers and in vLLM and gives the run's own greedy completions, and the delta
adapter loads in PEFT. (A killed worker: tests/integration/test_cluster.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import SMALL, cli_run, fresh_run, resume_run
from evora.lora.base_weights import read_weights
from evora.tracking.metrics import read_metrics
from evora.tracking.summary import read_summary

pytestmark = pytest.mark.slow

EGGROLL = (
    *SMALL,
    "+experiment=quickstart/eggroll",
    "strategy.snapshot_every=2",
    "engine=hf",
)  # the worker count is the point
SNES = "strategy.distribution=snes"  # a sigma per matrix, adapted by SNES's rule
OUTCOMES = ("improvements", "regressions", "both_wrong", "both_right")
MOVED = "model.layers.1.mlp.down_proj.weight"  # quickstart/eggroll: layer 1's down_proj


def exported(run_dir: Path, folder: str = "model") -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / folder / "model.safetensors"))


def assert_bitwise_equal(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.xdist_group("eggroll-run")
def test_one_worker_resumed_on_two_exports_bitwise_the_weights_of_two_workers_throughout(tiny_path):
    """Worker counts and resume in one: one worker for generations 1-2 with no weight snapshot yet
    (the resume replays the updates from the model's weights), resumed on two workers for
    generation 3, against two workers uninterrupted that snapshot every 2 generations. With
    distribution=snes, whose sigma moves every generation (chaos[eggroll] holds the paper's fixed
    sigma to the same promises)."""
    two, stdout = cli_run(*EGGROLL, "generations=3", "hardware.num_workers=2", SNES)
    part, _ = fresh_run(*EGGROLL, SNES, "strategy.snapshot_every=3", "hardware.num_workers=1", "generations=2")
    assert not list((part / "checkpoints").glob("weights_gen_*"))
    assert "resumed at generation 2" in resume_run(part, "generations=3", "hardware.num_workers=2")
    assert_bitwise_equal(exported(part), exported(two))
    for key in ("reward_mean", "sigma_mean"):
        assert [r[key] for r in read_metrics(part)[1:]] == [r[key] for r in read_metrics(two)[1:]]
    # the sigma moved from quickstart/eggroll's 0.015 (a generation whose pairs all tie keeps it)
    assert {r["sigma_mean"] for r in read_metrics(two)[1:]} - {0.015}
    original = read_weights(tiny_path, [MOVED])[MOVED]
    moved = exported(two)[MOVED]
    assert not torch.equal(moved, original)  # the run changed the selected matrix ...
    unselected = "model.layers.0.mlp.down_proj.weight"  # ... and nothing else
    assert torch.equal(exported(two)[unselected], read_weights(tiny_path, [unselected])[unselected])
    assert "49,152 weights moved" in stdout and "MiB of fp32 master copies per worker" in stdout
    snapshot = load_file(str(two / "checkpoints" / "weights_gen_2.safetensors"))
    assert snapshot[MOVED].dtype == torch.float32 and "adam_m/" + MOVED in snapshot  # Adam's moments too
    records = read_metrics(two)[1:]
    assert all(r["update_norm"] >= 0 and r["seconds_weights"] >= 0 for r in records)
    assert any(r["update_norm"] > 0 for r in records)  # (a generation whose candidates all tie moves nothing)


@pytest.mark.xdist_group("eggroll-run")
def test_the_run_summary_names_the_exports_and_the_delta_adapter_loads_in_peft(tiny_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir, _ = cli_run(*EGGROLL, "generations=3", "hardware.num_workers=2")
    summary = read_summary(run_dir)
    assert summary["strategy"] == "eggroll" and summary["center"] == "delta"
    assert {"best", "delta", "model"} <= set(summary["adapters"])
    details = summary["details"]
    assert details["delta_rank"] == 16 and 0.0 <= details["delta_relative_error"] < 1.0
    # Measured against the model's own weights, swapped in on each worker: 0 for the base itself.
    assert summary["base"]["kl"] == 0.0 and summary["best"]["kl"] >= 0.0
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(run_dir / "adapters" / "delta"))
    assert model.peft_config["default"].r == 16
    # The delta adapter is the update's truncation: on the base model it moves the matrix towards
    # the exported weights by 1 - error of the way (Frobenius).
    merged = model.merge_and_unload().state_dict()[MOVED]
    original = read_weights(tiny_path, [MOVED])[MOVED]
    target = exported(run_dir)[MOVED]
    residual = float((merged - target).norm() / (target - original).norm())
    assert residual == pytest.approx(details["delta_relative_error"], abs=1e-3)


@pytest.mark.xdist_group("eggroll-run")
def test_the_exported_model_gives_the_engines_greedy_completions_in_transformers_and_vllm():
    """The engine's own completions of the best weights on held-out (eval/best_vs_base.json)
    come back from the exported folder, loaded as a plain model by transformers and by vLLM."""
    from evora.config.schema import TaskConfig
    from evora.distributed.worker_spec import load_tokenizer
    from evora.engines import create_engine
    from evora.engines.vllm_spec import VLLMSpec
    from evora.tasks import build_task
    from evora.tasks.prompts import PromptRenderer

    run_dir, _ = cli_run(*EGGROLL, "generations=3", "hardware.num_workers=2")
    folder = run_dir / read_summary(run_dir)["adapters"].get("best_model", "model")
    report = json.loads((run_dir / "eval" / "best_vs_base.json").read_text())
    rows = sorted((r for key in OUTCOMES for r in report[key]), key=lambda r: r["index"])[:24]
    spec = VLLMSpec(model=str(folder), dtype="float32", max_model_len=256)
    task = build_task(TaskConfig(eval_size=64, selection_size=128), seed=0)  # SMALL, as the run
    renderer = PromptRenderer(load_tokenizer(spec), "auto", task.plain_template)
    heldout = task.splits().heldout
    prompts = [renderer.ids(heldout[r["index"]]) for r in rows]
    assert [heldout[r["index"]].prompt for r in rows] == [r["prompt"] for r in rows]
    for engine_name in ("hf", "vllm"):  # AutoModelForCausalLM.from_pretrained / vLLM's LLM, no adapter
        engine = create_engine(engine_name, spec)
        try:
            assert [c.text for c in engine.generate(prompts, [None] * len(prompts), 8)] == [r["adapter"] for r in rows]
        finally:
            engine.shutdown()


@pytest.fixture()
def local_ray():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False)  # a new one: never a cluster a test left behind
    yield
    ray.shutdown()


def test_workers_whose_weights_differ_stop_the_run_in_one_line(local_ray, tiny_path, tmp_path):
    """Two real workers whose updates differ (one was given another lr): their checksums
    disagree after the first update, and the sync raises one RunError naming both."""
    from dataclasses import replace

    import numpy as np
    import ray

    from evora.distributed.full_weights import EngineWeights
    from evora.distributed.pool import WorkerPool
    from evora.distributed.worker import EngineWorker
    from evora.distributed.worker_spec import worker_spec
    from evora.errors import RunError
    from evora.lora.layout import build_layout
    from evora.lora.modules import adaptable_modules
    from evora.plan.compose import compose_run
    from evora.strategies import get_strategy
    from evora.strategies.protocol import StrategyContext, fitness_results

    run = compose_run(["+experiment=quickstart/eggroll", "engine=hf", "strategy.population=4", "task.eval_size=8"])
    layout = build_layout(
        adaptable_modules(tiny_path),
        rank=1,
        alpha=1,
        target_modules=["down_proj"],
        layers=[1],
        base_model=tiny_path,
    )
    spec = worker_spec(run, tiny_path, layout, "mismatch")
    specs = [spec, replace(spec, strategy=replace(spec.strategy, lr=2 * spec.strategy.lr))]
    actors = [ray.remote(EngineWorker).options(num_cpus=1).remote(s, i) for i, s in enumerate(specs)]
    pool = WorkerPool(actors, ray.get([a.info.remote() for a in actors]))
    try:
        strategy = get_strategy("eggroll").build(run.strategy, run.seed)
        state = strategy.initial_state(StrategyContext(run.seed, layout, tiny_path))
        candidates, _ = strategy.ask(state, 0)
        state = strategy.tell(state, candidates, fitness_results(0, np.array([1.0, 0.0, 0.0, 1.0]))).state
        weights = EngineWeights(strategy, pool, tmp_path, [], "strategy.lr=...")
        weights.to(state, 0)  # the model's own weights on both: they agree
        with pytest.raises(
            RunError, match=r"generation 1: the workers' weights differ \(worker 0: \w+, worker 1: \w+\)"
        ):
            weights.to(state, 1)
    finally:
        pool.shutdown()
