"""Every scorer on a corpus of hostile completions: no exception escapes, results are
floats in range, nothing is executed (audit hook), and every call stays under 50 ms of CPU time."""

import math
import os
import sys
import time
from fractions import Fraction

import pytest

from evora.tasks.rewards.countdown import countdown_reward
from evora.tasks.rewards.exact import exact_answer
from evora.tasks.rewards.safe_eval import UnsafeExpression, evaluate_arithmetic
from evora.tasks.rewards.scorers import SCORERS

MB = 1_000_000
PWNED = "/tmp/pwned"
ANSWERS = ["42", "B", "hello world", r"(a+)+$"]
# Super-linear scoring (regex backtracking) takes seconds to hours on 1 MB; the linear work takes
# ~10-40 ms. 0.25 s tells them apart even when parallel tests load the machine.
MAX_SECONDS = 0.25
REPEATS = 3
EXECUTION_EVENTS = frozenset(
    {
        "exec",
        "os.system",
        "subprocess.Popen",
        "os.posix_spawn",
        "os.exec",
        "os.spawn",
        "socket.connect",
        "os.fork",
        "os.forkpty",
    }
)

# Audit hooks cannot be removed: install one per process, recording only while a test asks.
_AUDIT = {"installed": False, "recording": False, "events": []}


def _audit_hook(event, args):
    if _AUDIT["recording"] and event in EXECUTION_EVENTS:
        _AUDIT["events"].append((event, repr(args)[:200]))


def _install_audit_hook():
    if not _AUDIT["installed"]:
        sys.addaudithook(_audit_hook)
        _AUDIT["installed"] = True


def _payloads():
    shell = "__import__('os').system('touch /tmp/pwned')"
    return {
        "import_os": shell,
        "eval": f'eval("{shell}")',
        "exec": "exec('import os; os.system(\"touch /tmp/pwned\")')",
        "subprocess": "__import__('subprocess').Popen(['touch', '/tmp/pwned'])",
        "subclasses": "().__class__.__bases__[0].__subclasses__()",
        "lambda": "(lambda: __import__('os').system('touch /tmp/pwned'))()",
        "fstring": 'f\'{__import__("os").system("touch /tmp/pwned")}\'',
        "pow_tower": "9**9**9**9",
        "pow_big": "2**10**10",
        "shift_big": "1<<10**9",
        "mul_chain": "*".join(["999999"] * 40),
        "div_zero": "1/0",
        "float_exp": "1e999999",
        "inf_nan": "inf nan -inf NaN Infinity",
        "digits_1e6": "9" * MB,
        "digits_mixed_1mb": "1234567890" * (MB // 10),
        "commas_1mb": "1" + ",234" * (MB // 4),
        "bad_commas_1mb": "1," * (MB // 2),
        "fractions_1mb": "1/" * (MB // 2) + "1",
        "signs_1mb": "-" * MB + "1",
        "decimal_points_1mb": "1." * (MB // 2),
        "open_parens_1mb": "(" * MB,
        "close_parens_1mb": ")" * MB,
        "answer_tags_unclosed": "<answer>" * (MB // 8),
        "think_tags_unclosed": "<think>" * (MB // 7),
        "hash_markers": "####" * (MB // 4),
        "hash_then_huge_number": "#### " + "7" * MB,
        "boxed_unclosed": "\\boxed{" * (MB // 7),
        "boxed_braces": "\\boxed{" + "{" * MB,
        "boxed_huge_number": "\\boxed{" + "8" * MB + "}",
        "closing_braces": "}" * MB,
        "nested_parens": "(" * 5000 + "1" + ")" * 5000,
        "nested_brackets": "[" * 5000 + "]" * 5000,
        "nested_sum": "(" * 3000 + "+".join(["1"] * 3000) + ")" * 3000,
        "unary_chain": "-" * 10_000 + "1",
        "nul_bytes": "\x00" * MB,
        "nul_in_number": "4\x002" * 1000,
        "nul_in_tags": "<answer>3\x00*5+7</answer>",
        "arabic_indic": "The answer is ٤٢ ٤٢ ٤٢",
        "extended_arabic_indic": "#### ۴۲",
        "full_width": "\\boxed{４２}",
        "devanagari": "answer: ४२",
        "math_bold_digits": "The answer is 𝟒𝟐",
        "superscripts": "x² + y³ = ⁴²",
        "mixed_script_digits": "4٢ and ４2 and 1,٢٣٤",
        "unbalanced_tags": "<think><answer></think></answer><answer>",
        "reversed_tags": "</answer>42<answer></think>x<think>",
        "nested_tags": "<answer>" * 1000 + "3*5+7" + "</answer>" * 1000,
        "repeated_number": "42 " * 100_000,
        "repeated_number_commas": "1,234 " * 100_000,
        "long_line_letters": "x" * MB,
        "long_line_alnum": "a1" * (MB // 2),
        "regex_bomb": "a" * 50_000 + "!",
        "regex_bomb_long": "a" * MB + "!",
        "answer_is_spaces": "answer" + " " * MB + "B",
        "answer_is_repeated": "The answer is " * 70_000,
        "answer_colon_repeated": "Answer:" * 140_000,
        "paren_letters": "(A" * (MB // 2),
        "paren_letters_closed": "(B)" * (MB // 3),
        "letters_only": "ABCDEFGHIJ" * (MB // 10),
        "rtl_override": "\u202e42 si rewsna ehT\u202c",
        "zero_width": "4\u200b2 \u200d\ufeff answer\u200b: B",
        "combining_marks": "e\u0301" * 200_000,
        "dotted_capital_i": "İ" * 200_000,
        "sharp_s": "ß" * 200_000,
        "emoji": "🙂🧨💣" * 100_000,
        "max_code_point": "\U0010ffff" * 100_000,
        "replacement_char": "\ufffd" * 100_000,
        "private_use": "\ue000\uf8ff" * 100_000,
        "newlines": "\n" * MB,
        "mixed_whitespace": " \t\r\n\x0b\x0c\u2028\u2029\u00a0\u3000" * 100_000,
        "punctuation": "!?.,;:'\"-" * 100_000,
        "hello_world_spam": "hello world " * 100_000,
        "format_string": "%s%n%x{0}{__class__}" * 1000,
        "sql_and_shell": "'; DROP TABLE x; -- $(touch /tmp/pwned) `touch /tmp/pwned`",
        "pickle_bytes": "cos\nsystem\n(S'touch /tmp/pwned'\ntR.",
        "empty": "",
        "whitespace_only": "   \n\t ",
    }


def _wrappers():
    return {
        "raw": lambda p: p,
        "answer_block": lambda p: f"<think>t</think>\n<answer>{p}</answer>",
        "hash_marker": lambda p: f"#### {p}",
        "boxed": lambda p: f"\\boxed{{{p}}}",
        "answer_is": lambda p: f"The answer is {p}",
    }


def _corpus():
    return [
        (f"{payload_name}/{wrapper_name}", wrap(payload))
        for payload_name, payload in _payloads().items()
        for wrapper_name, wrap in _wrappers().items()
    ]


CORPUS = _corpus()
_SLOWEST = {"seconds": 0.0, "call": None}


def _calls(text):
    """(label, thunk, lowest allowed, highest allowed) for every function scored on `text`."""
    calls = [
        (f"{name}[{answer!r}]", (lambda f=fn, a=answer: f(text, a)), 0.0, 1.0)
        for name, fn in SCORERS.items()
        for answer in ANSWERS
    ]
    calls += [(f"exact_answer[{answer!r}]", (lambda a=answer: exact_answer(text, a)), 0.0, 1.0) for answer in ANSWERS]
    calls.append(("countdown_reward", lambda: countdown_reward(text, [3, 5, 7], 22), 0.0, 1.1))
    return calls


def _fastest(thunk):
    """The result and the least CPU time of REPEATS calls. CPU time, not wall time: the work a
    call does does not depend on what else the machine runs (other test workers, other runs),
    and it is what the regex timeout bounds (the `regex` package counts CPU time)."""
    best, result = math.inf, None
    for _ in range(REPEATS):
        start = time.process_time()
        result = thunk()
        best = min(best, time.process_time() - start)
    return result, best


def _evaluate_or_none(text):
    try:
        return evaluate_arithmetic(text)
    except UnsafeExpression:  # the one function allowed to raise, and only this
        return None


@pytest.fixture(scope="module", autouse=True)
def _warm_up_and_report():
    # First calls may import modules lazily (an "exec" audit event that is not model output being run).
    for fn in SCORERS.values():
        fn("The answer is 42", "42")
    countdown_reward("<answer>1</answer>", [1], 1)
    _evaluate_or_none("1+1")
    _install_audit_hook()
    yield
    print(f"\nslowest scoring call: {_SLOWEST['seconds'] * 1000:.2f} ms ({_SLOWEST['call']})")


@pytest.fixture
def recorded_events():
    existed_before = os.path.exists(PWNED)
    mtime_before = os.path.getmtime(PWNED) if existed_before else None
    _AUDIT["events"].clear()
    _AUDIT["recording"] = True
    try:
        yield _AUDIT["events"]
    finally:
        _AUDIT["recording"] = False
    if existed_before:
        assert os.path.getmtime(PWNED) == mtime_before, f"{PWNED} was touched"
    else:
        assert not os.path.exists(PWNED), f"{PWNED} was created"


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 200
    assert len({name for name, _ in CORPUS}) == len(CORPUS)


def test_audit_hook_sees_exec_but_not_compile(recorded_events):
    import ast

    ast.parse("1 + 1", mode="eval")
    assert recorded_events == []
    exec("pass")  # the detector must see real execution
    assert [event for event, _ in recorded_events] == ["exec"]
    recorded_events.clear()


@pytest.mark.parametrize("name,text", CORPUS, ids=[name for name, _ in CORPUS])
def test_hostile_completion(name, text, recorded_events):
    for label, thunk, low, high in _calls(text):
        result, seconds = _fastest(thunk)
        assert type(result) is float and low <= result <= high, f"{label} returned {result!r}"
        assert seconds < MAX_SECONDS, f"{label} took {seconds * 1000:.1f} ms"
        if seconds > _SLOWEST["seconds"]:
            _SLOWEST.update(seconds=seconds, call=f"{label} on {name}")
    value, seconds = _fastest(lambda: _evaluate_or_none(text))
    assert value is None or isinstance(value, Fraction)
    assert seconds < MAX_SECONDS, f"evaluate_arithmetic took {seconds * 1000:.1f} ms"
    assert recorded_events == [], f"execution during scoring: {recorded_events}"


@pytest.mark.parametrize("name,text", CORPUS[::5], ids=[name for name, _ in CORPUS[::5]])
def test_hostile_reference_answers(name, text, recorded_events):
    # References come from datasets, not from the model, but must not break scoring either.
    for scorer_name, fn in SCORERS.items():
        if scorer_name == "regex":  # the answer is a pattern, chosen by the user
            continue
        result, seconds = _fastest(lambda: fn("The answer is 42, i.e. (B)", text))
        assert type(result) is float and 0.0 <= result <= 1.0, f"{scorer_name} returned {result!r}"
        assert seconds < MAX_SECONDS, f"{scorer_name} took {seconds * 1000:.1f} ms"
    assert recorded_events == []
