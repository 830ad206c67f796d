"""hardware.noise_device: where the workers draw LoRA noise. `auto` puts it on the engines' GPU
for a strategy registered with device_noise=True, and only those: such a strategy must draw no
noise on the driver (its `tell` cannot redraw what a GPU drew), which is checked here by
recording every random op its ask and tell run; one that redraws (SNES) is seen doing so. A
payload moves to the device and back unchanged; a resume on another device class says so in one
line. (The GPU draws themselves are checked on a GPU: `evora doctor --run`'s `es update`, and
bench/gpu_check.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from evora.plan.compose import compose_run
from evora.plan.run_plan import noise_device
from evora.selfcheck.numerics import layout, zero_lora, zscored
from evora.strategies import get_strategy
from evora.strategies.es import ESConfig, EvolutionStrategy
from evora.strategies.noise_sums import summed_locally
from evora.strategies.protocol import EvalPayload, StrategyContext
from evora.strategies.randopt import RandOpt, RandOptConfig
from evora.strategies.snes import SNES, SNESConfig
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
        (["hardware=gpu", "strategy=snes"], "cpu"),  # its tell redraws the population's noise
        (["hardware=gpu", "strategy=eggroll"], "cpu"),
        (["hardware=gpu", "hardware.noise_device=host"], "cpu"),  # as runs before the switch drew
        (["hardware=gpu", "hardware.tensor_parallel_size=2"], "cpu"),  # the worker holds no GPU itself
    ],
)
def test_auto_draws_on_the_engines_gpu_only_for_strategies_that_draw_only_on_workers(overrides, where):
    assert noise_device(compose_run(overrides, validated=False)) == where


def test_only_es_and_randopt_declare_device_noise():
    from evora.strategies.registry import entries

    assert {e.name for e in entries() if e.device_noise} == {"es", "randopt"}
    assert get_strategy("es").summed  # its update's noise is summed on the workers too


def es_generation() -> tuple[EvolutionStrategy, object, list, object]:
    es = EvolutionStrategy(ESConfig(population=8, sigma=0.1, lr=0.05), SEED)
    state = es.start({k: torch.randn(v.shape) * 0.01 for k, v in zero_lora(layout([(12, 8)], rank=2)).items()})
    specs, payload = es.ask(state, 0)
    return es, state, specs, payload


def test_es_draws_no_noise_on_the_driver_and_the_workers_sums_make_its_update():
    es, state, specs, payload = es_generation()
    results, _ = zscored(8)
    sums = es.noise_sums(state, specs, results)
    total = summed_locally(es, payload, sums)  # the workers' part
    with RandomOps() as driver:
        es.ask(state, 1)
        told = es.tell_with(state, specs, results, total)
        es.center(told.state)
    assert driver.ops == []
    assert all(torch.equal(told.state.theta[k], es.tell(state, specs, results).state.theta[k]) for k in total)


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


def test_snes_redraws_its_noise_on_the_driver_so_it_is_not_device_noise():
    snes = SNES(SNESConfig(population=4), SEED)
    state = snes.initial_state(StrategyContext(SEED, layout([(12, 8)], rank=2), "check"))
    specs, _ = snes.ask(state, 0)
    with RandomOps() as driver:
        snes.tell(state, specs, zscored(4)[0])
    assert driver.ops and not get_strategy("snes").device_noise


def test_a_payload_moves_to_the_noise_device_unchanged_and_an_evaluation_payload_stays():
    es, _, specs, payload = es_generation()
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
    snes = compose_run(["hardware=gpu", "strategy=snes"], False)
    assert "LoRA noise on the CPU's streams (" in _determinism_line(snes, lora_only)
