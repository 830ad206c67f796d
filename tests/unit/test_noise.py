import torch

from evora.lora.noise import gaussian, member_noise, noise_key


def test_noise_is_a_pure_function_of_its_key():
    a = member_noise(7, 3, 5, "base_model.model.x.lora_A.weight", (4, 6))
    b = member_noise(7, 3, 5, "base_model.model.x.lora_A.weight", (4, 6))
    assert torch.equal(a, b)
    assert a.dtype == torch.float32


def test_every_coordinate_of_the_key_changes_the_noise():
    base = member_noise(7, 3, 5, "t", (32,))
    for other in (
        member_noise(8, 3, 5, "t", (32,)),
        member_noise(7, 4, 5, "t", (32,)),
        member_noise(7, 3, 6, "t", (32,)),
        member_noise(7, 3, 5, "u", (32,)),
    ):
        assert not torch.equal(base, other)


def test_tensors_of_equal_shape_get_independent_noise():
    # The reference code seeded every tensor alike, so equal-shaped tensors shared noise.
    q = member_noise(0, 0, 0, "model.layers.0.self_attn.q_proj.lora_B.weight", (256, 1))
    o = member_noise(0, 0, 0, "model.layers.0.self_attn.o_proj.lora_B.weight", (256, 1))
    corr = torch.corrcoef(torch.stack([q.flatten(), o.flatten()]))[0, 1]
    assert abs(float(corr)) < 0.25


def test_noise_key_golden_values():
    # Stable across processes, Python versions and machines (no hash() randomisation).
    assert noise_key(0, "noise", 0, 0, "t") == noise_key(0, "noise", 0, 0, "t")
    assert noise_key(1, "a") == 1716098707077884841
    assert torch.allclose(gaussian(12345, (3,)), torch.tensor([1.4271, -1.8701, -1.1962]), atol=1e-4)


# --- drawn in pieces and over threads: bitwise one whole draw on one thread ---------------------


import math  # noqa: E402

import pytest  # noqa: E402

from evora.lora.noise import PIECE, in_parallel, perturb_into, pieces, runs_by_cost, weighted_sum  # noqa: E402


@pytest.mark.parametrize("numel", [1, 15, 16, 17, 100, PIECE, PIECE + 7, PIECE + 16, 3 * PIECE + 1000])
def test_pieces_draw_bitwise_one_whole_draw(numel):
    spans = list(pieces(numel))
    assert spans[0][0] == 0 and spans[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    # In pieces of a multiple of 16, the last at least 16: the stream is consumed as one draw consumes it.
    assert all((stop - start) % 16 == 0 for start, stop in spans[:-1])
    assert numel < 16 or spans[-1][1] - spans[-1][0] >= 16
    base = torch.randn(numel, generator=torch.Generator().manual_seed(1))
    base[::5] = -0.0  # signed zeros: the product's sign must survive the sum as it did
    for scale in (-0.003, 0.02, 0.0):
        out = torch.empty(numel, dtype=torch.bfloat16)
        perturb_into(out, base, 99, scale)
        reference = gaussian(99, (numel,)).mul_(scale).add_(base).to(torch.bfloat16)
        assert torch.equal(out.view(torch.int16), reference.view(torch.int16)), scale


def test_weighted_sum_is_bitwise_the_member_by_member_sum():
    shape = (300, 700)  # 210,000 values: seven pieces, the last a partial one
    terms = [(noise_key("w", m), c) for m, c in enumerate([0.5, -1.25, 2.0, 0.0, 3.5])]
    reference = torch.zeros(shape)
    for key, c in terms:
        reference.add_(gaussian(key, shape), alpha=c)
    assert torch.equal(weighted_sum(terms, shape), reference)


def test_parallel_draws_are_bitwise_the_serial_ones():
    shapes = [(64, 1536), (1536, 64), (17,), (8, 8960), (3, 5)]
    keys = [noise_key("p", i) for i in range(len(shapes))]
    serial = [gaussian(k, s) for k, s in zip(keys, shapes)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        parallel = in_parallel(lambda item: gaussian(*item), list(zip(keys, shapes)))
        by_cost = in_parallel(
            lambda item: gaussian(*item), list(zip(keys, shapes)), cost=lambda item: math.prod(item[1])
        )
        sums = in_parallel(lambda s: weighted_sum([(keys[0], 1.5), (keys[1], -2.0)], s), [(300, 700)] * 3)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(serial, parallel))
    assert all(torch.equal(a, b) for a, b in zip(serial, by_cost))
    assert all(torch.equal(sums[0], s) for s in sums[1:])


def _makespan(runs: list[list[int]], costs: list[float], threads: int) -> float:
    """When the last thread finishes, each taking the next run as it comes free."""
    free = [0.0] * threads
    for run in runs:
        free[free.index(min(free))] += sum(costs[i] for i in run)
    return max(free)


def test_runs_by_cost_take_each_item_once_costliest_first_and_balance_a_layer():
    # Two decoder layers of Qwen2.5-1.5B in checkpoint order (q, k, v, o, gate, up, down), millions of values.
    layer = [2.36, 0.39, 0.39, 2.36, 13.76, 13.76, 13.76]
    costs = layer * 2
    runs = runs_by_cost(costs, 8)
    assert sorted(i for run in runs for i in run) == list(range(len(costs)))
    firsts = [max(costs[i] for i in run) for run in runs]
    assert firsts == sorted(firsts, reverse=True)
    assert all(len(run) == 1 for run in runs if costs[run[0]] >= sum(costs) / 8)
    # Within a tenth of a perfect split over 2 threads; runs of neighbours were a fifth over it.
    assert _makespan(runs, costs, 2) <= 1.1 * sum(costs) / 2
    neighbours = [[0], [1, 2], [3, 4], [5, 6], [7], [8, 9], [10, 11], [12, 13]]
    assert _makespan(neighbours, costs, 2) > 1.2 * sum(costs) / 2
    # Equal costs: runs of neighbours in order, as before costs were given.
    assert runs_by_cost([1.0] * 6, 3) == [[0, 1], [2, 3], [4, 5]]
