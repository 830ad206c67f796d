"""The update rules on this node's device: the noise streams, and ES's, EGGROLL's and es_full's
updates against float64 from the same noise. Random matrices of `node.size`; no model, engine or
network."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from evora.lora.layout import AdapterLayout, ModuleSlot
from evora.lora.noise import gaussian, member_noise, noise_key, tensors_to
from evora.selfcheck.checks import Check, Finding, Node, register_check
from evora.strategies.full_weights import matrix_name
from evora.strategies.master_weights import MasterWeights
from evora.strategies.noise_sums import add_groups
from evora.strategies.protocol import StrategyContext, fitness_results

SEED = 3


def layout(sizes: list[tuple[int, int]], rank: int = 1) -> AdapterLayout:
    """Down projections of the given (out, in) sizes, one a layer."""
    slots = tuple(ModuleSlot(f"model.layers.{i}.mlp.down_proj", i, inp, out) for i, (out, inp) in enumerate(sizes))
    return AdapterLayout(slots, rank, float(rank), ("down_proj",), None, "check")


def masters(lay: AdapterLayout, device: str) -> MasterWeights:
    generator = torch.Generator().manual_seed(1)
    return MasterWeights(
        {
            matrix_name(s.name): (torch.randn(s.out_features, s.in_features, generator=generator) * 0.02).to(device)
            for s in lay.modules
        }
    )


def zscored(population: int) -> tuple[Any, np.ndarray]:
    fitness = np.random.default_rng(population).normal(size=population)
    return fitness_results(0, fitness), (fitness - fitness.mean()) / fitness.std()


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double().cpu() - b[k].double().cpu()).abs().max()) for k in a)


def zero_lora(lay: AdapterLayout) -> dict[str, torch.Tensor]:
    out = {}
    for s in lay.modules:
        out[s.a_key], out[s.b_key] = torch.zeros(lay.rank, s.in_features), torch.zeros(s.out_features, lay.rank)
    return out


def check_noise(node: Node) -> Finding:
    device, size = node.device, node.size * 4
    first, again = gaussian(11, (size, size), device), gaussian(11, (size, size), device)
    other = gaussian(noise_key(SEED, "es_full", 0, 1, "w"), (size, size), device)
    passed = torch.equal(first, again) and not torch.equal(first, other) and first.device.type == device
    start = time.perf_counter()
    for _ in range(5):
        gaussian(11, (size, size), device)
    if device == "cuda":
        torch.cuda.synchronize()
    rate = 5 * size * size / (time.perf_counter() - start)
    return Finding(passed, f"same key equal, other member differs; {rate / 1e9:.2f} G values/s")


def check_es(node: Node) -> Finding:
    """The update as a run on this device makes it (hardware.noise_device=auto: LoRA noise on the
    engines' GPU): the members' noise summed in groups where the payload is, on one worker and on
    two (groups in another order, added in group order), against float64 from the same noise."""
    from evora.strategies.es import ESConfig, EvolutionStrategy

    es = EvolutionStrategy(ESConfig(population=16, sigma=0.1, lr=0.05), SEED)
    lay = layout([(node.size, node.size // 2)], rank=8)
    theta = {k: torch.randn(v.shape) * 0.01 for k, v in zero_lora(lay).items()}
    state = es.start(theta)
    specs, payload = es.ask(state, 0)
    results, z = zscored(16)
    sums, here = es.noise_sums(state, specs, results), es.payload_to(payload, node.device)
    groups = list(range(len(sums.groups)))

    def summed(order: list[int]) -> dict[str, torch.Tensor]:
        parts = {g: tensors_to(es.group_sum(here, sums, g), "cpu") for g in order}
        return add_groups([parts[g] for g in groups])

    one, two = summed(groups), summed(groups[1::2] + groups[0::2])
    same = all(torch.equal(one[k], two[k]) for k in one)
    new = es.tell_with(state, specs, results, one).state
    expected = {}
    for k, value in theta.items():
        noise = [member_noise(SEED, 0, s.member, k, tuple(value.shape), node.device).double() for s in specs]
        step = sum(z[s.index] * s.sign * eps.cpu() for s, eps in zip(specs, noise))
        expected[k] = value.double() + 0.05 * step / (16 * 0.1)
    difference = largest_difference(new.theta, expected)
    return Finding(
        difference < 1e-5 and same,
        f"max |update - float64| {difference:.1e}, 1 and 2 workers {'bitwise equal' if same else 'DIFFER'} "
        f"(LoRA noise on {node.device})",
    )


def check_eggroll(node: Node) -> Finding:
    from evora.strategies.eggroll import EggrollConfig, EggrollStrategy

    size = node.size
    eg = EggrollStrategy(EggrollConfig(population=16, rank=2, sigma=0.01, lr=0.1), SEED)
    lay = layout([(size, size // 2), (size // 2, size)])
    state = eg.initial_state(StrategyContext(SEED, lay, "check"))
    results, _ = zscored(16)
    state = eg.tell(state, eg.ask(state, 0)[0], results).state
    update, master = eg.update_of(state, 0), masters(lay, node.device)
    before = {k: v.double().cpu() for k, v in master.tensors.items()}
    eg.apply(master, update)
    expected = {}
    for name, weight in before.items():
        module = name.rsplit(".", 1)[0]
        total = torch.zeros_like(weight)
        for m, c in enumerate(update.coefficients):
            b, a = eg.factors(0, m, module, *weight.shape)
            total += c * (b.double() @ a.double())
        expected[name] = weight + 0.1 * total / (16 * 0.01 * math.sqrt(2))
    difference = largest_difference(master.tensors, expected)
    on = next(iter(master.tensors.values())).device.type
    return Finding(difference < 1e-5 and on == node.device, f"max |update - float64| {difference:.1e}, masters on {on}")


def check_es_full(node: Node) -> Finding:
    from evora.strategies.es_full import EsFullConfig, EsFullStrategy

    size, device = node.size, node.device
    es = EsFullStrategy(EsFullConfig(population=16, sigma=0.01, lr=0.01), SEED)
    lay = layout([(size, size // 2), (size // 2, size)])
    state = es.initial_state(StrategyContext(SEED, lay, "check"))
    results, z = zscored(16)
    state = es.tell(state, es.ask(state, 0)[0], results).state
    master = masters(lay, device)
    before = {k: v.double() for k, v in master.tensors.items()}
    es.apply(master, es.update_of(state, 0))
    expected = {}
    for name, w in before.items():
        noise = [gaussian(es.noise_key(0, m, name), tuple(w.shape), device).double() for m in range(16)]
        expected[name] = w + 0.01 / 16 * sum(z[m] * eps for m, eps in enumerate(noise))
    difference = largest_difference(master.tensors, expected)
    return Finding(difference < 1e-6, f"max |update - float64| {difference:.1e} (noise drawn on {device})")


register_check(Check("noise", "a noise key's stream is the same each time it is drawn on this device", check_noise))
register_check(Check("es update", "ES's update over a LoRA, its noise summed on this device, equals float64", check_es))
register_check(Check("eggroll update", "EGGROLL's low-rank update of master copies equals float64", check_eggroll))
register_check(
    Check("es_full update", "es_full's dense update on this device equals float64 from the same noise", check_es_full)
)
