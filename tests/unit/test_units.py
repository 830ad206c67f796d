"""Work units of a generation (engine.units) and the host LoRA cache they need."""

import pytest

from evora.distributed.evaluate import search_units
from evora.distributed.worker_spec import host_lora_slots
from evora.plan.compose import compose_run


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
    specs = list(range(10))
    chunks = search_units(specs, units, max_loras=4, workers=workers)
    assert [len(c) for c in chunks] == sizes
    assert [s for c in chunks for s in c] == specs


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
