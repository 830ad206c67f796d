import math

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
