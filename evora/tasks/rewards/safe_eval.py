"""A safe arithmetic evaluator for model output: AST with whitelisted nodes, exact
rational arithmetic, and bounds on length, node count and magnitude. Nothing is executed."""

from __future__ import annotations

import ast
from fractions import Fraction

MAX_LENGTH = 256
MAX_NODES = 64
MAX_ABS = 10**12

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
_UNARY = {ast.UAdd: lambda a: a, ast.USub: lambda a: -a}


class UnsafeExpression(ValueError):
    """The text is not a small arithmetic expression over integers."""


def parse_arithmetic(text: str, max_length: int = MAX_LENGTH, max_nodes: int = MAX_NODES) -> ast.Expression:
    if len(text) > max_length:
        raise UnsafeExpression(f"longer than {max_length} characters")
    if not text.isascii() or "\x00" in text:
        raise UnsafeExpression("non-ASCII or NUL characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise UnsafeExpression(f"not an expression: {type(error).__name__}") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > max_nodes:
        raise UnsafeExpression(f"more than {max_nodes} nodes")
    for node in nodes:
        if not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, *_BINARY, *_UNARY)):
            raise UnsafeExpression(f"{type(node).__name__} is not allowed")
        if isinstance(node, ast.BinOp) and type(node.op) not in _BINARY:
            raise UnsafeExpression(f"operator {type(node.op).__name__} is not allowed")
        if isinstance(node, ast.Constant) and (type(node.value) is not int or abs(node.value) > MAX_ABS):
            raise UnsafeExpression("only integer literals up to 1e12 are allowed")
    return tree


def integer_literals(tree: ast.Expression) -> list[int]:
    # parse_arithmetic lets only int constants through
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, int)]


def evaluate(tree: ast.Expression, max_abs: int = MAX_ABS) -> Fraction:
    def visit(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return visit(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](visit(node.operand))
        if not isinstance(node, ast.BinOp):  # parse_arithmetic lets no other node through
            raise UnsafeExpression(f"{type(node).__name__} is not allowed")
        left, right = visit(node.left), visit(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise UnsafeExpression("division by zero")
        value = _BINARY[type(node.op)](left, right)
        if abs(value) > max_abs or value.denominator > max_abs:
            raise UnsafeExpression("intermediate value out of bounds")
        return value

    return visit(tree)


def evaluate_arithmetic(text: str) -> Fraction:
    """The exact value of an arithmetic expression, or UnsafeExpression."""
    return evaluate(parse_arithmetic(text))
