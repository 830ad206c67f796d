"""Golden tests of the registered scorers (numeric, choice, fuzzy, regex, contains, exact)
on hand-written completions: right, wrong, malformed and near-miss answers."""

import ast
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from evora.tasks.rewards import limits
from evora.tasks.rewards.choice import choice_match, extract_choice
from evora.tasks.rewards.contains import contains_answer
from evora.tasks.rewards.fuzzy import fuzzy_match
from evora.tasks.rewards.numeric import extract_final_answer, last_number, numbers_in, numeric_match, parse_number
from evora.tasks.rewards.regex_match import regex_match
from evora.tasks.rewards.scorers import SCORERS, scorer

REWARDS_DIR = Path(__file__).resolve().parents[2] / "evora" / "tasks" / "rewards"


@pytest.mark.parametrize(
    "text,value",
    [
        ("72", Fraction(72)),
        ("-3", Fraction(-3)),
        ("+4", Fraction(4)),
        ("1,234", Fraction(1234)),
        ("1,234,567.25", Fraction(4938269, 4)),
        ("3.50", Fraction(7, 2)),
        ("3/4", Fraction(3, 4)),
        ("-6/8", Fraction(-3, 4)),
        (" 72.0 ", Fraction(72)),
        ("0", Fraction(0)),
    ],
)
def test_parse_number_values(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-",
        "abc",
        "1e5",
        "1_000",
        "1,23",
        "1,2345",
        "12,34,567",
        "3.",
        ".5",
        "1/0",
        "$5",
        "50%",
        "1 2",
        "1..2",
        "٤٢",
        "４２",
        "4٢",
        "9" * (limits.MAX_NUMBER_CHARS + 1),
        "1\x002",
        "0x1F",
        "inf",
        "nan",
    ],
)
def test_parse_number_rejects(text):
    assert parse_number(text) is None


def test_parse_number_length_limit_is_inclusive():
    assert parse_number("9" * limits.MAX_NUMBER_CHARS) == Fraction(int("9" * limits.MAX_NUMBER_CHARS))


def test_numbers_in_and_last_number():
    text = "She had 1,234 apples, sold 3/4 of them at $2.50 each (5-3 = 2); ٤٢ and ４２ are not ASCII."
    assert numbers_in(text) == ["1,234", "3/4", "2.50", "5", "3", "2"]
    assert last_number(text) == "2"
    assert last_number("no digits here") is None
    assert numbers_in("x = -7, y = +8") == ["-7", "+8"]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
        ("#### 1,234", "1234"),
        ("first #### 5 then #### 6 more text 7", "6"),
        ("So the answer is \\boxed{5}.", "5"),
        ("\\boxed{1} is wrong; the answer is \\boxed{1,234}", "1234"),
        ("We get \\boxed{-3} in the end, and 9 checks.", "-3"),
        ("\\boxed{\\frac{3}{4}}", "3"),
        ("It costs $18 per day, so 7 days cost $126.", "126"),
        ("#### no number after the marker, but \\boxed{8}", "8"),
        ("unclosed \\boxed{12 and then 13", "13"),
        ("\\boxed{5 " + "x" * 2000 + "} 7", "7"),  # longer than MAX_BOXED_CHARS: not taken as an answer
        ("nothing numeric", None),
        ("", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize(
    "completion,answer,expected",
    [
        ("The answer is 72", "72", 1.0),
        ("The answer is 72.0", "72", 1.0),
        ("The answer is 720", "72", 0.0),
        ("The answer is 7.2", "72", 0.0),
        ("#### 1,234", "1234", 1.0),
        ("#### 1,234", "Some reasoning 600 + 634.\n#### 1,234", 1.0),
        ("so \\boxed{5}", "5", 1.0),
        ("so \\boxed{5}", "6", 0.0),
        ("It is 3/4 of the cake, i.e. 0.75", "3/4", 1.0),
        ("about 0.33333", "1/3", 0.0),
        ("about 0.3333333", "1/3", 1.0),
        ("-3 degrees", "-3", 1.0),
        ("3 degrees below zero", "-3", 0.0),
        ("no number at all", "72", 0.0),
        ("72", "no number", 0.0),
        ("٧٢", "72", 0.0),
        ("9" * 100, "9" * 100, 0.0),  # longer than MAX_NUMBER_CHARS: not parsed
    ],
)
def test_numeric_match(completion, answer, expected):
    assert numeric_match(completion, answer) == expected


def test_numeric_match_zero_tolerance_is_exact():
    assert numeric_match("1.0000000001", "1") == 1.0
    assert numeric_match("1.0000000001", "1", rel_tol=0.0, abs_tol=0.0) == 0.0
    assert numeric_match("1.000", "1", rel_tol=0.0, abs_tol=0.0) == 1.0


@pytest.mark.parametrize(
    "text,expected",
    [
        ("The answer is (C)", "C"),
        ("the answer is B.", "B"),
        ("Answer: D", "D"),
        ("ANSWER: **E**", "E"),
        ("The correct answer is option G", "G"),
        ("The answer is (b)", "B"),
        ("I think it's B or C... answer: D", "D"),
        ("Answer: A. On reflection, the answer is C", "C"),
        ("Options (A) and (B) are out, so (D)", "D"),
        ("C) because the others are wrong", "C"),
        ("B", "B"),
        ("  B.  ", "B"),
        ("**F**", "F"),
        ("The answer is a bit unclear", None),
        ("A man walks into a bar", None),
        ("I think so", None),
        ("The answer is (K)", None),  # not among the letters
        ("The answer is Bob", None),
        ("", None),
    ],
)
def test_extract_choice(text, expected):
    assert extract_choice(text) == expected


def test_extract_choice_letters_argument():
    assert extract_choice("The answer is (K)", letters="ABCDEFGHIJK") == "K"
    assert extract_choice("The answer is (C)", letters="AB") is None
    assert extract_choice("The answer is (C)", letters="") is None


@pytest.mark.parametrize(
    "completion,answer,expected",
    [
        ("The answer is (C)", "C", 1.0),
        ("The answer is (C)", " c ", 1.0),
        ("The answer is (C)", "B", 0.0),
        ("I think it's B or C... answer: D", "B", 0.0),
        ("I think it's B or C... answer: D", "D", 1.0),
        ("no letter", "A", 0.0),
        ("The answer is (C)", "", 0.0),
    ],
)
def test_choice_match(completion, answer, expected):
    assert choice_match(completion, answer) == expected


@pytest.mark.parametrize(
    "completion,answer,expected",
    [
        ("The capital of France is Paris.", "Paris", 1.0),
        ("THE CAPITAL is PARIS!", "paris", 1.0),
        ("The answer:   New\n York City, of course", "new york city", 1.0),
        ("It is 720", "72", 0.0),  # containment is on word boundaries
        ("The answer is 72.0", "72", 1.0),  # numeric value
        ("The answer is 1,234", "$1,234", 1.0),
        ("the answer is (C)", "C", 1.0),  # containment of the word "c"
        ("Answer: D", "C", 0.0),
        ("I think it's B or C... answer: D", "B", 1.0),  # containment comes first: lenient, as in LoRALab
        ("", "Paris", 0.0),
        ("anything", "", 0.0),
        ("anything", "   ", 0.0),
        ("anything ...", "...", 0.0),
    ],
)
def test_fuzzy_match(completion, answer, expected):
    assert fuzzy_match(completion, answer) == expected


def test_fuzzy_overlap_threshold():
    answer5 = "alpha beta gamma delta epsilon"
    assert fuzzy_match("epsilon then alpha, gamma; beta", answer5) == 1.0  # 4/5 = 80%, not contained
    assert fuzzy_match("epsilon then alpha, gamma", answer5) == 0.0  # 3/5
    answer9 = "one two three four five six seven eight nine"
    assert fuzzy_match("nine eight seven six five four three two", answer9) == 1.0  # 8/9 ≈ 89%
    assert fuzzy_match("nine eight seven six five four three", answer9) == 0.0  # 7/9 ≈ 78%
    answer10 = "a1 a2 a3 a4 a5 a6 a7 a8 a9 a10"
    assert fuzzy_match("a10 a9 a8 a7 a6 a5 a4 a3", answer10) == 1.0  # 8/10 exactly
    assert fuzzy_match("a10 a9 a8 a7 a6 a5 a4", answer10) == 0.0  # 7/10
    assert fuzzy_match("beta beta beta beta alpha", "alpha beta beta beta beta gamma") == 0.0  # distinct: 2/3


@pytest.mark.parametrize(
    "completion,pattern,expected",
    [
        ("The answer is 42.", r"\b42\b", 1.0),
        ("The answer is 420.", r"\b42\b", 0.0),
        ("<answer>yes</answer>", r"<answer>\s*(yes|no)\s*</answer>", 1.0),
        ("anything", "(", 0.0),  # invalid pattern
        ("a" * 50_000 + "!", r"(a+)+$", 0.0),  # catastrophic backtracking: times out
    ],
)
def test_regex_match(completion, pattern, expected):
    assert regex_match(completion, pattern) == expected


def test_regex_match_sees_only_the_clipped_completion():
    assert regex_match("x" * limits.MAX_CHARS + "needle", "needle") == 0.0
    assert regex_match("x" * (limits.MAX_CHARS - 6) + "needle", "needle") == 1.0


@pytest.mark.parametrize(
    "completion,answer,expected",
    [
        ("The answer is Paris.", "Paris", 1.0),
        ("The answer is paris.", "Paris", 0.0),
        ("The answer is Paris.", "  Paris\n", 1.0),
        ("anything", "  ", 0.0),
        ("", "Paris", 0.0),
    ],
)
def test_contains_answer(completion, answer, expected):
    assert contains_answer(completion, answer) == expected


def test_registry():
    assert set(SCORERS) == {"exact", "numeric", "fuzzy", "regex", "contains", "choice"}
    assert scorer("numeric")("#### 72", "72") == 1.0
    assert scorer("regex")("abc123", r"\d+") == 1.0
    assert scorer("exact")(" 46\n", "46") == 1.0
    with pytest.raises(KeyError, match="allowed: choice, contains, exact, fuzzy, numeric, regex"):
        scorer("nope")


def test_limits():
    assert limits.clip("x" * (limits.MAX_CHARS + 10)) == "x" * limits.MAX_CHARS
    assert limits.clip("short") == "short"


def test_reward_modules_import_only_stdlib_and_regex():
    allowed = set(sys.stdlib_module_names) | {"regex", "evora"}
    for path in sorted(REWARDS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
                if name.startswith("evora"):
                    assert name.startswith("evora.tasks.rewards"), f"{path.name} imports {name}"
