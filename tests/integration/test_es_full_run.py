"""strategy=es_full (the ES paper's full-rank algorithm) through the real CLI, Ray and vLLM:
1 and 2 workers give bitwise the same exported weights, a resumed run equals the
uninterrupted one, the exported model folder loads in transformers and in vLLM and gives the
engine's own greedy completions, and the delta adapter loads in PEFT. A real worker, in this
process, evaluates candidates on its engine's own weights and restores them bitwise after
each one. (A killed worker: tests/integration/test_cluster.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import SMALL, cli_run, fresh_run, resume_run
from evora.lora.base_weights import read_weights
from evora.tracking.metrics import read_metrics
from evora.tracking.summary import read_summary

pytestmark = pytest.mark.slow

# quickstart/es_full: layer 1's down_proj. Steps larger than the tuned ones, so that 4
# generations move the held-out reward (the best is then a moved model, not generation 0's).
# snapshot_every=3: the 4-generation run writes a snapshot at generation 3, and its first 2
# generations (the resume test's first part) none.
ES_FULL = (
    *SMALL,
    "+experiment=quickstart/es_full",
    "strategy.sigma=0.04",
    "strategy.lr=0.02",
    "strategy.snapshot_every=3",
)
TWO = (*ES_FULL, "generations=4", "hardware.num_workers=2")  # shared: 2 workers, uninterrupted
OUTCOMES = ("improvements", "regressions", "both_wrong", "both_right")
MOVED = "model.layers.1.mlp.down_proj.weight"
UNSELECTED = "model.layers.0.mlp.down_proj.weight"


def exported(run_dir: Path, folder: str = "model") -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / folder / "model.safetensors"))


def assert_bitwise_equal(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def rewards(run_dir: Path) -> list[float]:
    return [r["reward_mean"] for r in read_metrics(run_dir)[1:]]


@pytest.mark.xdist_group("es-full-run")
def test_one_worker_resumed_on_two_exports_bitwise_the_weights_of_two_workers_throughout(tiny_path):
    """Worker counts and resume in one: one worker for generations 1-2 (no weight snapshot yet: the
    resume replays the updates from the model's weights), resumed on two workers for generations
    3-4, against two workers uninterrupted."""
    two, stdout = cli_run(*TWO)
    part, _ = fresh_run(*ES_FULL, "hardware.num_workers=1", "generations=2")
    assert not list((part / "checkpoints").glob("weights_gen_*"))
    assert "resumed at generation 2" in resume_run(part, "generations=4", "hardware.num_workers=2")
    assert_bitwise_equal(exported(part), exported(two))
    assert rewards(part) == rewards(two) and len(rewards(two)) == 4
    snapshot = "checkpoints/weights_gen_3.safetensors"  # written after the resume, from replayed weights
    assert_bitwise_equal(load_file(str(part / snapshot)), load_file(str(two / snapshot)))
    original = read_weights(tiny_path, [MOVED, UNSELECTED])
    assert not torch.equal(exported(two)[MOVED], original[MOVED])  # the run changed the selected matrix ...
    assert torch.equal(exported(two)[UNSELECTED], original[UNSELECTED])  # ... and nothing else
    assert "49,152 weights moved" in stdout and "MiB of fp32 master copies per worker" in stdout  # 128 x 384
    snapshot = load_file(str(two / "checkpoints" / "weights_gen_3.safetensors"))
    assert list(snapshot) == [MOVED] and snapshot[MOVED].dtype == torch.float32  # no optimizer moments
    records = read_metrics(two)[1:]
    assert all(r["update_norm"] >= 0 and r["seconds_weights"] >= 0 for r in records)
    assert any(r["update_norm"] > 0 for r in records)  # (a generation whose candidates all tie moves nothing)


@pytest.mark.xdist_group("es-full-run")
def test_the_run_summary_names_the_exports_and_the_delta_adapter_loads_in_peft(tiny_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir, _ = cli_run(*TWO)
    summary = read_summary(run_dir)
    assert summary["strategy"] == "es_full" and summary["center"] == "delta"
    assert {"best", "delta", "model"} <= set(summary["adapters"])
    assert summary["adapters"]["model"] == "model" and (run_dir / "model" / "model.safetensors").is_file()
    details = summary["details"]
    assert details["delta_rank"] == 16 and 0.0 <= details["delta_relative_error"] < 1.0
    # Measured against the model's own weights, swapped in on each worker: 0 for the base itself,
    # more for weights that moved.
    assert summary["base"]["kl"] == 0.0 and summary["best"]["kl"] > 0.0
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


@pytest.mark.xdist_group("es-full-run")
def test_the_exported_model_gives_the_engines_greedy_completions_in_transformers_and_vllm():
    """The engine's own completions of the best weights on held-out (eval/best_vs_base.json)
    come back from the exported folder, loaded as a plain model by transformers and by vLLM."""
    from evora.config.schema import TaskConfig
    from evora.distributed.worker_spec import load_tokenizer
    from evora.engines import create_engine
    from evora.engines.vllm_spec import VLLMSpec
    from evora.tasks import build_task
    from evora.tasks.prompts import PromptRenderer

    run_dir, _ = cli_run(*TWO)
    summary = read_summary(run_dir)
    assert summary["best_generation"] > 0  # the best weights moved: not the base model's completions
    folder = run_dir / summary["adapters"].get("best_model", "model")
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


# --- one worker, in this process (no Ray) ------------------------------------------------------


@pytest.mark.parametrize("engine_name", ["hf", "vllm"])
def test_a_worker_evaluates_each_candidate_on_its_own_weights_and_restores_them_bitwise(tiny_path, engine_name):
    """A unit of perturbed candidates with the engine's own weights (BASE) between them: each
    candidate's generate call runs on exactly master + sign sigma eps (cast to the engine's
    dtype: the weights the engine sets from seeds are bitwise those `perturbed` builds in fp32),
    each BASE call and the end of the unit on exactly the master copies again; the
    perturbation changes completions, and the same unit evaluated again gives the same rewards."""
    from evora.distributed.worker import EngineWorker, WorkUnit
    from evora.distributed.worker_spec import worker_spec
    from evora.plan.compose import compose_run
    from evora.plan.run_plan import build_plan
    from evora.strategies.protocol import BASE, CandidateSpec, StrategyContext

    # sigma 0.05 (~ the weights' std, 0.058): large enough that candidates' greedy completions change.
    run = compose_run(
        [
            "+experiment=quickstart/es_full",
            f"engine={engine_name}",
            "strategy.sigma=0.05",
            "task.eval_size=12",
            "task.max_tokens=6",
        ]
    )
    plan = build_plan(run)  # the driver's layout: the selected matrices at the perturbation rank
    worker = EngineWorker(worker_spec(run, plan.model_path, plan.layout, f"pytest-es-full-{engine_name}"), 0)
    try:
        assert worker.sync_weights(None, 0, [])["generation"] == 0  # the model's own weights: the first sync
        master, strategy, names = worker.master, worker.strategy, sorted(worker.master.tensors)
        assert names == [MOVED]
        dtype = worker.engine.base_weights(names)[MOVED].dtype

        def cast(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {k: v.to(dtype) for k, v in tensors.items()}

        def engine_holds(tensors: dict[str, torch.Tensor]) -> bool:
            held = worker.engine.base_weights(names)
            return all(torch.equal(held[k], v) for k, v in cast(tensors).items())

        assert engine_holds(master.tensors)
        original = {k: v.clone() for k, v in master.tensors.items()}
        state = strategy.initial_state(StrategyContext(run.seed, plan.layout, plan.model_path))
        candidates, payload = strategy.ask(state, 0)
        specs = (
            candidates[0],
            CandidateSpec(0, 1, op=BASE),  # the engine's own weights, between two candidates
            CandidateSpec(0, 2, member=1, sign=-1),
            CandidateSpec(0, 3, op=BASE),
            candidates[3],
            candidates[4],  # right after another candidate: set over its weights, no restore between
        )
        prompts = tuple(range(12))
        own = worker.evaluate(payload, WorkUnit((CandidateSpec(0, 1, op=BASE),), "heldout", prompts, keep_texts=True))
        # What the engine holds when each spec's generate call starts (a wrapper around the real engine).
        seen: list[tuple[bool, bool]] = []
        generate = worker.engine.generate

        def recording_generate(*args, **kwargs):
            spec = specs[len(seen)]
            expected = master.tensors if spec.op == BASE else strategy.perturbed(master, payload, spec)
            seen.append((engine_holds(expected), engine_holds(master.tensors)))
            return generate(*args, **kwargs)

        worker.engine.generate = recording_generate
        unit = WorkUnit(specs, "heldout", prompts, keep_texts=True)
        first = worker.evaluate(payload, unit)
        assert seen == [(True, False), (True, True), (True, False), (True, True), (True, False), (True, False)]
        assert engine_holds(master.tensors)  # after the last candidate too
        assert all(torch.equal(master.tensors[k], original[k]) for k in names)  # the master copies untouched
        texts = first.texts
        assert any(texts[row] != texts[1] for row in (0, 2, 4, 5))  # the perturbations changed completions
        assert texts[1] == texts[3] == own.texts[0]  # restored, the engine gives its own completions again
        seen.clear()
        again = worker.evaluate(payload, unit)
        assert np.array_equal(first.rewards, again.rewards) and again.texts == texts
        assert engine_holds(master.tensors)
        # The KL to the model's own weights, measured while each candidate's weights are set: 0 for
        # the engine's own (the model's, at generation 0), more for a perturbed candidate.
        worker.engine.generate = generate
        measured = worker.evaluate(payload, WorkUnit(specs, "heldout", prompts, kl=True)).kl
        assert measured[1].tolist() == measured[3].tolist() == [0.0] * len(prompts)
        assert all(measured[row].mean() > 0 for row in (0, 2, 4, 5))
        assert engine_holds(master.tensors)
    finally:
        worker.shutdown()
