"""`make setup` installs with uv (tools/uv_install.py), which reads none of pip's configuration:
the indexes, local wheel folders and constraint files pip is configured with, in its files and
PIP_* variables, reach uv as options, with the variable's index winning over the file's, as in
pip. (The venv it builds is the suite's own: every test runs in it.)"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from uv_install import pip_settings, uv_arguments  # noqa: E402


def pairs(arguments: list[str], option: str) -> list[str]:
    return [value for flag, value in zip(arguments, arguments[1:]) if flag == option]


def test_uv_is_given_pips_indexes_local_wheels_and_constraints(tmp_path, monkeypatch):
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\n"
        "index-url = https://file.example/simple\n"
        "extra-index-url = file:///a/simple\n    file:///b/simple\n"
        f"constraint = {tmp_path / 'pins.txt'}\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIP_INDEX_URL", "https://variable.example/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", f"{tmp_path / 'wheels'} {tmp_path / 'more'}")
    arguments = uv_arguments(pip_settings())
    assert pairs(arguments, "--index-url") == ["https://variable.example/simple"]
    assert {"file:///a/simple", "file:///b/simple"} <= set(pairs(arguments, "--extra-index-url"))
    assert {str(tmp_path / "wheels"), str(tmp_path / "more")} <= set(pairs(arguments, "--find-links"))
    assert str(tmp_path / "pins.txt") in pairs(arguments, "--constraint")
    assert pairs(arguments, "--index-strategy") == ["unsafe-best-match"]  # every index weighed, as pip does


def test_without_configuration_uv_keeps_its_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # pip then reads no configuration file
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
    assert uv_arguments(pip_settings()) == ["--index-strategy", "unsafe-best-match"]
