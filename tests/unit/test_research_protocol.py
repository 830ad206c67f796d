"""The research protocol's pieces without engines: per-prompt shaping, the KL-regularised
fitness, a cell's samples and their seeds, held-out pass@k, the decoding checks before Ray,
and the decoding section of `evora compare`. Each against a direct computation."""

from __future__ import annotations

import itertools
import json
from math import comb
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import make_summary
from evora.distributed.cells import cell_values, requests_of
from evora.distributed.evaluate import SplitOutcome
from evora.distributed.search import generation_results
from evora.distributed.worker import UnitResult
from evora.errors import ConfigError
from evora.plan.compose import compose_run
from evora.plan.jobs import preflight
from evora.strategies.protocol import GenerationResults
from evora.strategies.shaping import per_prompt, shape, shaping_input, zscore
from evora.tasks import build_task, task_config
from evora.tasks.decoding import Decoding, eval_decoding, sample_seed, search_decoding
from evora.tasks.fitness import task_fitness

# --- per-prompt shaping ----------------------------------------------------------------------


def direct_per_prompt(cells: np.ndarray) -> np.ndarray:
    """Column by column: z-score across the candidates (0 where they tie), then row means."""
    z = np.zeros_like(cells, dtype=np.float64)
    for j in range(cells.shape[1]):
        column = cells[:, j]
        z[:, j] = 0.0 if column.std() == 0 else (column - column.mean()) / column.std()
    return z.mean(axis=1)


def test_per_prompt_equals_column_zscores_averaged():
    rng = np.random.default_rng(0)
    cells = rng.normal(size=(6, 5)) * rng.uniform(0.1, 10, size=5)  # prompts of very different spreads
    cells[:, 2] = 0.3  # a prompt every candidate ties on
    np.testing.assert_allclose(per_prompt(cells), direct_per_prompt(cells), rtol=1e-12)


def test_per_prompt_stops_a_wide_prompt_from_dominating():
    """Candidate 0 wins three easy prompts by a little; candidate 1 wins one prompt by a lot.
    Averaged raw, candidate 1 leads; normalised per prompt, candidate 0 does."""
    cells = np.array([[0.2, 0.2, 0.2, 0.0], [0.1, 0.1, 0.1, 1.0], [0.1, 0.1, 0.1, 0.0]])
    assert np.argmax(cells.mean(axis=1)) == 1
    assert np.argmax(per_prompt(cells)) == 0


def test_per_prompt_counts_only_evaluated_cells():
    cells = np.array([[1.0, 9.0], [0.0, np.nan], [0.5, 7.0]])
    evaluated = np.array([[True, True], [True, False], [True, True]])
    by_hand = np.array(
        [np.mean([zscore(cells[:, 0])[0], 1.0]), zscore(cells[:, 0])[1], np.mean([zscore(cells[:, 0])[2], -1.0])]
    )
    np.testing.assert_allclose(per_prompt(cells, evaluated), by_hand)


def test_shaping_input_reads_the_cells_only_for_per_prompt():
    cells = np.array([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5]])
    results = GenerationResults(0, (0, 1), cells, cells > 0, np.ones_like(cells), None, np.array([3.0, 2.0, 1.0]))
    assert shaping_input(results, "zscore").tolist() == [3.0, 2.0, 1.0]
    with_cells = GenerationResults(
        *[getattr(results, f) for f in ("generation", "prompt_indices", "rewards")],
        *[getattr(results, f) for f in ("correct", "tokens", "perplexity", "fitness", "evaluated", "texts")],
        cell_fitness=cells * 2,
    )
    np.testing.assert_allclose(shaping_input(with_cells, "per_prompt"), direct_per_prompt(cells * 2))
    np.testing.assert_allclose(
        shape(shaping_input(with_cells, "per_prompt"), "per_prompt"), zscore(direct_per_prompt(cells))
    )


# --- KL-regularised fitness ---------------------------------------------------------------------


def unit(indices: list[int], rewards: list[list[float]], kl: list[list[float]] | None = None) -> UnitResult:
    r = np.array(rewards)
    return UnitResult(
        indices, r, r > 0.5, np.full(r.shape, 4), 0, 0, {}, 0, 0.0, kl=None if kl is None else np.array(kl)
    )


def test_a_larger_beta_prefers_the_candidate_with_the_lower_kl():
    """Candidate 0 earns more reward but drifts further from the base model than candidate 1."""
    results = [unit([0, 1], [[0.9, 0.7], [0.7, 0.5]], kl=[[0.4, 0.2], [0.02, 0.04]])]
    order = {}
    for beta in (0.0, 0.5, 5.0):
        matrices, invalid = generation_results(task_fitness("reward", beta), 0, (3, 8), results, 2)
        assert invalid == 0
        np.testing.assert_allclose(matrices.fitness, [0.8 - beta * 0.3, 0.6 - beta * 0.03])
        order[beta] = int(np.argmax(matrices.fitness))
        # each cell's fitness is the expression of the cell: what per-prompt shaping normalises
        np.testing.assert_allclose(
            matrices.cell_fitness, np.array([[0.9, 0.7], [0.7, 0.5]]) - beta * np.array([[0.4, 0.2], [0.02, 0.04]])
        )
    assert order == {0.0: 0, 0.5: 0, 5.0: 1}


def test_kl_penalty_composes_with_the_fitness_and_names_its_term():
    fitness = task_fitness("accuracy - 0.001 * tokens", 0.25)
    assert fitness.needs_kl and not task_fitness("reward").needs_kl
    assert fitness({"accuracy": 1.0, "tokens": 10.0, "kl": 2.0}) == pytest.approx(1.0 - 0.01 - 0.5)
    assert task_fitness("reward - 2 * kl").needs_kl  # kl may also be named in the expression


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["task.samples=4"], "task.samples=4: > 1 needs task.temperature > 0"),
        (["task.eval_samples=2"], "task.eval_samples=2: > 1 needs task.eval_temperature > 0"),
        (["task.temperature=1.0", "task.samples=2", "task.k=3"], "task.k=3: must be in 1..task.samples (2)"),
        (
            ["task.eval_temperature=1", "task.eval_samples=2", "task.eval_k=4"],
            "task.eval_k=4: must be in 1..task.eval_samples",
        ),
        (["task.aggregate=best"], 'task.aggregate="best": allowed: mean, pass_at_k, majority'),
        (["task.top_p=0"], "task.top_p=0"),
        (["task.temperature=-1"], "task.temperature=-1"),
        (["task.kl_penalty=-0.1"], "task.kl_penalty=-0.1: must be >= 0"),
        (["strategy=pbt", "task.kl_penalty=0.1"], "task.kl_penalty=0.1: strategy=pbt runs its own job"),
        (["strategy=pbt", "task.fitness=reward - kl"], 'task.fitness="reward - kl": strategy=pbt runs its own job'),
    ],
)
def test_decoding_settings_are_checked_before_ray_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        compose_run(overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_majority_needs_a_task_with_canonical_answers():
    sampled = ["task.temperature=1.0", "task.samples=3", "task.aggregate=majority"]
    with pytest.raises(
        ConfigError, match='task.aggregate="?majority"?: needs a task whose completions have a canonical'
    ):
        preflight(["task=countdown", "task.max_tokens=64", *sampled])
    assert preflight(["task=addition", *sampled])  # addition's answer is the completion itself


# --- a cell's samples -------------------------------------------------------------------------


def test_requests_run_cell_by_cell_each_sample_with_its_own_seed():
    mask = np.array([[True, False], [True, True]])
    decoding = Decoding(temperature=0.7, top_p=0.9, samples=3)
    requests = requests_of(mask, [[1, 2], [3]], ["a", "b"], decoding, lambda r, c, s: 100 * r + 10 * c + s)
    assert requests.cells == [(0, 0), (1, 0), (1, 1)]
    assert requests.prompts == [[1, 2]] * 3 + [[1, 2]] * 3 + [[3]] * 3
    assert requests.adapters == ["a"] * 3 + ["b"] * 6
    assert [s.seed for s in requests.sampling] == [0, 1, 2, 100, 101, 102, 110, 111, 112]
    assert {(s.temperature, s.top_p) for s in requests.sampling} == {(0.7, 0.9)}
    assert requests.rows() == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert requests_of(mask, [[1, 2], [3]], ["a", "b"], Decoding(), lambda r, c, s: 0).sampling is None  # greedy


def test_sample_seeds_are_a_pure_function_of_their_parts():
    seed = sample_seed(7, "train", "g3-c5+", 11, 2)
    assert seed == sample_seed(7, "train", "g3-c5+", 11, 2)
    others = {
        sample_seed(*parts)
        for parts in [
            (8, "train", "g3-c5+", 11, 2),
            (7, "heldout", "g3-c5+", 11, 2),
            (7, "train", "g3-c5-", 11, 2),
            (7, "train", "g3-c5+", 12, 2),
            (7, "train", "g3-c5+", 11, 3),
        ]
    }
    assert seed not in others and len(others) == 5
    assert 0 <= seed < 2**63


def test_cell_values_aggregate_each_cells_samples():
    rewards = [1.0, 0.0, 0.0, 0.5, 0.5, 1.0]  # two cells of three samples
    correct = [True, False, False, False, False, True]
    answers = ["4", "5", "5", "7", "7", "8"]
    ok = [False] * 6
    mean = cell_values(Decoding(1.0, 1.0, 3, "mean"), rewards, correct, [2, 4, 6, 1, 1, 1], None, ok)
    assert mean.rewards == pytest.approx([1 / 3, 2 / 3]) and mean.correct == pytest.approx([1 / 3, 1 / 3])
    assert mean.tokens == [4.0, 1.0] and mean.correct_counts == [1, 1]
    at_2 = cell_values(Decoding(1.0, 1.0, 3, "pass_at_k", 2), rewards, correct, [1] * 6, None, ok)
    assert at_2.correct == pytest.approx([1 - comb(2, 2) / comb(3, 2)] * 2)  # pass@2 with c = 1 of n = 3
    assert at_2.rewards == pytest.approx([2 / 3, (0.5 + 1.0 + 1.0) / 3])  # E[max of 2 of 3]
    vote = cell_values(Decoding(1.0, 1.0, 3, "majority"), rewards, correct, [1] * 6, answers, ok)
    assert vote.rewards == [0.0, 0.5] and vote.correct == [0.0, 0.0]  # "5" and "7" win their votes
    one = cell_values(Decoding(), [0.3], [True], [5], None, [False])
    assert one.correct == [True] and one.tokens == [5] and one.correct_counts is None  # greedy: as it was
    assert mean.failed == [False, False] and one.failed == [False]
    # One failed sample fails its cell (its aggregate would count a score nobody gave); the other cell stands.
    failed = cell_values(Decoding(1.0, 1.0, 3, "mean"), rewards, correct, [1] * 6, None, [False, True] + [False] * 4)
    assert failed.failed == [True, False] and failed.rewards[1] == pytest.approx(2 / 3)


def test_search_and_evaluation_decode_with_their_own_settings():
    run = compose_run(
        ["task.temperature=0.8", "task.samples=2", "task.eval_temperature=1.0", "task.eval_samples=5", "task.eval_k=3"]
    )
    assert search_decoding(run.task) == Decoding(0.8, 1.0, 2, "mean", 1)
    assert eval_decoding(run.task) == Decoding(1.0, 1.0, 5, "mean", 3)
    default = compose_run([])
    assert search_decoding(default.task).greedy and eval_decoding(default.task) == Decoding(0.0, 1.0, 1, "mean", 1)


# --- held-out pass@k ----------------------------------------------------------------------------


def enumerated_pass_at_k(n: int, c: int, k: int) -> float:
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


def test_held_out_reports_pass_at_1_and_pass_at_k_from_the_samples():
    counts = np.array([0, 1, 4, 2, 3])  # correct samples of 4, per example
    outcome = SplitOutcome(counts / 4, counts / 4, np.full(5, 3.0), None, None, correct_counts=counts, samples=4, k=4)
    metrics = outcome.metrics()
    assert metrics["pass_at_1"] == pytest.approx(np.mean(counts / 4)) == pytest.approx(metrics["accuracy"])
    assert metrics["pass_at_4"] == pytest.approx(np.mean([enumerated_pass_at_k(4, int(c), 4) for c in counts]))
    two = SplitOutcome(counts / 4, counts / 4, np.full(5, 3.0), None, None, correct_counts=counts, samples=4, k=2)
    assert two.metrics()["pass_at_2"] == pytest.approx(np.mean([enumerated_pass_at_k(4, int(c), 2) for c in counts]))
    greedy = SplitOutcome(counts / 4, counts > 1, np.full(5, 3.0), None, None)
    assert not any(key.startswith("pass_at") for key in greedy.metrics())


# --- evora compare ---------------------------------------------------------------------------


def decoded_run(folder: Path, task: dict, best: float, passes: dict[str, float] | None = None) -> Path:
    from evora.tracking.summary import validate_summary

    (folder / "eval").mkdir(parents=True)
    config = {"task": {"name": "addition", **task}, "model": {"name": "tiny"}, "strategy": {"name": "es"}, "seed": 0}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / "metrics.jsonl").write_text("")
    summary = make_summary(0.5, best, best)
    summary["best"].update(passes or {})
    validate_summary(summary)  # pass_at_<k> is in the summary's schema
    (folder / "eval" / "summary.json").write_text(json.dumps(summary))
    return folder


def test_compare_shows_each_runs_decoding_and_pass_at_k(tmp_path):
    from evora.analysis import compare as cmp

    greedy = decoded_run(tmp_path / "greedy", {}, 0.6)
    sampled = decoded_run(
        tmp_path / "sampled",
        {"temperature": 1.0, "samples": 2, "eval_temperature": 1.0, "eval_samples": 4, "kl_penalty": 0.5},
        0.55,
        {"pass_at_1": 0.55, "pass_at_4": 0.875},
    )
    rows, paths = cmp.compare([greedy, sampled], tmp_path / "out")
    text = paths[0].read_text()
    assert "## Decoding" in text
    assert "| sampled | es | T=1 n=2 mean | T=1 n=4 | 0.5 | 0.5500 | 0.8750 (k=4) |" in text
    assert "| greedy | es | greedy | greedy | 0 | - | - |" in text
    data = json.loads(paths[1].read_text())
    assert [row["best pass@k"] for row in data["decoding"]] == ["-", "0.8750 (k=4)"]
    only_greedy, paths = cmp.compare([greedy], tmp_path / "out2")
    assert "## Decoding" not in paths[0].read_text()  # greedy runs alone: no section


def test_a_countdown_task_has_no_canonical_answer_and_addition_has_one():
    from evora.tasks.base import AnswerTask

    assert not isinstance(build_task(task_config("countdown"), 0), AnswerTask)
    assert isinstance(build_task(task_config("addition"), 0), AnswerTask)


# --- per-prompt shaping inside the strategies ----------------------------------------------------

WIDE_PROMPT = np.array([[0.2, 0.2, 0.2, 0.0], [0.1, 0.1, 0.1, 1.0], [0.1, 0.1, 0.1, 0.0], [0.15, 0.1, 0.2, 0.0]])


def cells_results(cells: np.ndarray, fitness: np.ndarray | None = None) -> GenerationResults:
    """A generation whose cells are `cells`; its row fitness the cells' means unless given."""
    row = cells.mean(axis=1) if fitness is None else fitness
    return GenerationResults(0, (0, 1, 2, 3), cells, cells > 0.15, np.ones_like(cells), None, row, cell_fitness=cells)


def test_es_ga_and_eggroll_under_per_prompt_act_on_the_per_prompt_means():
    """Each strategy told the cells under shaping=per_prompt does what it does, under its plain
    shaping, when told the per-prompt means as the fitness (the independent reference)."""
    import torch

    from evora.strategies.eggroll import EggrollConfig, EggrollStrategy
    from evora.strategies.eggroll.strategy import EggrollState
    from evora.strategies.es import ESConfig, EvolutionStrategy
    from evora.strategies.ga import GAConfig, GeneticAlgorithm

    means = direct_per_prompt(WIDE_PROMPT)
    adapter = {"a": torch.linspace(-1, 1, 6).reshape(2, 3), "b": torch.zeros(3, 2)}
    for make, plain in (
        (lambda s: EvolutionStrategy(ESConfig(population=4, shaping=s), 0), "zscore"),
        (lambda s: GeneticAlgorithm(GAConfig(population=4, keep_top=1, parents=2, shaping=s), 0), "none"),
    ):
        per, ref = make("per_prompt"), make(plain)
        state = per.start(adapter)
        specs, _ = per.ask(state, 0)
        ours, theirs = (
            per.tell(state, specs, cells_results(WIDE_PROMPT)),
            ref.tell(state, specs, cells_results(WIDE_PROMPT, means)),
        )
        assert ours.stats == theirs.stats
        assert all(
            torch.equal(a, b) for a, b in zip(per.center(ours.state).values(), ref.center(theirs.state).values())
        )
    eggroll = EggrollStrategy(EggrollConfig(population=4, shaping="per_prompt"), 0)
    state = EggrollState(["m"], [[2, 3]], 1.0)
    told = eggroll.tell(state, eggroll.population(0), cells_results(WIDE_PROMPT))
    np.testing.assert_allclose(told.state.fitness[0], means)
    np.testing.assert_allclose(
        eggroll.update_of(told.state, 0).coefficients,
        [zscore(means)[0] - zscore(means)[1], zscore(means)[2] - zscore(means)[3]],
    )
