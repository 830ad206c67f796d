"""hardware.noise_device: where the workers draw LoRA noise. `auto` puts it on the engines' GPU
for a strategy registered with device_noise=True, and only those: such a strategy must draw no
noise on the driver (its `tell` cannot redraw what a GPU drew), which is checked here by
recording every random op its ask and tell run; one that redraws (the GA) is seen doing so. A
payload moves to the device and back unchanged; a resume on another device class says so in one
line. (The GPU draws themselves are checked on a GPU: `evora doctor --run`'s `es update`, and
bench/gpu_check.py.)"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from evora.plan.compose import compose_run
from evora.plan.run_plan import noise_device
from evora.selfcheck.numerics import layout, zero_lora, zscored
from evora.strategies import get_strategy
from evora.strategies.es import ESConfig, EvolutionStrategy
from evora.strategies.ga import GAConfig, GeneticAlgorithm
from evora.strategies.noise_sums import summed_locally
from evora.strategies.pgpe import PGPEConfig
from evora.strategies.protocol import EvalPayload, StrategyContext
from evora.strategies.randopt import RandOpt, RandOptConfig
from evora.strategies.snes import SNESConfig
from evora.tracking.checkpoint import device_change, noise_classes

SEED = 5


class RandomOps(TorchDispatchMode):
    """Every random op run under it, by name. A dispatch mode sees only its own thread, so the
    noise threads are off while it records (lora.noise.in_parallel then draws serially)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __enter__(self):  # type: ignore[no-untyped-def]
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        return super().__enter__()

    def __exit__(self, *exc):  # type: ignore[no-untyped-def]
        torch.set_num_threads(self.threads)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if any(word in str(func) for word in ("normal", "randn", "rand", "bernoulli")):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "overrides,where",
    [
        ([], "cpu"),  # hardware=cpu: no GPU to draw on
        (["hardware=gpu"], "cuda"),  # es: drawn only on the workers
        (["hardware=gpu", "strategy=randopt"], "cuda"),
        (["hardware=gpu", "strategy=snes"], "cuda"),
        (["hardware=gpu", "strategy=ga"], "cpu"),  # its tell rebuilds the survivors on the driver
        (["hardware=gpu", "strategy=eggroll"], "cpu"),
        (["hardware=gpu", "hardware.noise_device=host"], "cpu"),  # as runs before the switch drew
        (["hardware=gpu", "hardware.tensor_parallel_size=2"], "cpu"),  # the worker holds no GPU itself
    ],
)
def test_auto_draws_on_the_engines_gpu_only_for_strategies_that_draw_only_on_workers(overrides, where):
    assert noise_device(compose_run(overrides, validated=False)) == where


def test_the_strategies_that_draw_only_on_workers_are_the_summed_ones_and_randopt():
    from evora.strategies.registry import entries

    assert {e.name for e in entries() if e.device_noise} == {"es", "snes", "pgpe", "randopt"}
    assert {e.name for e in entries() if e.summed} == {"es", "snes", "pgpe"}


def summed_strategy(name: str) -> tuple[Any, Any]:
    """A summed strategy and its first state over a small LoRA."""
    lay = layout([(12, 8)], rank=2)
    if name == "es":
        es = EvolutionStrategy(ESConfig(population=8, sigma=0.1, lr=0.05), SEED)
        return es, es.start({k: torch.randn(v.shape) * 0.01 for k, v in zero_lora(lay).items()})
    config = {"snes": SNESConfig(population=8), "pgpe": PGPEConfig(population=8)}[name]
    strategy = get_strategy(name).build(config, SEED)
    return strategy, strategy.initial_state(StrategyContext(SEED, lay, "check"))


@pytest.mark.parametrize("name", ["es", "snes", "pgpe"])
def test_a_summed_strategy_draws_no_noise_on_the_driver_and_the_workers_sums_make_its_update(name):
    strategy, state = summed_strategy(name)
    specs, payload = strategy.ask(state, 0)
    results, _ = zscored(8)
    sums = strategy.noise_sums(state, specs, results)
    total = summed_locally(strategy, payload, sums)  # the workers' part
    with RandomOps() as driver:
        strategy.ask(state, 1)
        told = strategy.tell_with(state, specs, results, total)
        center = strategy.center(told.state)
    assert driver.ops == []
    again = strategy.center(strategy.tell(state, specs, results).state)  # tell: the same sums, summed here
    assert all(torch.equal(center[k], again[k]) for k in center)


def test_randopt_draws_no_noise_on_the_driver():
    strategy = RandOpt(RandOptConfig(population=4, top_k=2), SEED)
    with RandomOps() as init:
        state = strategy.initial_state(StrategyContext(SEED, layout([(12, 8)], rank=2), "check"))
    assert init.ops  # its first adapter's A is drawn (once, not per generation)
    specs, _ = strategy.ask(state, 0)
    results, _ = zscored(4)
    with RandomOps() as driver:
        strategy.ask(state, 0)
        strategy.tell(state, specs, replace(results, texts=[[""]] * 4))
    assert driver.ops == []


def test_the_ga_rebuilds_its_survivors_on_the_driver_so_it_is_not_device_noise():
    ga = GeneticAlgorithm(GAConfig(population=4, keep_top=1, parents=2), SEED)
    state = ga.initial_state(StrategyContext(SEED, layout([(12, 8)], rank=2), "check"))
    specs, _ = ga.ask(state, 0)
    with RandomOps() as driver:
        ga.tell(state, specs, zscored(4)[0])
    assert driver.ops and not get_strategy("ga").device_noise


def test_a_payload_moves_to_the_noise_device_unchanged_and_an_evaluation_payload_stays():
    es, state = summed_strategy("es")
    specs, payload = es.ask(state, 0)
    moved = es.payload_to(payload, "cpu")
    assert all(torch.equal(moved.theta[k], payload.theta[k]) for k in payload.theta)
    assert all(
        torch.equal(es.materialise(moved, s)[k], es.materialise(payload, s)[k]) for s in specs for k in moved.theta
    )
    evaluation = EvalPayload(payload.theta)
    assert es.payload_to(evaluation, "cpu") is evaluation


def test_a_resume_on_another_device_class_says_so_in_one_line():
    cpu = noise_classes("cpu", "cpu", "NVIDIA H200")
    h200, h100 = noise_classes("cuda", "cpu", "NVIDIA H200"), noise_classes("cuda", "cpu", "NVIDIA H100")
    assert cpu == {"lora": "cpu", "full_weights": "cpu"} and h200["lora"] == "NVIDIA H200"
    assert device_change(h200, h200) is None
    assert device_change(None, h200) is None  # a checkpoint from before evora recorded it
    line = device_change(h200, h100)
    assert line is not None and "lora noise on NVIDIA H200, now on NVIDIA H100" in line and "\n" not in line
    assert "full-weights" not in line
    assert "lora noise on cpu, now on NVIDIA H200" in (device_change(cpu, h200) or "")


def test_doctor_says_where_a_runs_lora_noise_is_drawn():
    from types import SimpleNamespace

    from evora.doctor import _determinism_line

    lora_only = SimpleNamespace(master=0)
    assert "LoRA noise on cuda (one GPU model) (" in _determinism_line(compose_run(["hardware=gpu"], False), lora_only)
    ga = compose_run(["hardware=gpu", "strategy=ga"], False)
    assert "LoRA noise on the CPU's streams (" in _determinism_line(ga, lora_only)
