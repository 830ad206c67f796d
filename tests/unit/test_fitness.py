import math

import numpy as np
import pytest

from evora.errors import ConfigError
from evora.tasks.fitness import PERPLEXITY_CAP, parse_fitness, perplexity


def test_seed_000_fitness_and_length_penalty():
    assert parse_fitness("accuracy - perplexity / 100")({"accuracy": 0.73, "perplexity": 10.0}) == pytest.approx(0.63)
    assert parse_fitness("reward - 0.001 * tokens")({"reward": 1.0, "tokens": 200}) == pytest.approx(0.8)
    expression = parse_fitness("reward")
    assert expression({"reward": 0.25}) == 0.25 and not expression.needs_perplexity
    assert parse_fitness("-perplexity").needs_perplexity


@pytest.mark.parametrize(
    "text",
    ["loss", "reward ** 2", "__import__('os')", "reward if 1 else 0", "'a'", "reward[0]", "reward +", "accuracy.real"],
)
def test_bad_expressions_name_the_key(text):
    with pytest.raises(ConfigError, match=r"task.fitness=.*allowed: numbers"):
        parse_fitness(text)


def test_perplexity_is_capped():
    assert perplexity([math.log(0.5)] * 4) == pytest.approx(2.0)
    assert perplexity([-50.0]) == PERPLEXITY_CAP and perplexity([]) == PERPLEXITY_CAP


def python_float_fitness(text: str, metrics: dict[str, float]) -> float:
    """An independent reference: the expression in Python floats, `/` by 0 as 0.0."""
    source = text.replace("/", "//DIV//")
    names = {k: float(v) for k, v in metrics.items()}
    parts = source.split("//DIV//")
    if len(parts) == 1:
        return float(eval(source, {}, names))
    left, right = (float(eval(p, {}, names)) for p in parts)
    return left / right if right else 0.0


@pytest.mark.parametrize("text", ["reward - 0.001 * tokens", "accuracy / tokens", "-(reward - kl) * 3 / (tokens - 2)"])
def test_the_expression_over_arrays_equals_it_element_by_element(text):
    """One evaluator for a candidate and for a generation's [candidate, prompt] cells: bitwise
    Python's floats, with infinities, NaN, signed zeros and division by zero."""
    special = [0.0, -0.0, 1e308, -1e-300, math.inf, -math.inf, math.nan, 2.0, 0.37]
    grid = [(a, b, c) for a in special for b in special for c in special[::2]]
    cells = {
        "reward": np.array([g[0] for g in grid]).reshape(-1, 5),
        "tokens": np.array([g[1] for g in grid]).reshape(-1, 5),
        "kl": np.array([g[2] for g in grid]).reshape(-1, 5),
    }
    cells["accuracy"] = cells["reward"][::-1]
    expression = parse_fitness(text)
    over = expression.over(cells, cells["reward"].shape)
    for index in np.ndindex(over.shape):
        metrics = {k: float(v[index]) for k, v in cells.items()}
        expected = python_float_fitness(text, metrics)
        assert np.array_equal(over[index], expected, equal_nan=True) and math.copysign(1, over[index]) == math.copysign(
            1, expected
        ), (metrics, over[index], expected)
        assert np.array_equal(expression(metrics), expected, equal_nan=True)
