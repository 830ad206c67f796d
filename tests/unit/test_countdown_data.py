"""The Countdown data trap (issue 54): a missing data file is the first error a run reports, naming
where the file comes from; `evora data countdown` writes a file task=countdown reads, from the ES
paper's countdown.json or drawn from reasoning-gym."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from evora import cli
from evora.plan.compose import compose_run
from evora.plan.run_plan import build_plan
from evora.tasks.builtin.countdown import PAPER_FILE, PAPER_REPOSITORY, generate_problem

DATA = Path(__file__).resolve().parent.parent / "data"
PAPER = DATA / "countdown_paper.json"
SMALL = ["task.train_size=8", "task.eval_size=4", "task.prompts_per_generation=8", "task.max_tokens=64"]


def evora(capsys, *argv: str) -> tuple[int, str, str]:
    """`evora <argv>` in this process: its exit code, stdout and stderr."""
    try:
        cli.main(list(argv))
        code = 0
    except SystemExit as stop:
        code = int(stop.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def planned(data_path: Path, *overrides: str):
    """task=countdown on `data_path`, composed, validated and planned on the tiny model (no Ray)."""
    return build_plan(compose_run(["task=countdown", f"task.data_path={data_path}", *SMALL, *overrides]))


# --- a missing data file -------------------------------------------------------------------------


def test_a_missing_countdown_file_is_the_first_error_and_says_where_the_file_comes_from(capsys, tmp_path, monkeypatch):
    """On the tiny model, task=countdown's max_tokens (1024) breaks model.max_model_len (512) too:
    the line is the file's, which is what the user has to fetch first."""
    monkeypatch.chdir(tmp_path)
    code, _, err = evora(capsys, "task=countdown", "task.data_path=countdown.json", f"tracking.out_dir={tmp_path}")
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith('evora: error: task.data_path="countdown.json": file not found')
    assert f"(looked for in {tmp_path})" in err
    assert f"{PAPER_FILE} in {PAPER_REPOSITORY}" in err and "evora data countdown" in err
    assert "max_tokens" not in err
    assert list(tmp_path.iterdir()) == []  # nothing started


def test_a_task_without_a_declared_source_says_file_not_found_only(capsys, tmp_path):
    missing = tmp_path / "qa.jsonl"
    code, _, err = evora(capsys, "task=jsonl", f"task.data_path={missing}", f"tracking.out_dir={tmp_path}")
    assert code == 2
    assert err == f'evora: error: task.data_path="{missing}": file not found\n'


# --- evora data countdown: from the paper's file ------------------------------------------------------


def test_the_papers_file_is_written_back_as_it_is_and_task_countdown_reads_it(capsys, tmp_path):
    out = tmp_path / "countdown.json"
    code, stdout, err = evora(capsys, "data", "countdown", "--from", str(PAPER), "--out", str(out))
    assert code == 0, err
    assert json.loads(out.read_text()) == json.loads(PAPER.read_text())  # the paper's format already
    assert stdout.startswith(f"wrote {out}: 20 problems from {PAPER}")
    plan = planned(out, "task.split=ordered")
    records = json.loads(PAPER.read_text())
    assert [e.rendered for e in plan.splits.train] == [r["context"] for r in records[:8]]
    assert [e.rendered for e in plan.splits.heldout] == [r["context"] for r in records[-4:]]


def test_a_file_of_bare_problems_gets_the_papers_records(capsys, tmp_path):
    """numbers and target only (JSONL, integer targets): ids, the paper's context and string targets
    are added; the prompts are the ones the paper's file has for the same problems."""
    bare = tmp_path / "bare.jsonl"
    records = json.loads(PAPER.read_text())
    bare.write_text("".join(json.dumps({"numbers": r["numbers"], "target": r["target"]}) + "\n" for r in records))
    out = tmp_path / "countdown.json"
    assert evora(capsys, "data", "countdown", "--from", str(bare), "--out", str(out))[0] == 0
    written = json.loads(out.read_text())
    assert [(w["id"], w["context"], w["target"]) for w in written] == [
        (r["id"], r["context"], r["target"]) for r in records
    ]
    assert all(w["solution"] == "" for w in written)


def test_the_2000_record_version_is_told_the_held_out_size_that_fits_it(capsys, tmp_path):
    """Before its commit of 2025-11-01 the paper's file had 2,000 records: with task=countdown's 200
    training and 2,000 held-out problems it would leave none to train on."""
    rng = random.Random(0)
    old = tmp_path / "countdown_2000.json"
    old.write_text(json.dumps([generate_problem(rng, count=rng.choice((3, 4))) for _ in range(2000)]))
    out = tmp_path / "countdown.json"
    code, stdout, _ = evora(capsys, "data", "countdown", "--from", str(old), "--out", str(out))
    assert code == 0 and "set task.eval_size=1800" in stdout
    plan = build_plan(
        compose_run(["task=countdown", f"task.data_path={out}", "task.max_tokens=64", "task.eval_size=1800"])
    )
    assert (len(plan.splits.train), len(plan.splits.heldout)) == (200, 1800)


def test_a_bad_record_is_one_line_naming_its_place(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[\n  {"numbers": [1, 2], "target": 3},\n  {"numbers": "1 2", "target": 3}\n]\n')
    code, _, err = evora(capsys, "data", "countdown", "--from", str(bad), "--out", str(tmp_path / "out.json"))
    assert code == 2 and err == f"evora: error: {bad}:3: 'numbers' must be a non-empty list of integers\n"
    assert not (tmp_path / "out.json").exists()


def test_a_missing_papers_file_says_where_it_is(capsys, tmp_path):
    code, _, err = evora(capsys, "data", "countdown", "--from", str(tmp_path / "countdown.json"))
    assert code == 2 and f"file not found; the ES paper's is {PAPER_FILE} in {PAPER_REPOSITORY}" in err


# --- evora data countdown: drawn from reasoning-gym ------------------------------------------------


def test_a_reasoning_gym_draw_is_seeded_solvable_and_read_by_task_countdown(capsys, tmp_path):
    pytest.importorskip("reasoning_gym")  # the `tasks` extra (and `dev`)
    files = {name: tmp_path / f"{name}.json" for name in ("a", "again", "other")}
    for name, seed in (("a", 3), ("again", 3), ("other", 4)):
        code, stdout, err = evora(
            capsys, "data", "countdown", "--size", "12", "--seed", str(seed), "--out", str(files[name])
        )
        assert code == 0, err
        assert f"12 problems from reasoning-gym's countdown, seed {seed}" in stdout
    drawn = json.loads(files["a"].read_text())
    assert drawn == json.loads(files["again"].read_text())
    other = json.loads(files["other"].read_text())
    assert not {(tuple(r["numbers"]), r["target"]) for r in drawn} & {(tuple(r["numbers"]), r["target"]) for r in other}
    assert [r["id"] for r in drawn] == list(range(12))
    assert all(3 <= len(r["numbers"]) <= 4 and all(1 <= n <= 99 for n in r["numbers"]) for r in drawn)

    plan = planned(files["a"], "task.split=ordered")
    task = plan.task
    for record, example in zip(drawn, plan.splits.train + plan.splits.heldout):
        assert example.rendered == record["context"] and isinstance(record["target"], str)
        solved = f" work</think>\n<answer>{record['solution']}</answer>"
        assert task.reward(solved, example) == pytest.approx(1.1) and task.correct(solved, example)


def test_a_draw_without_reasoning_gym_names_the_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as where it is not installed: import fails
    code, _, err = evora(capsys, "data", "countdown", "--out", str(tmp_path / "countdown.json"))
    assert code == 2 and err.count("\n") == 1
    assert "reasoning-gym" in err and "`tasks` extra: pip install -e '.[tasks]'" in err and "--from" in err
