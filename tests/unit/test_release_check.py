"""`make release-check` (tools/release_check.py): the sdist and the wheel built from this checkout
are of evora/version.py's version, which is the version the changelog's first released entry
names and the one the installed package reports, and carry the licence and what a run needs; a
wheel without its licence, or a changelog a version behind, is named in one line."""

from __future__ import annotations

import shutil
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import evora

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from release_check import build, changelog_version, problems, source_version  # noqa: E402


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    build(out)
    return out


def test_the_built_sdist_and_wheel_pass_the_release_check(dist):
    version = source_version()
    assert version == evora.__version__ == changelog_version()
    assert problems(dist, version, changelog_version()) == []
    [wheel] = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as built:
        metadata = Parser().parsestr(built.read(f"evora-{version}.dist-info/METADATA").decode())
    assert metadata["Version"] == version and metadata["License-Expression"] == "Apache-2.0"


def test_a_wheel_without_its_licence_and_a_changelog_behind_are_named(dist, tmp_path):
    [wheel] = dist.glob("*.whl")
    [sdist] = dist.glob("*.tar.gz")
    shutil.copy(sdist, tmp_path)
    with zipfile.ZipFile(wheel) as built, zipfile.ZipFile(tmp_path / wheel.name, "w") as stripped:
        for item in built.infolist():
            if not item.filename.endswith("/licenses/LICENSE"):
                stripped.writestr(item, built.read(item))
    found = problems(tmp_path, source_version(), "0.0.1")
    assert found == [
        f"CHANGELOG.md: its first released entry is 0.0.1, evora/version.py says {source_version()}",
        f"{wheel.name}: lacks the licence (evora-[^/]+\\.dist-info/licenses/LICENSE)",
    ]
