"""`evora --help` is evora's own page: subcommands, config groups with their real options,
the registered strategies, examples; every subcommand answers --help."""

import subprocess
import sys

import pytest

from evora.commands import SUBCOMMANDS
from evora.plan.compose import CONF_DIR, GROUPS
from evora.strategies import entries


def evora(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evora", *args], capture_output=True, text=True, timeout=120)


def test_help_explains_the_tool():
    result = evora("--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "powered by Hydra" not in text and "es_schema" not in text
    for sub, command in SUBCOMMANDS.items():
        assert f"  {sub:<9} {command.summary}" in text, sub
    for group in GROUPS:
        line = next(line for line in text.splitlines() if line.startswith(f"  {group} "))
        assert all(p.stem in line for p in (CONF_DIR / group).glob("*.yaml")), (group, line)
    for entry in [e for e in entries() if e.config.__module__.startswith("evora.")]:
        assert f"  {entry.name}" in text and entry.summary in text
    assert text.count("\n  evora ") >= 3  # example command lines


@pytest.mark.parametrize("sub", ["eval", "analyze", "compare", "runs", "serve", "data"])
def test_every_subcommand_has_its_own_help(sub):
    result = evora(sub, "--help")
    assert result.returncode == 0, result.stderr
    assert f"evora {sub}" in result.stdout


def test_each_subcommand_is_a_module_of_its_own_with_a_main():
    import importlib
    from pathlib import Path

    import evora.commands

    folder = Path(evora.commands.__file__).parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__", "exits"}
    assert {command.module for command in SUBCOMMANDS.values()} == modules
    for command in SUBCOMMANDS.values():
        assert callable(importlib.import_module(f"evora.commands.{command.module}").main), command.module
    assert len((folder.parent / "cli.py").read_text().splitlines()) < 200  # the front door: Hydra's main and the table
