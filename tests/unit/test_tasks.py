"""Every task: deterministic splits, golden rewards on hand-written completions, data errors."""

import json
from pathlib import Path

import pytest

from evora.errors import ConfigError, DataError
from evora.tasks import build_task, task_config, task_names
from evora.tasks.builtin.addition import heldout_pairs, is_heldout_pair, training_pairs
from evora.tasks.builtin.countdown import generate_problem
from evora.tasks.registry import get_task
from evora.tasks.rewards.countdown import answer_score

DATA = Path(__file__).resolve().parents[1] / "data"


def task(name, **kwargs):
    return build_task(task_config(name, **kwargs), seed=0)


def test_registry_lists_the_tasks():
    assert {"addition", "countdown", "conciseness", "arithmetic", "gsm8k", "mmlu_pro", "jsonl"} <= set(task_names())


def test_addition_splits_are_disjoint_and_deterministic():
    cfg = task_config("addition", train_size=500, selection_size=50, eval_size=100)
    splits = build_task(cfg, seed=3).splits()
    assert splits == build_task(cfg, seed=3).splits()

    def pairs(examples):
        return {(e.data["a"], e.data["b"]) for e in examples}

    train, selection, held = pairs(splits.train), pairs(splits.selection), pairs(splits.heldout)
    assert len(selection) == 50 and not train & held and not selection & held and not train & selection
    assert all(is_heldout_pair(*p) for p in held | selection)
    assert len(training_pairs()) + len(heldout_pairs()) == 100 * 100
    other_seed = build_task(cfg, seed=4).splits()
    assert other_seed.heldout == splits.heldout  # held-out fixed so seeds compare
    assert other_seed.train != splits.train


@pytest.mark.parametrize(
    "name,kwargs", [("countdown", {}), ("arithmetic", {}), ("jsonl", {"data_path": str(DATA / "qa.jsonl")})]
)
def test_generated_and_file_splits_are_disjoint_and_seeded(name, kwargs):
    cfg = task_config(name, train_size=4, selection_size=2, eval_size=2, prompts_per_generation=2, **kwargs)
    a, b = build_task(cfg, 0).splits(), build_task(cfg, 0).splits()
    assert a == b
    prompts = [e.prompt for split in (a.train, a.selection, a.heldout) for e in split]
    assert len(prompts) == len(set(prompts)) == 8


def test_addition_golden():
    t = task("addition")
    e = t.splits().train[0]
    assert t.reward(e.answer, e) == 1.0 and t.correct(e.answer, e)
    for wrong in (e.answer + " 1+2=3", "", str(int(e.answer) + 1), "0" + e.answer):
        assert t.reward(wrong, e) == 0.0 and not t.correct(wrong, e)


def test_countdown_golden():
    t = task("countdown", train_size=10, eval_size=5)
    e = t.splits().train[0]
    assert e.prefix.endswith("<think>") and e.prompt.startswith("Using the numbers")
    right = f"some thoughts</think>\n<answer>{e.answer}</answer>"
    assert t.reward(right, e) == pytest.approx(1.1) and t.correct(right, e)
    assert t.reward(f"x</think> <answer>{e.answer}</answer>", e) == pytest.approx(1.06)  # near miss: format
    assert t.reward("x</think>\n<answer>1+1</answer>", e) == pytest.approx(0.1)
    assert t.reward("<answer>", e) == 0.0 and not t.correct("no answer", e)


def test_countdown_paper_file_loads_and_scores():
    """A file of the paper's countdown.json shape: string targets, some non-integer, its context prompt."""
    records = json.loads((DATA / "countdown_paper.json").read_text())
    t = task("countdown", data_path=str(DATA / "countdown_paper.json"), train_size=16, eval_size=4, split="ordered")
    splits = t.splits()
    examples = splits.train + splits.heldout
    assert [e.rendered for e in examples] == [r["context"] for r in records]  # file order, prompts verbatim
    assert any("." in r["target"] for r in records) and all(isinstance(r["target"], str) for r in records)
    for record, example in zip(records, examples):
        assert example.data["target"] == record["target"]
        solved = f" work</think>\n<answer>{record['solution']}</answer>"
        assert t.reward(solved, example) == pytest.approx(1.1) and t.correct(solved, example)
        assert t.reward(" work</think>\n<answer>1</answer>", example) == pytest.approx(0.1)


def test_ordered_split_takes_train_from_the_head_and_heldout_from_the_tail():
    data = str(DATA / "countdown_paper.json")
    splits = task("countdown", data_path=data, train_size=5, selection_size=2, eval_size=3, split="ordered").splits()
    records = json.loads(Path(data).read_text())
    contexts = [r["context"] for r in records]
    assert [e.rendered for e in splits.train] == contexts[:5]
    assert [e.rendered for e in splits.selection] == contexts[5:7]
    assert [e.rendered for e in splits.heldout] == contexts[-3:]


def test_generated_countdown_problems_are_solvable():
    import random

    rng = random.Random(0)
    for _ in range(200):
        problem = generate_problem(rng, count=rng.choice((3, 4)))
        assert answer_score(f"<answer>{problem['solution']}</answer>", problem["numbers"], problem["target"]) == 1.0


def test_conciseness_golden():
    t = task("conciseness", train_size=2, eval_size=8, prompts_per_generation=2)
    splits = t.splits()
    assert len(splits.train) == 2 and len(splits.heldout) == 8
    e = splits.heldout[0]
    assert t.reward(e.answer, e) == 0.0 and t.correct(e.answer, e)
    assert t.reward(e.answer + "x" * 10, e) == -10.0 and not t.correct(e.answer + "x" * 10, e)
    assert t.reward("", e) == -len(e.answer)
    # Measured as generated (the ES paper's compute_reward): whitespace counts, unless stripped.
    assert t.reward(" " + e.answer + "\n", e) == -2.0
    stripped = task("conciseness", train_size=2, eval_size=8, prompts_per_generation=2, length_measure="stripped")
    assert stripped.reward(" " + e.answer + "\n", e) == 0.0


def test_arithmetic_golden():
    t = task("arithmetic", train_size=20, eval_size=5)
    e = t.splits().train[0]
    assert t.reward(f"Let me compute. {e.data['expression']} = {e.answer}\n#### {e.answer}", e) == 1.0
    assert t.reward(f"#### {int(e.answer) + 1}", e) == 0.0
    assert t.reward(f"the answer is \\boxed{{{e.answer}}}", e) == 1.0
    assert t.reward("I don't know", e) == 0.0


def test_gsm8k_from_a_local_file_golden():
    t = task("gsm8k", data_path=str(DATA / "gsm8k_sample.jsonl"), train_size=10, eval_size=2, prompts_per_generation=2)
    pool = [e for s in (t.splits().train, t.splits().selection, t.splits().heldout) for e in s]
    by_answer = {e.answer: e for e in pool}
    assert set(by_answer) == {"29", "150", "14", "9", "850", "210"}  # "1,200 - 350 ... #### 850" too
    e = by_answer["850"]
    assert "####" in e.target and e.prompt.endswith("after ####.")
    assert t.reward("They sell 350 of 1,200 so 850 remain.\n#### 850", e) == 1.0
    assert t.reward("\\boxed{850}", e) == 1.0
    assert t.reward("#### 851", e) == 0.0
    assert t.reward("850 chickens, then 12 more", e) == 0.0  # the last number counts


def test_mmlu_pro_from_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [json.loads(line) for line in (DATA / "mmlu_pro_sample.jsonl").read_text().splitlines()]
    parquet = tmp_path / "mmlu.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet)
    for path in (DATA / "mmlu_pro_sample.jsonl", parquet):
        t = task("mmlu_pro", data_path=str(path), train_size=10, eval_size=2, prompts_per_generation=2)
        e = next(
            e
            for s in (t.splits().train, t.splits().heldout, t.splits().selection)
            for e in s
            if "derivative" in e.prompt
        )
        assert "C. 2x" in e.prompt and e.answer == "C"
        assert t.reward("The answer is (C).", e) == 1.0 and t.correct("Answer: C", e)
        assert t.reward("C. 2x", e) == 1.0
        assert t.reward("The answer is (B).", e) == 0.0 and t.reward("I am not sure.", e) == 0.0


@pytest.mark.parametrize(
    "scorer,completion,expected",
    [
        ("exact", "Rome", 1.0),
        ("exact", "Rome is the capital", 0.0),
        ("contains", "It is Rome.", 1.0),
        ("fuzzy", "the capital is rome", 1.0),
        ("fuzzy", "Paris", 0.0),
    ],
)
def test_jsonl_scorers(scorer, completion, expected):
    t = task(
        "jsonl", data_path=str(DATA / "qa.jsonl"), scorer=scorer, train_size=4, eval_size=4, prompts_per_generation=2
    )
    e = next(e for s in (t.splits().train, t.splits().heldout) for e in s if e.answer == "Rome")
    assert t.reward(completion, e) == expected


def test_custom_reward_and_task_by_dotted_path():
    t = build_task(task_config("addition", reward="custom_example:shout_score"), seed=0)
    e = t.splits().train[0]
    assert t.reward(e.answer.upper(), e) == 1.0 and t.correct(e.answer.upper(), e)
    even = build_task(task_config("custom_example:EvenSumsTask", train_size=100), seed=0)
    assert even.splits().train and all(int(e.answer) % 2 == 0 for e in even.splits().train)
    with pytest.raises(ConfigError, match='task.reward="custom_example:nope"'):
        build_task(task_config("addition", reward="custom_example:nope"), seed=0)
    with pytest.raises(ConfigError, match='task.name="nomodule:Task"'):
        build_task(task_config("nomodule:Task"), seed=0)


@pytest.mark.parametrize(
    "content,where",
    [
        ('{"prompt": "a", "answer": "b"}\n{"prompt": "c", "answer": \n', "bad.jsonl:2: invalid JSON"),
        ('{"prompt": "a", "answer": "b"}\n\n{"prompt": "c"}\n', "bad.jsonl:3: missing field 'answer'"),
        ('{"prompt": "a", "answer": "b"}\n[1, 2]\n', "bad.jsonl:2: expected a JSON object"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, content, where):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=where.replace("[", r"\[")):
        task("jsonl", data_path=str(path), train_size=1, eval_size=1, prompts_per_generation=1).splits()


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", "", "the file is empty"),
        ("blank.jsonl", "\n  \n", "the file has no records"),
        ("none.json", "[\n]\n", "the file has no records"),
    ],
)
def test_a_data_file_without_records_is_named(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError) as error:
        task("jsonl", data_path=str(path), train_size=1, eval_size=1, prompts_per_generation=1).splits()
    assert str(error.value) == f"{path}: {message}"


def test_malformed_json_array_names_the_line_of_the_record(tmp_path):
    path = tmp_path / "cd.json"
    path.write_text('[\n  {"numbers": [1, 2], "target": 3},\n\n  {"numbers": [1, 2]}\n]\n')
    with pytest.raises(DataError, match=r"cd.json:4: missing field 'target'"):
        task("countdown", data_path=str(path), train_size=1, eval_size=1).splits()
    path.write_text('[\n  {"numbers": [1, 2], "target": 3},\n  {"numbers": [1, 2], "target": }\n]\n')
    with pytest.raises(DataError, match=r"cd.json:3: invalid JSON"):
        task("countdown", data_path=str(path), train_size=1, eval_size=1).splits()
    path.write_text('[\n  {"numbers": [1, 2], "target": "3"},\n  {"numbers": [1, 2], "target": "three"}\n]\n')
    with pytest.raises(DataError, match=r"cd.json:3: 'target' must be a number, or a string of one \(got 'three'\)"):
        task("countdown", data_path=str(path), train_size=1, eval_size=1).splits()


def test_gsm8k_answer_without_final_number(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"question": "q", "answer": "#### 3"}\n{"question": "q2", "answer": "no number here"}\n')
    with pytest.raises(DataError, match=r"g.jsonl:2: the answer has no final number"):
        task("gsm8k", data_path=str(path), train_size=1, eval_size=1).splits()


def test_hub_data_offline_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(
        ConfigError, match=r'task.dataset="evora-test/none": cannot load it from the hub.*task.data_path'
    ):
        task("gsm8k", dataset="evora-test/none").splits()  # offline and not cached: bad input, exit 2


def test_generated_countdown_holds_out_one_problem_in_eight_the_same_for_every_seed():
    from evora.tasks.builtin.countdown import is_heldout_problem

    cfg = task_config("countdown", train_size=40, selection_size=8, eval_size=16, max_number=12)
    first, other = build_task(cfg, 0).splits(), build_task(cfg, 1).splits()
    assert first.heldout == other.heldout and first.train != other.train
    assert (len(first.train), len(first.selection), len(first.heldout)) == (40, 8, 16)
    for splits in (first, other):
        held = lambda e: is_heldout_problem(e.data["numbers"], e.data["target"])  # noqa: E731
        assert all(map(held, splits.heldout)) and not any(map(held, (*splits.train, *splits.selection)))
        assert {n for e in (*splits.train, *splits.heldout) for n in e.data["numbers"]} <= set(range(1, 13))
    wide = build_task(task_config("countdown", train_size=40, eval_size=16), 0).splits()
    assert max(n for e in wide.train for n in e.data["numbers"]) > 12  # the paper's 1..99 by default
    assert {len(e.data["numbers"]) for e in (*first.train, *first.heldout)} == {3, 4}  # the paper's, by default


def test_generated_countdown_takes_the_counts_of_numbers_it_is_given():
    """task.numbers: the merge experiment's sub-tasks (3-number and 4-number problems)."""
    for counts in ([3], [4]):
        splits = build_task(task_config("countdown", train_size=40, eval_size=16, numbers=counts), 0).splits()
        assert {len(e.data["numbers"]) for e in (*splits.train, *splits.heldout)} == set(counts)
    for bad in ([], [1], [3, 7]):
        with pytest.raises(ConfigError) as error:
            get_task("countdown").check(task_config("countdown", numbers=bad))
        assert str(error.value).startswith(f"task.numbers={bad}: must be a non-empty list of integers in 2..6")
