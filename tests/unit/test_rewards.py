"""Golden tests of the scorers on hand-written completions."""

import pytest

from evora.tasks.rewards.countdown import answer_score, countdown_reward, format_score
from evora.tasks.rewards.exact import exact_answer
from evora.tasks.rewards.safe_eval import UnsafeExpression, evaluate_arithmetic


@pytest.mark.parametrize(
    "completion,expected", [("46", 1.0), (" 46\n", 1.0), ("46 12+3=15", 0.0), ("4", 0.0), ("", 0.0), ("046", 0.0)]
)
def test_exact_answer(completion, expected):
    assert exact_answer(completion, "46") == expected


@pytest.mark.parametrize("text,value", [("1+2*3", 7), ("(1 + 2) / 3", 1), ("10/4", 2.5), ("-3+5", 2)])
def test_safe_eval_values(text, value):
    assert evaluate_arithmetic(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",
        "9**9**9**9",
        "2**10",
        "1/0",
        "x+1",
        "(1).real",
        "1e5",
        "True+1",
        "[1]",
        "1;2",
        "1" * 300,
        "9" * 14,
        "١+١",
        "1\x00+1",
    ],
)
def test_safe_eval_rejects(text):
    with pytest.raises(UnsafeExpression):
        evaluate_arithmetic(text)


def test_countdown_reward_golden():
    numbers, target = [3, 5, 7], 22
    right = "<think>3*5 is 15, plus 7</think>\n<answer>3*5+7</answer>"
    assert countdown_reward(right, numbers, target) == pytest.approx(1.1)
    wrong_value = "<think>t</think>\n<answer>3*5-7</answer>"
    assert countdown_reward(wrong_value, numbers, target) == pytest.approx(0.1)
    reused = "<think>t</think>\n<answer>7+7+7+1</answer>"
    assert answer_score(reused, numbers, 22) == 0.0
    subset = "<think>t</think>\n<answer>3*7+1</answer>"  # 1 is not given
    assert answer_score(subset, numbers, 22) == 0.0
    partial_use = "<think>t</think>\n<answer>3*5</answer>"  # the paper: every number, exactly once
    assert answer_score(partial_use, numbers, 15) == 0.0
    assert answer_score(partial_use, numbers, 15, number_rule="at_most_once") == 1.0
    assert format_score("<answer>1</answer>") == 0.5
    assert format_score("<think>x</think> <answer>1</answer>") == pytest.approx(0.6)
    assert format_score("<think>x</think>\n<answer>1</answer> trailing") == pytest.approx(0.6)
    assert countdown_reward("no tags at all", numbers, target) == 0.0
    assert countdown_reward("<answer>__import__('os').system('x')</answer>", numbers, target) == pytest.approx(0.05)


# The ES paper's rules (countdown_task.py), each pinned by a hand-worked case.


@pytest.mark.parametrize(
    "answer,rule,expected",
    [
        ("3 + 5", "all_exactly_once", 0.0),  # 7 unused: the paper scores 0.1 (format only), the issue's example
        ("3 + 5", "at_most_once", 1.0),
        ("7 + 3 - 5 + 3", "all_exactly_once", 0.0),  # 3 twice, value 8
        ("(7 - 5) * 3 + 2", "all_exactly_once", 0.0),  # 2 is not given
        ("3 * 5 - 7", "all_exactly_once", 1.0),  # every number once, value 8
        ("5 - 7 + 3 * 1 + 7", "at_most_once", 0.0),  # 7 twice and 1 not given
    ],
)
def test_number_rule(answer, rule, expected):
    response = f"<think>t</think>\n<answer>{answer}</answer>"
    assert answer_score(response, [3, 5, 7], "8", number_rule=rule) == expected


def test_the_paper_scores_the_issue_example_0_1():
    response = "<think>3 plus 5</think>\n<answer>3 + 5</answer>"
    assert countdown_reward(response, [3, 5, 7], 8) == pytest.approx(0.1)
    assert countdown_reward(response, [3, 5, 7], 8, number_rule="at_most_once") == pytest.approx(1.1)


def test_answer_block_last_by_default():
    response = "<think>t</think>\n<answer>3 * 5 - 7</answer> or <answer>3 + 5 + 7</answer>"
    assert answer_score(response, [3, 5, 7], 8) == 0.0  # the last block (value 15) is scored
    assert answer_score(response, [3, 5, 7], 8, answer_block="first") == 1.0
    assert answer_score(response, [3, 5, 7], 15) == 1.0
    unclosed = "<think>t</think>\n<answer>3 * 5 - 7</answer> <answer>3 + 5 + 7"
    assert answer_score(unclosed, [3, 5, 7], 8) == 1.0  # an unclosed block is no block (the regex's view)


@pytest.mark.parametrize(
    "target,expected",
    [
        ("2.4", 1.0),  # 12 / 5 = 2.4 exactly
        ("2.400001", 1.0),  # within 1e-5
        ("2.40002", 0.0),  # off by 2e-5
        (2.4, 1.0),
        ("-2.4", 0.0),
    ],
)
def test_float_targets_within_the_paper_tolerance(target, expected):
    assert answer_score("<answer>12 / 5</answer>", [12, 5], target) == expected


def test_non_integer_target_of_a_long_division():
    # (49 - 2) / 22 = 2.1363636...: the paper's file writes str(float(...))
    assert answer_score("<answer>(49 - 2) / 22</answer>", [49, 2, 22], str((49 - 2) / 22)) == 1.0


@pytest.mark.parametrize(
    "response,expected",
    [
        ("<think>a</think>\n<answer>1</answer>", 1.0),
        ("<think>a</think>\n<answer>1</answer>\n", 1.0),  # the paper's `$` allows one final newline
        ("<think>a</think>\n<answer>1</answer>\n\n", 0.6),
        ("<think>a</think><answer>1</answer>", 0.6),  # no newline between the blocks
        ("<think>a</think>", 0.1),
        ("<answer>1</answer>", 0.5),
        ("", 0.0),
    ],
)
def test_format_score_as_the_paper(response, expected):
    assert format_score(response) == pytest.approx(expected)
