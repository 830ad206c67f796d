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
    partial_use = "<think>t</think>\n<answer>3*5</answer>"  # not every number must be used
    assert answer_score(partial_use, numbers, 15) == 1.0
    assert format_score("<answer>1</answer>") == 0.5
    assert format_score("<think>x</think> <answer>1</answer>") == pytest.approx(0.6)
    assert format_score("<think>x</think>\n<answer>1</answer> trailing") == pytest.approx(0.6)
    assert countdown_reward("no tags at all", numbers, target) == 0.0
    assert countdown_reward("<answer>__import__('os').system('x')</answer>", numbers, target) == pytest.approx(0.05)
