"""strategy=ecology without an engine: the economy's exact conservation, routing, the merge
against a dense SVD, births/merges/retirements, conditions, checkpoint round trips, and the
rules checked before Ray."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from evora.distributed.cells import evaluated_cells, scatter, text_rows
from evora.distributed.evaluate import row_means
from evora.distributed.portfolio import metrics_of, routed_rows, routing_map
from evora.errors import ConfigError
from evora.lora.layout import build_layout
from evora.plan.compose import compose_run
from evora.strategies.ecology import Ecology, EcologyConfig, EcologyState
from evora.strategies.ecology.economy import MICRO, Organelle
from evora.strategies.ecology.merge import merge_adapters
from evora.strategies.ecology.routing import route
from evora.strategies.ecology.strategy import PROBE, SERVE, total_energy
from evora.strategies.protocol import GenerationResults, StrategyContext, state_fields
from evora.tasks.base import Example

SHAPES = {f"model.layers.{layer}.mlp.down_proj": (8, 12) for layer in range(2)}
FAMILIES = ["a", "b", "c"]


def layout(rank=1):
    return build_layout(SHAPES, rank=rank, alpha=rank, target_modules=["down_proj"], layers=None, base_model="toy")


def context(train=60, per_generation=12, rank=1):
    families = tuple(FAMILIES[i % 3] for i in range(train))
    return StrategyContext(0, layout(rank), "toy", train_families=families, prompts_per_generation=per_generation)


def synthetic_results(eco, state, specs, payload, generation):
    """Rewards that depend on the adapter (so learning and selection matter) and on the
    family (family "a" pays, the others less); token counts vary with the example."""
    columns = sorted({p for s in specs for p in s.prompts})
    shape = (len(specs), len(columns))
    rewards, tokens, mask = np.zeros(shape), np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=bool)
    for spec in specs:
        adapter = eco.materialise(payload, spec)
        level = float(torch.sigmoid(sum(v.sum() for v in adapter.values())))
        for p in spec.prompts:
            j = columns.index(p)
            family = state.train_families[p]
            rewards[spec.index, j] = round(level * {"a": 1.0, "b": 0.4, "c": 0.1}[family], 3)
            tokens[spec.index, j] = 1 + (p * 7 + generation) % 9
            mask[spec.index, j] = True
    fitness = row_means(rewards, mask)
    return GenerationResults(generation, tuple(columns), rewards, rewards > 0.5, tokens, None, fitness, mask)


def run(cfg, generations=20, ctx=None):
    eco = Ecology(cfg, run_seed=0)
    state = eco.initial_state(ctx or context())
    told_all = []
    for generation in range(generations):
        specs, payload = eco.ask(state, generation)
        told = eco.tell(state, specs, synthetic_results(eco, state, specs, payload, generation))
        told_all.append(told)
        state = told.state
    return eco, state, told_all


FULL = EcologyConfig(window=3, uplift_threshold=0.1, upkeep=0.3, max_population=6)


def test_energy_is_conserved_exactly_and_every_event_happens():
    eco, state, told = run(FULL, generations=25)
    start = eco.initial_state(context())
    assert total_energy(start) == state.initial_energy == FULL.organelles * round(FULL.initial_energy * MICRO)
    change = total_energy(state) - state.initial_energy
    assert change == state.earned - state.spent - state.retired_energy  # integers: exact
    assert state.births >= 1 and state.merges >= 1 and state.retirements >= 1
    # the records tell the same story: episodes' ROI and the upkeep add up to the energy change
    episode_roi = sum(round(e["roi"] * MICRO) for t in told for e in t.records["episodes.jsonl"])
    assert episode_roi == state.earned - (state.spent - state.upkeep_paid)
    retired = [e for t in told for e in t.records["organelles.jsonl"] if e["event"] == "retire"]
    assert len(retired) == state.retirements
    assert sum(round(e["energy"] * MICRO) for e in retired) == state.retired_energy


def test_a_merge_is_the_best_rank_r_approximation_of_the_averaged_update():
    for rank in (1, 2, 3):
        g = torch.Generator().manual_seed(rank)
        first = {k: torch.randn(s, generator=g) for k, s in layout(rank).shapes().items()}
        second = {k: torch.randn(s, generator=g) for k, s in layout(rank).shapes().items()}
        merged = merge_adapters(first, second)
        assert list(merged) == list(first)
        for a_key in [k for k in first if "lora_A" in k]:
            b_key = a_key.replace("lora_A", "lora_B")
            dense = (
                first[b_key].double() @ first[a_key].double() + second[b_key].double() @ second[a_key].double()
            ) / 2
            u, s, vh = torch.linalg.svd(dense, full_matrices=False)
            best = (u[:, :rank] * s[:rank]) @ vh[:rank]
            got = merged[b_key].double() @ merged[a_key].double()
            assert merged[a_key].shape == first[a_key].shape and merged[b_key].shape == first[b_key].shape
            assert float(torch.linalg.norm(dense - best)) > 1e-3  # the average is not rank r already
            assert float(torch.linalg.norm(got - best)) <= 1e-4 * float(torch.linalg.norm(best))


def test_ucb_tries_every_organelle_before_repeating_and_prefers_the_better():
    organelles = [Organelle(f"o{i}", {}, 0, 0) for i in range(3)]
    picks = route(organelles, ["a"] * 3, "ucb", 0.5, np.random.default_rng(0))
    assert sorted(picks) == [0, 1, 2]
    organelles[1].families["a"] = [10, 9.0, 9.0, 1.0]  # o1 earned 0.9 per episode on "a"
    organelles[0].families["a"] = [10, -1.0, 0.0, 1.0]
    organelles[2].families["a"] = [10, 0.0, 0.1, 1.0]
    picks = route(organelles, ["a"] * 6, "ucb", 0.1, np.random.default_rng(0))
    assert picks.count(1) == 6
    thompson = [route(organelles, ["a"] * 6, "thompson", 0.5, np.random.default_rng(s)) for s in (1, 1, 2)]
    assert thompson[0] == thompson[1]  # a pure function of its generator


def scalar_route(organelles, families, router, exploration, rng):
    """The bandit one organelle at a time, in Python floats: the reference `route` must equal."""
    visits, picks = {}, []
    for family in families:
        if family not in visits:
            stats = [o.families.get(family, [0, 0.0, 0.0, 0.0]) for o in organelles]
            visits[family] = ([int(s[0]) for s in stats], [float(s[1]) for s in stats])
        counts, rois = visits[family]
        if router == "ucb":
            total = sum(counts)
            score = [
                math.inf if n == 0 else r / n + exploration * math.sqrt(math.log(max(total, 1)) / n)
                for n, r in zip(counts, rois)
            ]
        else:
            score = [
                float(rng.normal(r / n if n else 0.0, exploration / math.sqrt(1 + n))) for n, r in zip(counts, rois)
            ]
        pick = max(range(len(organelles)), key=lambda i: (score[i], -i))
        counts[pick] += 1
        rois[pick] += rois[pick] / max(counts[pick] - 1, 1) if counts[pick] > 1 else 0.0
        picks.append(pick)
    return picks


@pytest.mark.parametrize("router", ["ucb", "thompson"])
def test_the_routers_whole_array_scores_pick_what_one_at_a_time_scores_pick(router):
    rng = np.random.default_rng(3)
    organelles = [Organelle(f"o{i}", {}, 0, 0) for i in range(60)]
    for organelle in organelles[:45]:  # a quarter untried; ties among the tried (whole ROIs)
        organelle.families = {
            f: [int(n), float(rng.integers(-3, 4)) * n, 0.0, 0.0] for f in FAMILIES for n in [rng.integers(1, 6)]
        }
    episodes = [FAMILIES[int(i)] for i in rng.integers(0, 3, 200)]
    picks = route(organelles, episodes, router, 0.3, np.random.default_rng(7))
    assert picks == scalar_route(organelles, episodes, router, 0.3, np.random.default_rng(7))
    assert len(set(picks)) > 10  # many organelles chosen: the scores really decide


def test_routed_specs_partition_the_generation_episodes():
    eco = Ecology(FULL, run_seed=0)
    state = eco.initial_state(context())
    specs, _ = eco.ask(state, 0)
    served = [p for s in specs if s.op == SERVE for p in s.prompts]
    assert sorted(served) == sorted(eco.episodes(state, 0)) and len(served) == len(set(served)) == 12
    for spec in specs:
        if spec.op == PROBE:
            owner = next(s for s in specs if s.op == SERVE and s.organelle == spec.organelle)
            assert spec.prompts == owner.prompts  # probes learn from the organelle's own episodes
    assert len([s for s in specs if s.op == PROBE]) == 2 * FULL.probes * len([s for s in specs if s.op == SERVE])


def test_conditions_frozen_and_single():
    eco, state, _ = run(EcologyConfig(condition="frozen"), generations=4)
    assert len(state.organelles) == 1 and state.births == state.retirements == 0
    assert all(float(v.abs().sum()) == 0.0 for v in state.organelles[0]["adapter"].values())  # the base model
    specs, _ = eco.ask(state, 4)
    assert [s.op for s in specs] == [SERVE]  # no probes: nothing learns
    eco, state, _ = run(EcologyConfig(condition="single"), generations=4)
    assert len(state.organelles) == 1 and state.births == state.retirements == state.upkeep_paid == 0
    start = Ecology(EcologyConfig(condition="single"), 0).initial_state(context())
    assert any(not torch.equal(v, start.organelles[0]["adapter"][k]) for k, v in state.organelles[0]["adapter"].items())


def test_state_round_trips_through_a_weights_only_checkpoint_bit_for_bit():
    eco, state, _ = run(FULL, generations=6)
    buffer = io.BytesIO()
    torch.save(state_fields(state), buffer)
    buffer.seek(0)
    restored = EcologyState(**torch.load(buffer, weights_only=True))
    outcomes = []
    for s in (state, restored):
        specs, payload = eco.ask(s, 6)
        told = eco.tell(s, specs, synthetic_results(eco, s, specs, payload, 6))
        outcomes.append((specs, told.state, told.stats))
    (specs_a, a, stats_a), (specs_b, b, stats_b) = outcomes
    assert specs_a == specs_b and stats_a == stats_b
    assert [o["id"] for o in a.organelles] == [o["id"] for o in b.organelles]
    for x, y in zip(a.organelles, b.organelles):
        assert all(torch.equal(x["adapter"][k], y["adapter"][k]) for k in x["adapter"])
        assert x["energy"] == y["energy"]


def test_tell_leaves_the_previous_state_untouched():
    eco = Ecology(FULL, run_seed=0)
    state = eco.initial_state(context())
    specs, payload = eco.ask(state, 0)
    before = [(o["energy"], dict(o["families"]), list(o["recent"])) for o in state.organelles]
    eco.tell(state, specs, synthetic_results(eco, state, specs, payload, 0))
    assert [(o["energy"], dict(o["families"]), list(o["recent"])) for o in state.organelles] == before


@pytest.mark.parametrize(
    "override, message",
    [
        ("strategy.episode_fee=-0.1", "strategy.episode_fee=-0.1: must be >= 0"),
        ("strategy.energy_floor=1.5", "strategy.energy_floor=1.5: must be below strategy.endowment"),
        ("task.families.addition=0 task.families.arithmetic=0", "task.families="),
        ("task.heldout_families=[countdown]", "task.heldout_families=countdown: not one of task.families"),
        ("+task.families.nope=1", "task.families.nope: unknown task family; allowed: addition,"),
    ],
)
def test_bad_ecology_input_is_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        compose_run(["+experiment=quickstart/ecology", "task=mix", *override.split(" ")])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_routed_cells_and_their_means():
    from evora.strategies.protocol import CandidateSpec

    specs = (CandidateSpec(0, 0, prompts=(3, 9)), CandidateSpec(0, 1), CandidateSpec(0, 2, prompts=()))
    mask = evaluated_cells(specs, (1, 3, 9))
    assert mask.tolist() == [[False, True, True], [True, True, True], [False, False, False]]
    values = scatter(mask, [1.0, 0.0, 0.5, 0.5, 1.0], np.nan)
    assert np.isnan(values[0, 0]) and values[1].tolist() == [0.5, 0.5, 1.0]
    means = row_means(values, mask)
    assert means[0] == 0.5 and math.isclose(means[1], 2 / 3) and np.isnan(means[2])
    assert text_rows(mask, list("abcde")) == [["", "a", "b"], ["c", "d", "e"], ["", "", ""]]


def test_routing_map_switches_a_family_only_for_a_confident_lead():
    examples = [Example("p", "a", family=f) for f in "xxxxyyyy"]
    rewards = np.array(
        [
            [0, 0, 0, 0, 1, 1, 0, 0],  # o1, the default
            [1, 1, 1, 1, 1, 1, 0, 0],  # o2: leads on x on every example, ties on y
            [1, 0, 0, 0, 0, 0, 0, 0],  # o3: leads on x on one example
        ],
        dtype=float,
    )
    ids = ["o1", "o2", "o3"]
    assert routing_map(rewards, examples, ids, "o1") == {"x": "o2", "y": "o1", "default": "o1"}  # ties: default
    # o2's lead on x has no spread: any confidence keeps it; o3's alone is a lead of 1/4 +- 1/4.
    assert routing_map(rewards, examples, ids, "o1", confidence=5.0)["x"] == "o2"
    rewards[1] = rewards[2]
    assert routing_map(rewards, examples, ids, "o1", confidence=0.0)["x"] == "o2"  # same lead: lower position
    assert routing_map(rewards, examples, ids, "o1", confidence=0.9)["x"] == "o2"
    assert routing_map(rewards, examples, ids, "o1", confidence=1.1)["x"] == "o1"


def test_routed_rows_and_metrics():
    routing = {"x": "o2", "y": "o1", "default": "o1"}
    examples = [Example("p", "a", family=f) for f in ("x", "y", "z")]
    rows = routed_rows(routing, ["o1", "o2"], examples)
    assert rows == [1, 0, 0]  # z is unseen: the default serves it
    matrices = {
        "rewards": np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]),
        "correct": np.array([[False, True, True], [True, False, False]]),
        "tokens": np.array([[3, 3, 3], [5, 5, 5]]),
    }
    assert metrics_of(matrices, rows) == {"reward": 1.0, "accuracy": 1.0, "tokens": pytest.approx(11 / 3)}
