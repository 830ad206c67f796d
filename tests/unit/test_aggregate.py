"""task.aggregate over n samples per cell: pass@k and max@k against brute-force enumeration of
k-subsets, majority voting, and the built-in tasks' canonical answers agreeing with `correct`."""

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from evora.tasks import build_task, task_config
from evora.tasks.aggregate import AGGREGATES, CellOutcome, aggregate, majority_index, max_at_k, pass_at_k
from evora.tasks.base import AnswerTask

DATA = Path(__file__).resolve().parents[1] / "data"


def enumerated_pass_at_k(n, c, k):
    flags = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(flags, k))
    return sum(any(s) for s in subsets) / len(subsets)


def enumerated_max_at_k(rewards, k):
    subsets = list(itertools.combinations(rewards, k))
    return sum(max(s) for s in subsets) / len(subsets)


# pass@k ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_equals_enumeration_over_k_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(enumerated_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_special_cases():
    for n in (1, 4, 10):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)  # k = 1: the fraction correct
            assert pass_at_k(n, c, n) == (1.0 if c > 0 else 0.0)  # k = n: any correct
        assert pass_at_k(n, 0, 1) == 0.0  # c = 0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k: every 3-subset has a correct one
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)
    assert pass_at_k(10, 2, 3) == pytest.approx(1 - math.comb(8, 3) / math.comb(10, 3))


@pytest.mark.parametrize("n,c,k", [(3, 1, 0), (3, 1, 4), (0, 0, 1), (3, 4, 1), (3, -1, 1)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


# max@k ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rewards",
    [
        [0.5],
        [1.0, 1.0, 1.0],  # all tied
        [0.2, 0.7, 0.7, 0.1],  # tied maxima
        [0.3, 0.3, 0.9, 0.3, 0.0],  # tied lows
        [-2.0, 5.0, 5.0, -2.0, 1.5, 1.5],
    ],
)
def test_max_at_k_with_ties_equals_enumeration(rewards):
    for k in range(1, len(rewards) + 1):
        assert max_at_k(rewards, k) == pytest.approx(enumerated_max_at_k(rewards, k), abs=1e-12)


def test_max_at_k_on_random_graded_rewards_equals_enumeration():
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(1, 8)
        rewards = [rng.choice((rng.uniform(-3, 3), float(rng.randint(0, 2)))) for _ in range(n)]
        for k in range(1, n + 1):
            assert max_at_k(rewards, k) == pytest.approx(enumerated_max_at_k(rewards, k), abs=1e-12)


def test_max_at_k_of_binary_rewards_is_pass_at_k_and_k1_is_the_mean():
    for n in range(1, 7):
        for c in range(n + 1):
            rewards = [0.0] * (n - c) + [1.0] * c
            random.Random(n * 10 + c).shuffle(rewards)
            for k in range(1, n + 1):
                assert max_at_k(rewards, k) == pytest.approx(pass_at_k(n, c, k), abs=1e-12)
    assert max_at_k([0.1, 0.4, 0.7], 1) == pytest.approx(0.4)
    assert max_at_k([0.1, 0.4, 0.7], 3) == pytest.approx(0.7)


def test_max_at_k_non_finite_rewards():
    assert math.isnan(max_at_k([1.0, float("nan"), 0.0], 2))
    # -inf is never a max of 2 here: weight zero, skipped (0 * -inf would be NaN)
    assert max_at_k([float("-inf"), 1.0, 3.0], 2) == pytest.approx((1.0 + 3.0 + 3.0) / 3)
    assert max_at_k([float("-inf"), 1.0, 3.0], 1) == float("-inf")
    with pytest.raises(ValueError):
        max_at_k([1.0, 2.0], 3)


# majority -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answers,expected",
    [
        (["a"], 0),
        (["b", "a", "a"], 1),
        (["a", "b", "b", "a"], 0),  # tie: the answer that appears first
        (["b", "a", "a", "b"], 0),
        ([None, "x", "y", "y", "x"], 1),  # tie between x and y: x appears first
        ([None, None, "z", None], 2),
        ([None, "q", None, "r", "r"], 3),  # Nones never win, however many
        ([None, None], None),
        ([], None),
        (["", "", "a"], 0),  # "" is an answer (tasks return None for none)
    ],
)
def test_majority_index(answers, expected):
    assert majority_index(answers) == expected


# aggregate ------------------------------------------------------------------------------


def test_aggregate_mean():
    assert aggregate("mean", [1.0, 0.0, 0.5, 0.5], [True, False, False, True], None, 1) == CellOutcome(0.5, 0.5)
    assert math.isnan(aggregate("mean", [1.0, float("nan")], [True, True], None, 1).reward)  # NaN propagates
    assert aggregate("mean", [float("-inf"), 1.0], [False, True], None, 1).reward == float("-inf")


def test_aggregate_pass_at_k():
    rewards, correct = [0.0, 1.0, 0.2, 0.0], [False, True, False, False]
    out = aggregate("pass_at_k", rewards, correct, None, 2)
    assert out.correct == pytest.approx(enumerated_pass_at_k(4, 1, 2)) and out.correct == pytest.approx(0.5)
    assert out.reward == pytest.approx(enumerated_max_at_k(rewards, 2))
    assert aggregate("pass_at_k", rewards, correct, None, 1) == pytest.approx(CellOutcome(0.3, 0.25))
    with pytest.raises(ValueError):
        aggregate("pass_at_k", rewards, correct, None, 5)


def test_aggregate_majority():
    rewards, correct = [0.1, 0.9, 0.8, 0.0], [False, True, True, False]
    assert aggregate("majority", rewards, correct, ["7", "8", "8", None], 1) == CellOutcome(0.9, 1.0)
    assert aggregate("majority", rewards, correct, ["7", "8", "7", None], 1) == CellOutcome(0.1, 0.0)
    # no sample answers: the mean reward, not correct
    assert aggregate("majority", rewards, correct, [None] * 4, 1) == pytest.approx(CellOutcome(0.45, 0.0))
    with pytest.raises(ValueError):
        aggregate("majority", rewards, correct, None, 1)
    with pytest.raises(ValueError):
        aggregate("majority", rewards, correct, ["7"], 1)


def test_aggregate_rejects_unknown_methods_and_mismatched_lengths():
    assert AGGREGATES == ("mean", "pass_at_k", "majority")
    with pytest.raises(ValueError, match="allowed"):
        aggregate("median", [1.0], [True], None, 1)
    with pytest.raises(ValueError):
        aggregate("mean", [1.0, 0.0], [True], None, 1)
    with pytest.raises(ValueError):
        aggregate("mean", [], [], None, 1)


# canonical answers ----------------------------------------------------------------------


def task(name, **kwargs):
    return build_task(task_config(name, **kwargs), seed=0)


def pool(t):
    splits = t.splits()
    return [e for split in (splits.train, splits.selection, splits.heldout) for e in split]


def check_answers(t, example, expected, right, wrong, blank=()):
    """`right` completions are correct and answer `expected`; `wrong` ones are not correct and
    answer something else; `blank` ones give no answer."""
    assert isinstance(t, AnswerTask)
    for completion in right:
        assert t.correct(completion, example), completion
        assert t.answer(completion, example) == expected, completion
    for completion in wrong:
        assert not t.correct(completion, example), completion
        got = t.answer(completion, example)
        assert got is not None and got != expected, completion
    for completion in blank:
        assert not t.correct(completion, example) and t.answer(completion, example) is None, completion


def test_addition_answers():
    t = task("addition")
    e = t.splits().train[0]
    wrong = [str(int(e.answer) + 1), e.answer + " 1+2=3", "0" + e.answer]
    check_answers(t, e, e.answer, [e.answer, f"  {e.answer}\n"], wrong, ["", "   "])
    assert t.answer(wrong[0], e) == t.answer(f" {wrong[0]} ", e)


def test_arithmetic_answers():
    t = task("arithmetic", train_size=20, eval_size=5)
    e = t.splits().train[0]
    other = str(int(e.answer) + 1)
    right = [f"{e.data['expression']} = {e.answer}\n#### {e.answer}", f"so \\boxed{{{e.answer}}}", f"It is {e.answer}"]
    check_answers(t, e, e.answer, right, [f"#### {other}", f"{e.answer} or maybe {other}"], ["I don't know"])
    assert t.answer(f"#### {other}", e) == t.answer(f"The answer is {other}.", e) == other


def test_gsm8k_answers():
    t = task("gsm8k", data_path=str(DATA / "gsm8k_sample.jsonl"), train_size=10, eval_size=2)
    e = next(e for e in pool(t) if e.answer == "850")
    right = ["They sell 350 of 1,200 so 850 remain.\n#### 850", "\\boxed{850}", "#### 850.0", "#### 1700/2"]
    check_answers(t, e, "850", right, ["#### 851", "850 chickens, then 12 more", "#### 1,200"], ["no idea"])
    assert t.answer("#### 0.5", e) == t.answer("\\boxed{1/2}", e) == "1/2"  # one value, one string
    assert t.answer("#### -3", e) == "-3"


def test_mmlu_pro_answers():
    t = task("mmlu_pro", data_path=str(DATA / "mmlu_pro_sample.jsonl"), train_size=10, eval_size=2)
    e = next(e for e in pool(t) if "derivative" in e.prompt)
    right = ["The answer is (C).", "Answer: C", "C. 2x", "the answer is (c)"]
    check_answers(t, e, "C", right, ["The answer is (B).", "Answer: A"], ["I am not sure."])


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_jsonl_answers_by_scorer(tmp_path):
    exact = task("jsonl", data_path=str(DATA / "qa.jsonl"), scorer="exact", train_size=4, eval_size=4)
    e = next(e for e in pool(exact) if e.answer == "Rome")
    check_answers(exact, e, "Rome", ["Rome", " Rome\n"], ["Rome is the capital", "rome"], [""])

    numbers = write_jsonl(tmp_path / "n.jsonl", [{"prompt": f"q{i}", "answer": f"#### {i}.50"} for i in range(4)])
    numeric = task("jsonl", data_path=numbers, scorer="numeric", train_size=2, eval_size=2)
    e = next(e for e in pool(numeric) if e.prompt == "q3")
    check_answers(numeric, e, "7/2", ["3.5", "#### 3.50", "\\boxed{7/2}"], ["#### 3", "3.5 then 4"], ["none"])

    letters = write_jsonl(tmp_path / "c.jsonl", [{"prompt": f"q{i}", "answer": "ABCD"[i]} for i in range(4)])
    choice = task("jsonl", data_path=letters, scorer="choice", train_size=2, eval_size=2)
    e = next(e for e in pool(choice) if e.prompt == "q1")
    check_answers(choice, e, "B", ["The answer is (B)", "B. yes"], ["Answer: D"], ["maybe"])


def test_answers_of_equal_completions_agree_with_correct():
    """Over many completions: two correct ones give the same string, and a correct one and an
    incorrect one never do (so voting on answers is voting on correctness)."""
    t = task("arithmetic", train_size=5, eval_size=0)
    for e in t.splits().train:
        value = int(e.answer)
        completions = [f"#### {v}" for v in (value - 1, value, value + 1)] + [f"\\boxed{{{value}}}", str(value), "x"]
        for a, b in itertools.combinations(completions, 2):
            same = t.answer(a, e) is not None and t.answer(a, e) == t.answer(b, e)
            if t.correct(a, e) and t.correct(b, e):
                assert same
            if t.correct(a, e) != t.correct(b, e):
                assert not same


def test_tasks_without_a_canonical_answer(tmp_path):
    assert not isinstance(task("countdown"), AnswerTask)  # many equations reach one target
    assert not isinstance(task("conciseness", train_size=2, eval_size=8), AnswerTask)
    for scorer in ("fuzzy", "regex", "contains"):
        assert not isinstance(task("jsonl", data_path=str(DATA / "qa.jsonl"), scorer=scorer), AnswerTask)
    custom = build_task(task_config("addition", reward="custom_example:shout_score"), seed=0)
    assert not isinstance(custom, AnswerTask)


def test_mix_answers_only_when_every_family_has_them():
    mixed = task("mix", families={"addition": 1, "arithmetic": 1}, train_size=20, eval_size=4)
    assert isinstance(mixed, AnswerTask)
    for e in pool(mixed):
        assert mixed.answer(f"#### {e.answer}" if e.family == "arithmetic" else e.answer, e) == e.answer
    assert not isinstance(task("mix", families={"addition": 1, "countdown": 1}, train_size=4, eval_size=2), AnswerTask)
