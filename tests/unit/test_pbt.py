"""strategy=pbt without a Ray cluster: the LoRALab explore rules stay within bounds, rank
resizing keeps what the adapter learned (Eckart-Young optimum when shrinking, exact when
growing or changing alpha), exploit starts a child from its parent's checkpoint, the
trial's LoRA training learns and resumes exactly, and the run summaries."""

import json
import pickle
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from evora.errors import ConfigError, RunError
from evora.jobs.pbt import records, tune_private
from evora.jobs.pbt.records import RoundLog, converged, round_record
from evora.jobs.pbt.trial import TrialContext, layout_for, lora_of, starting_point, training_pairs
from evora.lora.layout import build_layout
from evora.lora.noise import gaussian, noise_key
from evora.lora.peft_io import save_adapter
from evora.lora.resize import resize_adapter, truncate_product
from evora.plan.compose import compose_run
from evora.strategies.pbt.space import KEYS, explore, member_id, module_sets, sample
from evora.strategies.pbt.trials import TRIALS_FILE, read_trials
from evora.tracking.metrics import read_metrics
from evora.training.lora_sft import LoraSFT, TrainSettings, batch_of, lr_at
from evora.training.lora_spec import LoraSpec


@pytest.fixture(scope="module")
def pbt_run():
    return compose_run(["+experiment=quickstart/pbt"])


# --- explore ------------------------------------------------------------------------------


def test_explore_keeps_every_hyperparameter_within_the_search_space(pbt_run):
    space, rng = pbt_run.strategy, random.Random(0)
    changed = {key: 0 for key in KEYS}
    config = sample(space, rng)
    for _ in range(2000):
        new, operations = explore(config, space, rng)
        assert new["rank"] in space.ranks and new["alpha_multiplier"] in space.alpha_multipliers
        assert new["dropout"] in space.dropouts and new["target_modules"] in module_sets(space)
        assert space.lr_min <= new["learning_rate"] <= space.lr_max
        operation = operations.get("learning_rate", "")
        if operation.startswith("x"):
            factor = float(operation[1:])
            assert factor in space.lr_factors
            assert new["learning_rate"] == min(max(config["learning_rate"] * factor, space.lr_min), space.lr_max)
        elif operation:
            assert new["learning_rate"] in space.learning_rates
        for key in KEYS:
            changed[key] += key in operations
            assert key in operations or new[key] == config[key]
        assert set(operations) <= set(KEYS)
        config = new
    # each key changes with probability mutation_probability (0.3): about 600 of 2000
    for key, count in changed.items():
        assert 450 < count < 750, (key, count)


def test_explore_scales_and_clamps_the_learning_rate():
    space = replace(
        compose_run(["+experiment=quickstart/pbt"]).strategy,
        mutation_probability=1.0,
        resample_probability=0.0,
        lr_factors=[2.0],
        lr_max=3e-4,
    )
    new, operations = explore(
        {
            "rank": 16,
            "alpha_multiplier": 1,
            "learning_rate": 2e-4,
            "dropout": 0.05,
            "target_modules": module_sets(space)[0],
        },
        space,
        random.Random(1),
    )
    assert new["learning_rate"] == 3e-4 and operations["learning_rate"] == "x2.0"  # 4e-4 clamped
    ranks = space.ranks
    assert operations["rank"] == "neighbour" and abs(ranks.index(new["rank"]) - ranks.index(16)) <= 1


def test_explore_with_zero_mutation_probability_changes_nothing(pbt_run):
    space = replace(pbt_run.strategy, mutation_probability=0.0)
    config = sample(space, random.Random(3))
    assert explore(config, space, random.Random(4)) == (config, {})


def test_member_ids_read_like_seed_000():
    assert member_id({"rank": 16, "learning_rate": 2e-05, "dropout": 0.1}, 3) == "r16_lr2e-5_d0.1_g3"


# --- rank resize ----------------------------------------------------------------------------


def _factors(out_features: int, in_features: int, rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return gaussian(noise_key(seed, "a"), (rank, in_features)), gaussian(noise_key(seed, "b"), (out_features, rank))


def test_truncate_product_is_the_eckart_young_optimum():
    a, b = _factors(40, 24, 16, seed=0)
    product = b.double() @ a.double()
    singular = torch.linalg.svdvals(product)
    for rank in (1, 4, 8):
        new_a, new_b = truncate_product(b, a, rank)
        assert new_a.shape == (rank, 24) and new_b.shape == (40, rank)
        error = torch.linalg.norm(product - new_b.double() @ new_a.double())
        optimum = singular[rank:].pow(2).sum().sqrt()
        assert abs(error - optimum) <= 1e-5 * optimum, (rank, float(error), float(optimum))


def test_truncate_product_to_a_rank_at_least_the_inner_one_is_exact():
    a, b = _factors(12, 10, 4, seed=1)
    new_a, new_b = truncate_product(b, a, 8)  # padded with zero directions
    assert new_a.shape == (8, 10) and torch.allclose(new_b @ new_a, b @ a, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_layouts(tiny_shapes, tiny_path):
    def layout(rank, alpha, modules=("q_proj", "v_proj")):
        return build_layout(
            tiny_shapes, rank=rank, alpha=alpha, target_modules=list(modules), layers=None, base_model=tiny_path
        )

    return layout


def _random_adapter(layout, seed):
    return {key: gaussian(noise_key(seed, key), shape) for key, shape in layout.shapes().items()}


def _updates(tensors, layout):
    return {
        slot.name: layout.scale * tensors[slot.b_key].double() @ tensors[slot.a_key].double() for slot in layout.modules
    }


def test_resize_shrinks_to_the_best_approximation_and_grows_exactly(tiny_layouts):
    source = tiny_layouts(16, 32)
    tensors = _random_adapter(source, seed=5)
    before = _updates(tensors, source)
    shrunk_layout = tiny_layouts(8, 8)  # rank and alpha both change
    shrunk = _updates(resize_adapter(tensors, source, shrunk_layout, seed=1), shrunk_layout)
    for name, dw in before.items():
        optimum = torch.linalg.svdvals(dw)[8:].pow(2).sum().sqrt()
        error = torch.linalg.norm(dw - shrunk[name])
        assert abs(error - optimum) <= 1e-5 * optimum, name
    for target in (tiny_layouts(16, 64), tiny_layouts(64, 64)):  # alpha only; rank grows
        after = _updates(resize_adapter(tensors, source, target, seed=1), target)
        for name, dw in before.items():
            assert torch.allclose(after[name], dw, rtol=1e-5, atol=1e-6), name
        grown = resize_adapter(tensors, source, target, seed=1)
        assert all(grown[k].shape == s for k, s in target.shapes().items())


def test_resize_to_other_modules_keeps_shared_ones_and_starts_new_ones_at_zero(tiny_layouts):
    source, target = tiny_layouts(8, 8), tiny_layouts(8, 8, modules=("v_proj", "down_proj"))
    tensors = _random_adapter(source, seed=6)
    resized = resize_adapter(tensors, source, target, seed=2)
    before, after = _updates(tensors, source), _updates(resized, target)
    for name, dw in after.items():
        if name.endswith("v_proj"):
            assert torch.allclose(dw, before[name], rtol=1e-6, atol=1e-7)
        else:
            assert name.endswith("down_proj") and not dw.any()
            assert resized[next(s.a_key for s in target.modules if s.name == name)].abs().sum() > 0


# --- trial training and exploit -------------------------------------------------------------

HP = {"rank": 8, "alpha_multiplier": 2.0, "learning_rate": 3e-3, "dropout": 0.0, "target_modules": "q_proj,v_proj"}


@pytest.fixture(scope="module")
def tiny_run(tiny_path):
    return compose_run(["+experiment=quickstart/pbt", f"model.path={tiny_path}", "task.train_size=64"])


@pytest.fixture(scope="module")
def pairs(tiny_run, tiny_path):
    return training_pairs(tiny_run, tiny_path)


def _lora(hp):
    """Tune's encoding of a member as the trainer's typed spec, on layer 1 only."""
    modules = tuple(hp["target_modules"].split(","))
    return LoraSpec(hp["rank"], hp["rank"] * hp["alpha_multiplier"], modules, (1,), hp["dropout"])


def _trainer(tiny_path, pairs, hp=HP, **start):
    settings = TrainSettings(
        learning_rate=hp["learning_rate"],
        batch_size=8,
        gradient_accumulation=2,
        weight_decay=0.01,
        max_grad_norm=1.0,
        warmup_ratio=0.1,
        total_steps=20,
        seed=7,
    )
    return LoraSFT(tiny_path, _lora(hp), settings, pairs[0], pairs[1], **start)


def test_learning_rate_warms_up_then_decays():
    settings = TrainSettings(1.0, 1, 1, 0.0, 1.0, 0.1, 100, 0)
    rates = [lr_at(step, settings) for step in range(100)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(rates[9:], rates[10:])) and rates[-1] < 0.02


def _loss(trainer, pairs) -> float:
    """Loss on a fixed batch of the train split (the training loss itself is noisy)."""
    ids, mask, labels = batch_of(pairs[0][:64], pairs[1])
    with torch.no_grad():
        return float(trainer.model(input_ids=ids, attention_mask=mask, labels=labels).loss)


def test_trial_training_learns_and_resumes_exactly(tiny_path, pairs):
    straight = _trainer(tiny_path, pairs)
    before = _loss(straight, pairs)
    straight.train(3)
    straight.train(3)
    assert _loss(straight, pairs) < 0.97 * before, (before, _loss(straight, pairs))  # deterministic: seeded batches
    assert all(".layers.1." in k for k in straight.trained())  # only the chosen layer
    interrupted = _trainer(tiny_path, pairs)
    interrupted.train(3)
    state = interrupted.state()
    resumed = _trainer(
        tiny_path, pairs, adapter=interrupted.trained(), optimizer_state=state["optimizer"], step=state["step"]
    )
    resumed.train(3)
    for key, value in straight.trained().items():
        assert torch.equal(value, resumed.trained()[key]), key


def _checkpoint(folder, trainer, hp, context, trial, member, generation=2):
    save_adapter(folder / "adapter", trainer.trained(), layout_for(hp, context))
    torch.save(
        {"trial": trial, "member": member, "parent": "", "generation": generation, "hp": hp, **trainer.state()},
        folder / "trainer.pt",
    )


def test_exploit_starts_the_child_from_its_parents_checkpoint(tmp_path, tiny_run, tiny_path, tiny_shapes, pairs):
    context = TrialContext(tiny_run, tiny_path, "unused", tiny_shapes)
    parent = _trainer(tiny_path, pairs)
    parent.train(2)
    _checkpoint(tmp_path, parent, HP, context, trial="parent_trial", member="r8_lr0.003_d0.0_g0")
    weights = parent.trained()

    child = starting_point(tmp_path, {**HP, "learning_rate": 1e-3, "dropout": 0.05}, "child_trial", context)
    assert child.parent == "r8_lr0.003_d0.0_g0" and child.member == "" and child.step == 2
    assert child.generation == 2 and child.adapter.keys() == weights.keys()
    assert all(torch.equal(child.adapter[k], weights[k]) for k in weights)
    clone = _trainer(
        tiny_path,
        pairs,
        {**HP, "learning_rate": 1e-3},
        adapter=child.adapter,
        optimizer_state=child.optimizer,
        step=child.step,
    )
    assert all(torch.equal(clone.trained()[k], weights[k]) for k in weights)  # trains on from the parent

    smaller = {**HP, "rank": 1}
    shrunk = starting_point(tmp_path, smaller, "child_trial", context)
    old, new = layout_for(HP, context), layout_for(smaller, context)
    assert shrunk.adapter.keys() == weights.keys()
    for slot in new.modules:
        dw = old.scale * weights[slot.b_key].double() @ weights[slot.a_key].double()
        approx = new.scale * shrunk.adapter[slot.b_key].double() @ shrunk.adapter[slot.a_key].double()
        optimum = torch.linalg.svdvals(dw)[1:].pow(2).sum().sqrt()
        assert abs(torch.linalg.norm(dw - approx) - optimum) <= 1e-5 * optimum + 1e-12
    resumed_shape = _trainer(
        tiny_path, pairs, smaller, adapter=shrunk.adapter, optimizer_state=shrunk.optimizer, step=shrunk.step
    )
    assert resumed_shape.step == 2  # the optimizer state of another shape is dropped, not loaded

    own = starting_point(tmp_path, HP, "parent_trial", context)  # a resume keeps the member
    assert own.member == "r8_lr0.003_d0.0_g0" and own.parent == ""


# --- summaries ------------------------------------------------------------------------------


def test_convergence_flag_is_under_one_percent_over_five_generations():
    assert converged([0.1, 0.2, 0.3, 0.4, 0.5]) is None
    assert converged([0.1, 0.5, 0.502, 0.503, 0.504, 0.504, 0.504]) is True  # 0.5 -> 0.504 over 5
    assert converged([0.1, 0.5, 0.502, 0.503, 0.504, 0.504]) is False  # 0.1 -> 0.504 over 5
    assert converged([0.1, 0.5, 0.52, 0.53, 0.54, 0.56, 0.57]) is False


ROWS = [
    {"trial": "a", "generation": 1, "fitness": 0.1, "accuracy": 0.2, "member": "ma", "tokens_trained": 10},
    {"trial": "b", "generation": 1, "fitness": 0.3, "accuracy": 0.4, "member": "mb"},
    {"trial": "a", "generation": 2, "fitness": 0.0, "accuracy": 0.1, "member": "ma"},
    {"trial": "a", "generation": 2, "fitness": 0.5, "accuracy": 0.6, "member": "ma"},  # resumed: repeats
    {"trial": "b", "generation": 2, "fitness": 0.2, "accuracy": 0.3, "member": "mb"},
]


def test_trials_reduce_to_one_record_per_round(tmp_path):
    (tmp_path / TRIALS_FILE).write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    trials = read_trials(tmp_path)
    assert len(trials) == 4 and trials[2]["fitness"] == 0.5
    first = round_record(1, [t for t in trials if t["generation"] == 1], 1000, 2 * 1000 * 50, 0.0)
    second = round_record(
        2, [t for t in trials if t["generation"] == 2], 1000, 2 * 1000 * 40, first["cumulative_flops"]
    )
    # compute: 6 P T for training, and the round's scoring (2 P T)
    assert first["flops"] == 6 * 1000 * 10 + 2 * 1000 * 50 and second["flops"] == 2 * 1000 * 40
    assert second["cumulative_flops"] == first["flops"] + second["flops"]
    assert second["fitness_max"] == 0.5 and second["best_member"] == "ma"
    assert first["fitness_median"] == pytest.approx(0.2) and first["trials"] == 2


def _results(log, rows):
    for row in rows:
        log.on_trial_result(0, [], SimpleNamespace(trial_id=row["trial"]), row)


def test_rounds_are_logged_when_every_member_reported_them_and_once_after_a_restore(tmp_path, monkeypatch):
    scored = iter([2 * 1000 * 50, 2 * 1000 * 90, 2 * 1000 * 30])  # the service's search scoring so far
    monkeypatch.setattr(records, "scoring_flops", lambda service, parameters: next(scored))
    run = compose_run(["+experiment=quickstart/pbt", "strategy.population=2"])
    log = RoundLog(run, str(tmp_path), parameters=1000, service="unused")
    stored = pickle.dumps(log)  # as Tune stores it with the experiment, before the first result
    _results(log, ROWS[:1])
    assert read_metrics(tmp_path) == []
    _results(log, ROWS[1:3])
    assert [r["generation"] for r in read_metrics(tmp_path)] == [1]
    _results(log, ROWS[3:])
    logged = read_metrics(tmp_path)
    assert [r["generation"] for r in logged] == [1, 2] and logged[1]["fitness_max"] == 0.5
    assert logged[0]["flops"] == 6 * 1000 * 10 + 2 * 1000 * 50 and logged[1]["flops"] == 2 * 1000 * 40
    (tmp_path / TRIALS_FILE).write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    restored = pickle.loads(stored)  # a restored run redoes round 2, then reports round 3
    _results(restored, ROWS[3:] + [{**ROWS[0], "generation": 3}, {**ROWS[1], "generation": 3}])
    logged = read_metrics(tmp_path)
    assert [r["generation"] for r in logged] == [1, 2, 3]
    assert logged[2]["flops"] == 6 * 1000 * 10 + 2 * 1000 * 30  # the new service counts from zero
    assert logged[2]["cumulative_flops"] == logged[1]["cumulative_flops"] + logged[2]["flops"]


def test_another_ray_stops_a_pbt_job_with_one_line(monkeypatch):
    monkeypatch.setattr(tune_private, "ray_version", lambda: "2.99.0")
    with pytest.raises(RunError) as error:
        tune_private.require_written_for_this_ray()
    assert "Ray 2.60.x, not 2.99.0" in str(error.value) and "\n" not in str(error.value)
    monkeypatch.setattr(tune_private, "ray_version", lambda: tune_private.WRITTEN_FOR + ".3")
    tune_private.require_written_for_this_ray()


def test_tune_draws_whom_to_clone_from_the_schedulers_own_seeded_rng():
    from ray.tune.schedulers import pbt

    state = random.getstate()
    with tune_private.seeded_tune_random(random.Random(5)):
        drawn = [pbt.random.choice(range(100)) for _ in range(5)]
    assert pbt.random is random and random.getstate() == state  # the global RNG untouched
    reference = random.Random(5)
    assert drawn == [reference.choice(range(100)) for _ in range(5)]


def test_tunes_encoding_becomes_the_trainers_typed_lora(tiny_run, tiny_path, tiny_shapes):
    context = TrialContext(tiny_run, tiny_path, "unused", tiny_shapes)
    lora = lora_of({**HP, "rank": 16, "dropout": 0.1}, context)
    assert tuple(tiny_run.lora.layers) == (1,)  # the tiny model's config trains layer 1
    assert lora == LoraSpec(16, 32.0, ("q_proj", "v_proj"), (1,), 0.1)


@pytest.mark.parametrize(
    "override,message",
    [
        ("strategy.ranks=[]", "strategy.ranks=[]: must list at least one value"),
        ("strategy.ranks=[3,8]", "rank 3 is not one vLLM serves"),
        ("strategy.learning_rates=[0.001,0]", "every learning rate must be > 0"),
        ("strategy.learning_rates=[-1e-4]", "every learning rate must be > 0"),
        ("strategy.dropouts=[1.5]", "every dropout must be in [0, 1)"),
        ("strategy.target_modules=[[]]", "every option must name at least one module"),
        ("strategy.keep_top_fraction=0.7", "strategy.keep_top_fraction=0.7"),
        ("strategy.mutation_probability=1.5", "strategy.mutation_probability=1.5"),
        ("strategy.fitness=loss", "strategy.fitness"),
        ("hardware.trial_cpus=0", "hardware.trial_cpus=0"),
    ],
)
def test_bad_search_spaces_are_rejected(override, message):
    with pytest.raises(ConfigError) as error:
        compose_run(["+experiment=quickstart/pbt", override])
    assert message in str(error.value) and "\n" not in str(error.value)
