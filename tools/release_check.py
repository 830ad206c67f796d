"""`make release-check`: build the sdist and the wheel, and check them: one of each, of the
version in evora/version.py, which CHANGELOG.md's first released entry names, each carrying the
licence, and the wheel everything a run needs beside the code (configs, the bundled models, the
schema, task data). Prints one line per problem and exits 1, or one line and 0.

    python tools/release_check.py dist
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (what, a pattern one of the wheel's file names must match)
WHEEL_CARRIES = (
    ("the licence", r"evora-[^/]+\.dist-info/licenses/LICENSE"),
    ("the main config", r"evora/conf/config\.yaml"),
    ("the strategy configs", r"evora/conf/strategy/es\.yaml"),
    ("the quickstart experiments", r"evora/conf/experiment/quickstart/[^/]+\.yaml"),
    ("the ES paper's experiments", r"evora/conf/experiment/qiu2025/[^/]+\.yaml"),
    ("the tiny model", r"evora/models/tiny/model\.safetensors"),
    ("the tiny model's tokenizer", r"evora/models/tiny/tokenizer\.json"),
    ("the tiny mixture", r"evora/models/tiny_mix/model\.safetensors"),
    ("the summary schema", r"evora/schemas/summary\.schema\.json"),
    ("the task data", r"evora/tasks/data_files/[^/]+\.jsonl"),
)
SDIST_CARRIES = ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml")


def build(out: Path, root: Path = ROOT) -> None:
    """The sdist and the wheel of `root` into `out`, built from a copy with the venv's setuptools
    (setuptools writes build/ and *.egg-info beside what it builds; the checkout's egg-info is
    its editable install's)."""
    with tempfile.TemporaryDirectory(prefix="evora-release-") as folder:
        source = Path(folder) / "evora"
        skipped = shutil.ignore_patterns(".*", "dist", "build", "*.egg-info", "runs", "outputs", "__pycache__")
        shutil.copytree(root, source, symlinks=True, ignore=skipped)
        command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)]
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)


def source_version(root: Path = ROOT) -> str:
    text = (root / "evora" / "version.py").read_text()
    found = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    if found is None:
        raise SystemExit('evora/version.py: no __version__ = "..." line')
    return found.group(1)


def changelog_version(root: Path = ROOT) -> str | None:
    """The first released entry's version (`## [x.y.z] - date`), not [Unreleased]."""
    found = re.search(r"^## \[(\d[^\]]*)\]", (root / "CHANGELOG.md").read_text(), re.MULTILINE)
    return found.group(1) if found else None


def problems(dist: Path, version: str, released: str | None) -> list[str]:
    wheels, sdists = sorted(dist.glob("evora-*.whl")), sorted(dist.glob("evora-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        return [f"{dist}: expected one evora wheel and one sdist, found {len(wheels)} and {len(sdists)}"]
    found = []
    if released != version:
        found.append(f"CHANGELOG.md: its first released entry is {released}, evora/version.py says {version}")
    wheel, sdist = wheels[0], sdists[0]
    for built, name in ((wheel, f"evora-{version}-"), (sdist, f"evora-{version}.tar.gz")):
        if not built.name.startswith(name):
            found.append(f"{built.name}: not version {version} (evora/version.py)")
    names = zipfile.ZipFile(wheel).namelist()
    for what, pattern in WHEEL_CARRIES:
        if not any(re.fullmatch(pattern, n) for n in names):
            found.append(f"{wheel.name}: lacks {what} ({pattern})")
    members = {m.split("/", 1)[-1] for m in tarfile.open(sdist).getnames()}
    found += [f"{sdist.name}: lacks {name}" for name in SDIST_CARRIES if name not in members]
    return found


def main(argv: list[str]) -> int:
    dist = Path(argv[0]) if argv else ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    build(dist)
    version = source_version()
    found = problems(dist, version, changelog_version())
    for line in found:
        print(f"release-check: {line}", file=sys.stderr)
    if not found:
        print(f"release-check: evora {version}: sdist and wheel carry the licence, the changelog and what a run needs")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
