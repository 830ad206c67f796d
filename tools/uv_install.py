"""`make setup`'s installer: `pip install ARGS` done by uv, with pip's own configuration; pip
itself where uv is missing or fails.

uv installs the same pinned versions (constraints.txt) as pip into the same venv, bytecode
compiled as pip does, in about half the time: `make setup` in a new clone took 88 s with uv's
cache empty, against 168 s with pip and pip's cache full (2-core CPU machine, 2026-12-01; the
two venvs' `pip freeze` differ by uv alone). But uv reads none of pip's configuration, where a
machine keeps its local wheels (find-links: this machine's CPU build of torch), its extra
indexes and its constraint files; without them uv would fetch a CUDA build of torch from PyPI.
So they are read from `pip config list` (files and PIP_* variables, as pip resolves them) and
passed on, and uv weighs every index as pip does (`--index-strategy unsafe-best-match`).

    python tools/uv_install.py -c constraints.txt -e ".[cpu,dev]"
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

# pip's setting -> uv's option; every value of each is passed on.
UV_OPTIONS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
INDEX_URL = "index-url"  # one value: pip's environment variable wins over its files, as in pip


def pip_settings() -> dict[str, list[str]]:
    """pip's configured values, by setting name: `pip config list` prints one `scope.name='value'`
    line per file and variable (a value may list several, space- or newline-separated)."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    settings: dict[str, list[str]] = {}
    for line in sorted(listing.splitlines(), key=lambda entry: entry.startswith(":env:")):  # variables last
        key, sep, quoted = line.partition("=")
        if not sep:
            continue
        try:
            value = ast.literal_eval(quoted)
        except (ValueError, SyntaxError):
            continue
        settings.setdefault(key.rpartition(".")[2], []).extend(str(value).split())
    return settings


def uv_arguments(settings: dict[str, list[str]]) -> list[str]:
    arguments = ["--index-strategy", "unsafe-best-match"]
    if settings.get(INDEX_URL):
        arguments += ["--index-url", settings[INDEX_URL][-1]]
    for name, option in UV_OPTIONS.items():
        for value in dict.fromkeys(settings.get(name, [])):  # once each, in pip's order
            arguments += [option, value]
    return arguments


def main(argv: list[str]) -> int:
    uv = Path(sys.executable).parent / "uv"
    if uv.is_file():
        command = [str(uv), "pip", "install", "--quiet", "--compile-bytecode", "--python", sys.executable]
        if subprocess.run([*command, *uv_arguments(pip_settings()), *argv], check=False).returncode == 0:
            return 0
        print("tools/uv_install.py: uv failed; installing with pip", file=sys.stderr)
    return subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *argv], check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
