"""Per-candidate fitness from a config expression over its metrics.

    task.fitness: reward                          (default: the task's mean reward)
    task.fitness: accuracy - perplexity / 100     (the LoRALab fitness)
    task.fitness: reward - 0.001 * tokens         (reward with a length penalty)
    task.kl_penalty: 0.1                          (fitness - 0.1 * kl: KL-regularised)

Names: reward, accuracy (mean correct), perplexity (of the reference completion, capped
at 1000), tokens (mean completion length), kl (mean per-token KL of the candidate's own
completions from the base model, the engine's estimator). Parsed once with a whitelisted
AST; numbers and + - * / only. One evaluator serves a candidate's metrics and whole
[candidate, prompt] matrices alike (numpy float64: the IEEE operations Python's floats do).
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from evora.errors import ConfigError

VARIABLES = ("reward", "accuracy", "perplexity", "tokens", "kl")
PERPLEXITY_CAP = 1000.0


def _divide(a: Any, b: Any) -> np.ndarray:
    """a / b, and 0.0 where b is 0 (a candidate with no tokens has no rate)."""
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape), where=b != 0)


_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: np.add,
    ast.Sub: np.subtract,
    ast.Mult: np.multiply,
    ast.Div: _divide,
}


def perplexity(token_logprobs: Sequence[float]) -> float:
    """exp(-mean log p) of a reference completion, capped at 1000 (as LoRALab caps it)."""
    if not token_logprobs:
        return PERPLEXITY_CAP
    mean_nll = -sum(token_logprobs) / len(token_logprobs)
    return PERPLEXITY_CAP if mean_nll > math.log(PERPLEXITY_CAP) else math.exp(mean_nll)


@dataclass(frozen=True)
class FitnessExpression:
    text: str
    tree: ast.Expression

    @property
    def names(self) -> set[str]:
        return {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)}

    @property
    def needs_perplexity(self) -> bool:
        return "perplexity" in self.names

    @property
    def needs_kl(self) -> bool:
        return "kl" in self.names

    def __call__(self, metrics: Mapping[str, float]) -> float:
        return float(self.over(metrics))

    def over(self, values: Mapping[str, Any], shape: tuple[int, ...] = ()) -> np.ndarray:
        """The expression over arrays (or numbers) of each name, element by element, broadcast
        to `shape`: one pass for a generation's [candidate, prompt] cells, not a call a cell."""

        def visit(node: ast.AST) -> Any:
            if isinstance(node, ast.Expression):
                return visit(node.body)
            if isinstance(node, ast.Constant):
                assert isinstance(node.value, (int, float)), "parse_fitness lets only numbers through"
                return np.float64(node.value)
            if isinstance(node, ast.Name):
                return np.asarray(values[node.id], dtype=np.float64)
            if isinstance(node, ast.UnaryOp):
                return -visit(node.operand) if isinstance(node.op, ast.USub) else visit(node.operand)
            assert isinstance(node, ast.BinOp), "parse_fitness lets no other node through"
            return _OPS[type(node.op)](visit(node.left), visit(node.right))

        with np.errstate(all="ignore"):  # overflow gives inf, NaN stays NaN: as Python's floats do
            return np.broadcast_to(visit(self.tree), shape).astype(np.float64)


def parse_fitness(text: str) -> FitnessExpression:
    """The expression, or a ConfigError naming task.fitness and what is allowed."""
    rule = f"allowed: numbers, + - * / ( ) and the names {', '.join(VARIABLES)}"
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ConfigError(f'task.fitness="{text}": not an expression; {rule}') from None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.USub, ast.UAdd, *_OPS)
    for node in ast.walk(tree):
        number = isinstance(node, ast.Constant) and type(node.value) in (int, float)
        if not number and not isinstance(node, allowed):
            raise ConfigError(f'task.fitness="{text}": {type(node).__name__} is not allowed; {rule}')
        if isinstance(node, ast.Name) and node.id not in VARIABLES:
            raise ConfigError(f'task.fitness="{text}": unknown name "{node.id}"; {rule}')
    return FitnessExpression(text, tree)


def task_fitness(fitness: str, kl_penalty: float = 0.0) -> FitnessExpression:
    """task.fitness, less kl_penalty * kl when the penalty is set (`reward - beta * KL`)."""
    if not kl_penalty:
        return parse_fitness(fitness)
    parse_fitness(fitness)  # the user's part alone: its errors name what they wrote
    return parse_fitness(f"({fitness}) - {kl_penalty!r} * kl")
