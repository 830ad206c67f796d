import json

import pytest

from evora.config.schema import TaskConfig
from evora.errors import DataError
from evora.tasks import build_task, task_names
from evora.tasks.addition import heldout_pairs, is_heldout_pair, training_pairs
from evora.tasks.countdown import generate_problem, load_problems
from evora.tasks.rewards.countdown import answer_score


def test_registry_lists_the_tasks():
    assert {"addition", "countdown"} <= set(task_names())


def test_addition_splits_are_disjoint_and_deterministic():
    task = build_task(TaskConfig(name="addition", train_size=500, eval_size=100), seed=3)
    splits = task.splits()
    assert splits == build_task(TaskConfig(name="addition", train_size=500, eval_size=100), seed=3).splits()
    train = {(e.data["a"], e.data["b"]) for e in splits.train}
    held = {(e.data["a"], e.data["b"]) for e in splits.heldout}
    assert not train & held and all(is_heldout_pair(*p) for p in held)
    assert len(training_pairs()) + len(heldout_pairs()) == 100 * 100
    other_seed = build_task(TaskConfig(name="addition", train_size=500, eval_size=100), seed=4).splits()
    assert other_seed.heldout == splits.heldout  # held-out fixed so seeds compare
    assert other_seed.train != splits.train


def test_addition_reward():
    task = build_task(TaskConfig(name="addition"), seed=0)
    example = task.splits().train[0]
    assert task.reward(example.answer, example) == 1.0
    assert task.reward(example.answer + " 1+2=3", example) == 0.0


def test_generated_countdown_problems_are_solvable():
    import random

    rng = random.Random(0)
    for _ in range(200):
        problem = generate_problem(rng, count=rng.choice((3, 4)))
        solution = f"<answer>{problem['solution']}</answer>"
        assert answer_score(solution, problem["numbers"], problem["target"]) == 1.0, problem


def test_countdown_prompt_opens_the_think_block():
    task = build_task(TaskConfig(name="countdown", train_size=10, eval_size=5), seed=0)
    splits = task.splits()
    assert len(splits.train) == 10 and len(splits.heldout) == 5
    example = splits.train[0]
    assert example.prompt.endswith("<think>")
    completion = f"some thoughts</think>\n<answer>{example.answer}</answer>"
    assert task.reward(completion, example) == pytest.approx(1.1)


def test_countdown_file_loading_and_errors_name_file_and_line(tmp_path):
    good = tmp_path / "cd.json"
    good.write_text(json.dumps([{"context": "Q?", "numbers": [1, 2], "target": 3, "solution": "1+2"}]))
    assert load_problems(str(good))[0]["target"] == 3
    broken = tmp_path / "cd.jsonl"
    broken.write_text('{"numbers": [1, 2], "target": 3}\n{"numbers": [1, 2], "target": \n')
    with pytest.raises(DataError, match=r"cd.jsonl:2: invalid JSON"):
        load_problems(str(broken))
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"numbers": [1, 2], "target": 3}\n\n{"numbers": [4]}\n')
    with pytest.raises(DataError, match=r"missing.jsonl:3: missing field 'target'"):
        load_problems(str(missing))
