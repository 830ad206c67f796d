"""`evora --help` is evora's own page: subcommands, config groups with their real options,
the registered strategies, examples; every subcommand answers --help."""

import subprocess
import sys

import pytest

from evora.plan.compose import CONF_DIR, GROUPS
from evora.strategies import entries


def evora(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evora", *args], capture_output=True, text=True, timeout=120)


def test_help_explains_the_tool():
    result = evora("--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "powered by Hydra" not in text and "es_schema" not in text
    for sub in ("eval", "analyze", "compare", "runs"):
        assert f"  {sub} " in text, sub
    for group in GROUPS:
        line = next(line for line in text.splitlines() if line.startswith(f"  {group} "))
        assert all(p.stem in line for p in (CONF_DIR / group).glob("*.yaml")), (group, line)
    for entry in [e for e in entries() if e.config.__module__.startswith("evora.")]:
        assert f"  {entry.name}" in text and entry.summary in text
    assert text.count("\n  evora ") >= 3  # example command lines


@pytest.mark.parametrize("sub", ["eval", "analyze", "compare", "runs"])
def test_every_subcommand_has_its_own_help(sub):
    result = evora(sub, "--help")
    assert result.returncode == 0, result.stderr
    assert f"evora {sub}" in result.stdout
