"""The package graph (docs/architecture.md, "Layers"): acyclic and layered, checked on the
real import graph (grimp reads every import, including those inside functions), between
modules and between packages; and the pure modules import no Ray, vLLM or W&B."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import evora

# Top to bottom: a module may import its own layer and the layers below it, never above.
# First matching prefix wins; a strategy's job runner sits above the runtime it drives.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "entry points",
        ("evora.cli", "evora.commands", "evora.__main__", "evora.help", "evora.doctor", "evora.serve", "evora.api"),
    ),
    ("run management, job runners and self-checks", ("evora.runs", "evora.jobs", "evora.selfcheck")),
    ("distributed runtime", ("evora.distributed",)),
    ("analysis", ("evora.analysis",)),
    ("planning: compose, validate, plan", ("evora.plan",)),
    ("tracking and engines", ("evora.tracking", "evora.engines")),
    ("strategies, tasks, training, models", ("evora.strategies", "evora.tasks", "evora.training", "evora.models")),
    ("adapters and schemas", ("evora.lora", "evora.config")),
    ("errors, interrupts and the version", ("evora.errors", "evora.interrupts", "evora.version")),
]
# Ray-, vLLM- and W&B-free: the maths and data (every module under these packages).
PURE_PACKAGES = ("evora.strategies", "evora.lora", "evora.tasks", "evora.training", "evora.models", "evora.config")
NOT_PURE: tuple[str, ...] = ()  # job runners (evora.jobs: PBT drives Ray Tune) sit above the pure packages


def layer_of(module: str) -> int:
    if module == "evora":  # the package itself is a front door too: evora.run, evora.load_run, evora.compose
        return 0
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("evora", include_external_packages=False, cache_dir=None)


def test_every_folder_is_a_package():
    """grimp sees only regular packages: a folder without __init__.py would drop out of the graph."""
    root = Path(evora.__file__).parent
    folders = [d for d in root.rglob("*") if d.is_dir() and any(d.glob("*.py")) and "__pycache__" not in d.parts]
    assert [str(d.relative_to(root)) for d in folders if not (d / "__init__.py").is_file()] == []


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


class PackageGraph:
    """The import graph between the children of one package (subpackages with everything under
    them, and modules); the package's own __init__ belongs to none of them."""

    def __init__(self, graph, parent: str):
        children = [m for m in graph.modules if m.startswith(parent + ".")]
        self.modules = {parent + "." + m[len(parent) + 1 :].split(".")[0] for m in children}
        self.edges: dict[str, set[str]] = {m: set() for m in self.modules}
        for module in children:
            for imported in graph.find_modules_directly_imported_by(module):
                a, b = self.child(module), self.child(imported)
                if b is not None and b != a:
                    self.edges[a].add(b)

    def child(self, module: str) -> str | None:
        return next((c for c in self.modules if module == c or module.startswith(c + ".")), None)

    def find_modules_directly_imported_by(self, module: str) -> set[str]:
        return self.edges[module]


def test_packages_import_in_no_circle(graph):
    """Not only modules: no package imports, through any of its modules, a package that imports it."""
    parents = sorted({m.rsplit(".", 1)[0] for m in graph.modules if "." in m and graph.is_module_squashed(m) is False})
    cycles = {p: strongly_connected(PackageGraph(graph, p)) for p in parents if p in graph.modules}
    assert {p: c for p, c in cycles.items() if c} == {}


def test_the_package_cycle_finder_finds_one():
    class Fake:
        modules = {"x", "x.a", "x.a.m", "x.b"}

        @staticmethod
        def find_modules_directly_imported_by(m):
            return {"x": set(), "x.a": set(), "x.a.m": {"x.b"}, "x.b": {"x.a"}}[m]

    assert strongly_connected(PackageGraph(Fake(), "x")) == [["x.a", "x.b"]]


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
