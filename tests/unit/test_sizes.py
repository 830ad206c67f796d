"""Size limits on evora's own code: a module over 400 lines, a class over 300 or a function over
50 is a sign that it does several things; split it by what each part does."""

from __future__ import annotations

import ast
from pathlib import Path

import evora

ROOT = Path(evora.__file__).parent
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 400, 300, 50


def sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def oversized(tree: ast.AST, name: str) -> list[str]:
    """Classes and functions of one module over their limits, with their lengths."""
    found = []
    for node in ast.walk(tree):
        limit = {ast.ClassDef: MAX_CLASS, ast.FunctionDef: MAX_FUNCTION, ast.AsyncFunctionDef: MAX_FUNCTION}.get(
            type(node)
        )
        if limit is not None:
            assert isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit:
                found.append(f"{name}:{node.lineno} {node.name}: {length} lines (limit {limit})")
    return found


def test_no_module_class_or_function_over_its_limit():
    found = []
    for path in sources():
        text = path.read_text()
        name = str(path.relative_to(ROOT.parent))
        lines = len(text.splitlines())
        if lines > MAX_MODULE:
            found.append(f"{name}: {lines} lines (limit {MAX_MODULE})")
        found.extend(oversized(ast.parse(text), name))
    assert found == []


def test_the_size_check_finds_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    assert oversized(ast.parse(f"def long():\n{body}\n"), "m.py") == [
        f"m.py:1 long: {MAX_FUNCTION + 1} lines (limit {MAX_FUNCTION})"
    ]
    assert oversized(ast.parse("def short():\n    return 1\n"), "m.py") == []
