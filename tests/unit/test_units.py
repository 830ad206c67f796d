"""Work units of a generation (engine.units) and the host LoRA cache they need."""

import dataclasses

import numpy as np
import pytest

from evora.distributed.evaluate import merged_rows, widened
from evora.distributed.units import rollout_units, search_units
from evora.distributed.worker import UnitResult
from evora.distributed.worker_spec import host_lora_slots
from evora.plan.compose import compose_run
from evora.strategies.protocol import CandidateSpec
from evora.tasks.scores import RewardCounts
from evora.training.rollouts import RolloutRequest

PROMPTS = tuple(range(100, 116))  # 16 prompts of a generation


@pytest.mark.parametrize(
    "units, workers, sizes",
    [
        ("fixed", 1, [4, 4, 2]),  # max_loras a unit, whatever the pool: bitwise across worker counts
        ("fixed", 3, [4, 4, 2]),
        ("whole", 1, [10]),  # one call per worker, its whole share
        ("whole", 3, [4, 4, 2]),
        ("whole", 4, [3, 3, 3, 1]),
        ("whole", 20, [1] * 10),
    ],
)
def test_search_units_keep_candidate_order_and_size_by_mode(units, workers, sizes):
    specs = [CandidateSpec(0, i) for i in range(10)]
    chunks = search_units(specs, PROMPTS, units, max_loras=4, workers=workers)
    assert [len(c) for c, _ in chunks] == sizes
    assert [s for c, _ in chunks for s in c] == specs
    assert all(p == PROMPTS for _, p in chunks)


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_fixed_units_cut_the_prompts_too_until_there_are_min_units_whatever_the_pool(workers):
    """The ES paper's population on a node of 8: 30 candidates in groups of 8 are 4 units, and
    with min_units=8 the 16 prompts are cut in two: 8 units, each worker of 8 with one, and the
    same units for 1 and 3 workers (bitwise across worker counts); every cell exactly once."""
    specs = [CandidateSpec(0, i) for i in range(30)]
    units = search_units(specs, PROMPTS, "fixed", max_loras=8, workers=workers, min_units=8)
    assert [(len(c), p) for c, p in units] == [(n, half) for n in (8, 8, 8, 6) for half in (PROMPTS[:8], PROMPTS[8:])]
    cells = [(s.index, p) for c, part in units for s in c for p in part]
    assert sorted(cells) == sorted((i, p) for i in range(30) for p in PROMPTS)
    # never below one prompt a unit; routed candidates (their own prompts) are not cut
    assert len(search_units(specs[:8], PROMPTS[:3], "fixed", 8, workers, min_units=8)) == 3
    routed = [CandidateSpec(0, i, prompts=(100 + i,)) for i in range(4)]
    assert search_units(routed, PROMPTS, "fixed", 8, workers, min_units=8) == [(routed, PROMPTS)]


def test_units_cut_along_prompts_give_the_generations_matrices_of_whole_rows():
    """Results of two prompt halves of the same candidates, widened to the generation's prompts
    and merged, are the result the whole rows give (every matrix, texts and counts)."""
    rng = np.random.default_rng(0)
    rows, width = [3, 4], len(PROMPTS)
    whole = UnitResult(
        indices=rows,
        rewards=rng.normal(size=(2, width)),
        correct=rng.random((2, width)) > 0.5,
        tokens=rng.integers(1, 9, size=(2, width)),
        reward=RewardCounts(calls=10, errors=1),
        timings={"materialise": 0.5, "generate": 1.0},
        worker=0,
        rss_mb=1.0,
        tokens_prompt=10,
        kl=rng.random((2, width)),
        texts=[[f"{r}-{c}" for c in range(width)] for r in rows],
    )
    halves = []
    for columns in (np.arange(8), np.arange(8, 16)):
        part = dataclasses.replace(
            whole,
            rewards=whole.rewards[:, columns],
            correct=whole.correct[:, columns],
            tokens=whole.tokens[:, columns],
            kl=whole.kl[:, columns],
            texts=[[t[c] for c in columns] for t in whole.texts],
        )
        halves.append(widened(part, columns, width))
    [merged] = merged_rows(halves)
    assert merged.evaluated is None and merged.indices == rows
    for name in ("rewards", "correct", "tokens", "kl"):
        assert np.array_equal(getattr(merged, name), getattr(whole, name)), name
    assert merged.texts == whole.texts
    assert (merged.reward.errors, merged.reward.calls, merged.tokens_prompt, merged.timings["generate"]) == (
        2,
        20,
        20,
        2.0,
    )


def test_whole_units_keep_the_whole_population_loadable_on_the_host():
    """A worker may end up with every candidate (the last one left): vLLM's host LoRA cache holds them all."""
    assert host_lora_slots(compose_run(["strategy.population=30", "engine.max_loras=8"])) == 8
    assert host_lora_slots(compose_run(["strategy.population=30", "engine.max_loras=8", "engine.units=whole"])) == 30
    assert host_lora_slots(compose_run(["strategy.population=4", "engine.max_loras=8", "engine.units=whole"])) == 8


def test_workers_start_engines_that_wrap_only_the_layouts_modules(tiny_path, tiny_shapes):
    from evora.distributed.worker_spec import worker_spec
    from evora.lora.layout import build_layout

    layout = build_layout(
        tiny_shapes, rank=4, alpha=8, target_modules=["q_proj", "o_proj"], layers=None, base_model=tiny_path
    )
    spec = worker_spec(compose_run([]), tiny_path, layout, "tag")
    assert spec.engine.lora_target_modules == ("q_proj", "o_proj")


def test_a_run_whose_units_leave_workers_idle_says_so_in_one_line():
    from evora.tracking.progress import idle_line

    assert idle_line({"units": 8, "workers": 8}) is None
    line = idle_line({"units": 4, "workers": 8})
    assert line is not None and "\n" not in line
    assert "4 idle" in line and "hardware.min_units" in line


def test_gpu_engines_capture_cuda_graphs_up_to_the_largest_call_and_cpu_engines_stay_eager():
    """engine.enforce_eager=null: CUDA graphs on GPUs, captured up to the most requests one call
    makes (vLLM's own CompilationConfig takes the setting); eager on CPUs."""
    from vllm.config import CompilationConfig

    from evora.distributed.worker_spec import engine_spec
    from evora.engines.vllm_engine import llm_args

    gpu = engine_spec(compose_run(["hardware=gpu", "task.prompts_per_generation=16"]), "model")
    assert gpu.enforce_eager is False and gpu.max_batch == 8 * 16  # max_loras x prompts: above 2 x 64 eval
    args = llm_args(gpu)
    assert args["enforce_eager"] is False
    config = CompilationConfig(**args["compilation_config"])
    assert config.max_cudagraph_capture_size == 128
    assert engine_spec(compose_run(["hardware=gpu", "engine.enforce_eager=true"]), "model").enforce_eager is True
    cpu = engine_spec(compose_run([]), "model")
    assert cpu.enforce_eager is True and "compilation_config" not in llm_args(cpu)


def test_rollout_rows_are_cut_in_row_order_into_units_of_a_fixed_size():
    """A trainer's rows in units of rows_per_unit, whatever the pool: each row keeps its own seed."""
    request = RolloutRequest(
        step=3,
        prompts=tuple((1, i) for i in range(8)),
        seeds=tuple(range(100, 108)),
        max_tokens=5,
        temperature=1.0,
        top_p=1.0,
        logprobs=True,
        rows_per_unit=3,
    )
    units = rollout_units(request)
    assert [len(u.prompts) for u in units] == [3, 3, 2] and {u.label for u in units} == {"grpo-s3"}
    assert [p for u in units for p in u.prompts] == list(request.prompts)
    assert [s.seed for u in units for s in u.sampling] == list(request.seeds)
    assert all(u.logprobs and u.max_tokens == 5 and u.sampling[0].temperature == 1.0 for u in units)
