"""evora.runs: status from run.lock / eval/summary.json, list/show, and `runs clean`,
which must never delete a running run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import make_summary
from evora import runs
from evora.cli import main


def _run(root: Path, name: str, state: str, mtime: int) -> Path:
    run = root / name
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text(
        yaml.safe_dump(
            {"generations": 30, "model": {"name": "tiny"}, "task": {"name": "addition"}, "strategy": {"name": "es"}}
        )
    )
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"generation": g, "reward_mean": 0.5}) + "\n" for g in range(4))
    )
    if state == "finished":
        (run / "eval" / "summary.json").write_text(json.dumps(make_summary(0.5, 0.9)))
    if state == "running":
        (run / "run.lock").write_text(f"{os.getpid()}\n")  # this test process: alive
    os.utime(run, (mtime, mtime))
    return run


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def root(tmp_path: Path) -> Path:
    _run(tmp_path, "2026-01-01_a", "finished", 1000)
    _run(tmp_path, "2026-01-02_b", "crashed", 2000)
    _run(tmp_path, "2026-01-03_c", "running", 500)  # oldest by mtime, yet running
    _run(tmp_path, "2026-01-04_d", "finished", 4000)
    return tmp_path


def test_status(root: Path):
    assert [runs.status(root / n) for n in ("2026-01-01_a", "2026-01-02_b", "2026-01-03_c")] == [
        "finished",
        "crashed",
        "running",
    ]
    (root / "2026-01-02_b" / "run.lock").write_text(f"{_dead_pid()}\n")
    assert runs.status(root / "2026-01-02_b") == "crashed"  # stale lock of a dead process


def test_run_lock_writes_pid_and_removes_it(tmp_path: Path):
    with runs.run_lock(tmp_path) as lock:
        assert lock.read_text().strip() == str(os.getpid())
        assert runs.status(tmp_path) == "running"
    assert not lock.exists()
    with pytest.raises(RuntimeError), runs.run_lock(tmp_path):
        raise RuntimeError("crash")
    assert not (tmp_path / "run.lock").exists()


def test_list_runs(root: Path):
    rows = runs.list_runs(root)
    assert [r["name"] for r in rows] == ["2026-01-03_c", "2026-01-01_a", "2026-01-02_b", "2026-01-04_d"]
    assert rows[1] == {
        "name": "2026-01-01_a",
        "strategy": "es",
        "task": "addition",
        "model": "tiny",
        "generations": "3/30",
        "best_heldout": 0.9,
        "status": "finished",
    }


def test_clean_keeps_newest_and_never_the_running_run(root: Path, capsys):
    main(["runs", "clean", "--keep", "1", "--yes", "--dir", str(root)])
    assert sorted(p.name for p in root.iterdir()) == ["2026-01-03_c", "2026-01-04_d"]
    assert "deleted" in capsys.readouterr().out


def test_clean_asks_and_n_deletes_nothing(root: Path, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    main(["runs", "clean", "--keep", "0", "--dir", str(root)])
    assert len(list(root.iterdir())) == 4


def test_clean_asks_and_y_deletes(root: Path, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    main(["runs", "clean", "--keep", "0", "--dir", str(root)])
    assert [p.name for p in root.iterdir()] == ["2026-01-03_c"]


def test_list_and_show_print(root: Path, capsys):
    main(["runs", "list", "--dir", str(root)])
    out = capsys.readouterr().out
    assert "2026-01-04_d" in out and "running" in out and "3/30" in out
    main(["runs", "show", str(root / "2026-01-01_a")])
    out = capsys.readouterr().out
    assert "finished" in out and '"reward": 0.9' in out and '"generation": 3' in out


def test_errors_are_one_line_exit_2(tmp_path: Path, capsys):
    for argv in (["runs", "list", "--dir", str(tmp_path / "nope")], ["runs", "show", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_clean_removes_scratch_folders_of_dead_workers_only(tmp_path: Path, capsys):
    dead = tmp_path / f"evora-2026-01-01_10-00-00_quickstart-{_dead_pid()}"
    live = tmp_path / f"evora-2026-01-01_10-00-00_quickstart-{os.getpid()}"
    other = tmp_path / "someone-elses-42"
    for folder in (dead, live, other):
        (folder / "1").mkdir(parents=True)
    main(["runs", "clean", "--scratch", str(tmp_path), "--dir", str(tmp_path / "no-runs")])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])
    assert f"removed 1 scratch folder(s) of runs no longer alive ({tmp_path}/evora-*)" in capsys.readouterr().out
