"""task=jsonl with a `family` field: each row's family is its example's, `task.heldout_families`
keeps those families' rows out of train and selection, and bad input stops config validation
(before Ray) in one line naming the file and line, or the key."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from evora.errors import ConfigError, DataError
from evora.plan.compose import compose_run
from evora.plan.jobs import preflight
from evora.tasks import build_task, task_config


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def family_rows(families: dict[str, int]) -> list[dict]:
    """Rows of each family, interleaved (so an ordered split's tail holds every family)."""
    return [
        {"prompt": f"{family} {i}", "answer": str(i), "family": family}
        for i in range(max(families.values()))
        for family, count in families.items()
        if i < count
    ]


def splits_of(data_path: str, seed: int = 0, **overrides):
    sizes = dict(train_size=100, selection_size=10, eval_size=20, prompts_per_generation=2)
    return build_task(task_config("jsonl", data_path=data_path, **{**sizes, **overrides}), seed).splits()


def every_split(splits) -> list:
    return [*splits.train, *splits.selection, *splits.heldout]


def test_a_row_family_becomes_its_example_family_and_no_field_means_none(tmp_path):
    rows = family_rows({"add": 30, "rev": 30}) + [
        {"prompt": "plain", "answer": "x"},
        {"prompt": "n", "answer": "y", "family": None},
    ]
    splits = splits_of(write_rows(tmp_path / "f.jsonl", rows))
    by_prompt = {e.prompt: e.family for e in every_split(splits)}
    assert len(by_prompt) == len(rows)
    assert all(by_prompt[r["prompt"]] == (r.get("family") or "") for r in rows)


def test_without_heldout_families_the_splits_are_those_of_a_file_without_families(tmp_path):
    rows = family_rows({"add": 40, "rev": 40})
    with_families = splits_of(write_rows(tmp_path / "f.jsonl", rows))
    plain = splits_of(write_rows(tmp_path / "p.jsonl", [{k: r[k] for k in ("prompt", "answer")} for r in rows]))
    for split in ("train", "selection", "heldout"):
        assert [e.prompt for e in with_families.get(split)] == [e.prompt for e in plain.get(split)]


@pytest.mark.parametrize("split", ["shuffled", "ordered"])
def test_heldout_families_rows_appear_only_in_the_heldout_split(tmp_path, split):
    path = write_rows(tmp_path / "f.jsonl", family_rows({"add": 40, "rev": 40, "count": 40}))
    splits = splits_of(path, heldout_families=["rev"], split=split, train_size=50)
    assert {e.family for e in splits.train} == {e.family for e in splits.selection} == {"add", "count"}
    assert len(splits.train) == 50 and len(splits.selection) == 10
    # the held-out split is the same as without held-out families: only train and selection change
    assert splits.heldout == splits_of(path, split=split).heldout
    assert Counter(e.family for e in splits.heldout)["rev"] > 0
    assert splits_of(path, heldout_families=["rev"], split=split, train_size=50) == splits  # deterministic
    if split == "shuffled":
        assert splits_of(path, seed=1, heldout_families=["rev"], train_size=50).train != splits.train  # seeded
    else:  # train from the head, in file order
        assert [e.prompt for e in splits.train[:4]] == ["add 0", "count 0", "add 1", "count 1"]


def test_train_size_bounds_train_and_growing_it_keeps_selection(tmp_path):
    path = write_rows(tmp_path / "f.jsonl", family_rows({"add": 60, "rev": 60}))
    small = splits_of(path, heldout_families=["rev"], train_size=5)
    large = splits_of(path, heldout_families=["rev"], train_size=50)
    assert len(small.train) == 5 and small.selection == large.selection and large.train[:5] == small.train


@pytest.mark.parametrize("family,kind", [(3, "int"), (["a"], "list"), (True, "bool")])
def test_a_non_string_family_names_the_file_and_line(tmp_path, family, kind):
    rows = family_rows({"add": 3})
    rows[1]["family"] = family
    path = write_rows(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError, match=rf"^{path}:2: field 'family' must be a string, got {kind}$"):
        splits_of(path)


def test_a_heldout_family_the_file_lacks_names_the_key(tmp_path):
    path = write_rows(tmp_path / "f.jsonl", family_rows({"add": 30, "rev": 30}))
    with pytest.raises(
        ConfigError, match=rf"^task.heldout_families=revv: not a family of {path} \(families: add, rev\)$"
    ):
        splits_of(path, heldout_families=["revv"])
    plain = write_rows(tmp_path / "p.jsonl", [{"prompt": "a", "answer": "b"}] * 30)
    with pytest.raises(ConfigError, match="task.heldout_families=rev: .*no 'family' field"):
        splits_of(plain, heldout_families=["rev"])


def test_a_heldout_family_without_heldout_rows_says_so(tmp_path):
    path = write_rows(tmp_path / "f.jsonl", family_rows({"add": 200, "rare": 1}))
    splits = splits_of(path)
    assert all(e.family == "add" for e in splits.heldout)  # the one rare row fell elsewhere (seed 0)
    with pytest.raises(ConfigError, match=r"=rare: none of its rows .* \(task.eval_size=20, task.split=shuffled\)$"):
        splits_of(path, heldout_families=["rare"])


def test_config_validation_checks_families_before_ray(tmp_path):
    path = write_rows(tmp_path / "f.jsonl", family_rows({"add": 40, "rev": 40}))
    base = [
        "task=jsonl",
        f"task.data_path={path}",
        "task.eval_size=20",
        "task.selection_size=4",
        "task.prompts_per_generation=8",
    ]
    run = compose_run([*base, "task.heldout_families=[rev]"])
    assert run.task.heldout_families == ["rev"]
    with pytest.raises(ConfigError, match=r"^task.heldout_families=nope: not a family of"):
        preflight([*base, "task.heldout_families=[nope]"])
    rows = family_rows({"add": 40})
    rows[7]["family"] = 7
    bad = write_rows(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError, match=rf"^{bad}:8: field 'family' must be a string, got int$"):
        preflight(["task=jsonl", f"task.data_path={bad}", "task.eval_size=20"])
