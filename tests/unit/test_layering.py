"""The package graph (docs/architecture.md, "Layers"): acyclic and layered, checked on the
real import graph (grimp reads every import, including those inside functions); and the
pure modules import no Ray, vLLM or W&B."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import grimp
import pytest

import evora

# Top to bottom: a module may import its own layer and the layers below it, never above.
# First matching prefix wins; a strategy's job runner sits above the runtime it drives.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry points", ("evora.cli", "evora.__main__", "evora.help", "evora.doctor")),
    ("run management and job runners", ("evora.runs", "evora.strategies.pbt.runner")),
    ("distributed runtime", ("evora.distributed",)),
    ("analysis", ("evora.analysis",)),
    (
        "config",
        (
            "evora.config.compose",
            "evora.config.fit",
            "evora.config.overlay",
            "evora.config.store",
            "evora.config.validate",
        ),
    ),
    ("tracking and engines", ("evora.tracking", "evora.engines")),
    ("strategies, tasks, training, models", ("evora.strategies", "evora.tasks", "evora.training", "evora.models")),
    ("adapters and schemas", ("evora.lora", "evora.config")),
    ("errors", ("evora.errors", "evora")),
]
# Ray-, vLLM- and W&B-free: the maths and data (every module under these packages).
PURE_PACKAGES = ("evora.strategies", "evora.lora", "evora.tasks", "evora.training", "evora.models", "evora.config")
NOT_PURE = ("evora.strategies.pbt.runner",)  # the PBT runner drives Ray Tune


def layer_of(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("evora", include_external_packages=False)


def test_every_import_goes_down_the_layers(graph):
    upward = []
    for importer in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(importer):
            if layer_of(imported) < layer_of(importer):
                upward.append(
                    f"{importer} ({LAYERS[layer_of(importer)][0]}) -> {imported} ({LAYERS[layer_of(imported)][0]})"
                )
    assert not upward, "\n".join(upward)


def strongly_connected(graph) -> list[list[str]]:
    """Tarjan's algorithm over module imports; components of more than one module are cycles."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.find_modules_directly_imported_by(node):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            found.append(component)

    sys.setrecursionlimit(10_000)
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return [sorted(c) for c in found if len(c) > 1]


def test_there_are_no_import_cycles(graph):
    assert strongly_connected(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    class Fake:
        modules = {"a", "b", "c"}

        @staticmethod
        def find_modules_directly_imported_by(m):
            return {"a": {"b"}, "b": {"a"}, "c": {"a"}}[m]

    assert strongly_connected(Fake()) == [["a", "b"]]


def pure_modules() -> list[str]:
    names = []
    for package in PURE_PACKAGES:
        module = __import__(package, fromlist=["_"])
        names.append(package)
        for info in pkgutil.walk_packages(module.__path__, prefix=package + "."):
            if info.name not in NOT_PURE:
                names.append(info.name)
    return names


def test_pure_modules_import_no_ray_vllm_or_wandb():
    pure = pure_modules()
    assert {
        "evora.strategies.ga.operators",
        "evora.lora.resize",
        "evora.strategies.pbt.space",
        "evora.strategies.es.strategy",
    } <= set(pure)
    code = f"""
import sys
for m in {pure!r}:
    __import__(m)
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm', 'wandb'))
print(bad)
assert not bad, bad
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_engines_import_vllm_only_when_created():
    result = subprocess.run(
        [sys.executable, "-c", "import sys, evora.engines; assert 'vllm' not in sys.modules"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_the_layers_name_every_package():
    packages = {info.name for info in pkgutil.iter_modules(evora.__path__, prefix="evora.")}
    assert all(layer_of(p) >= 0 for p in packages)
