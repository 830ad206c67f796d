"""evora/jobs/benchmarks.py's table without lm-eval running: the difference's standard error paired
over the same documents (against numpy), the per-document values read from lm-eval's samples, and
`evora eval`'s lm-eval options checked in one line. (Against lm-eval's own simple_evaluate:
tests/integration/test_benchmarks.py.)"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from evora.commands.evaluate import EvalOptions, eval_options
from evora.errors import ConfigError
from evora.jobs.benchmarks import Evaluation, LmEvalOptions, compare, paired_stderr, per_document

KEY = "exact_match,none"


def outcomes(seed: int, n: int = 40) -> tuple[dict[int, float], dict[int, float]]:
    """A base model's 0/1 scores and an adapter's that agree with them on most documents."""
    rng = random.Random(seed)
    base = {d: float(rng.random() < 0.4) for d in range(n)}
    other = {d: (1.0 - v if rng.random() < 0.2 else v) for d, v in base.items()}
    return base, other


def mean(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_paired_standard_error_is_the_standard_error_of_the_per_document_differences(seed):
    base, other = outcomes(seed)
    differences = np.array([other[d] - base[d] for d in sorted(base)])
    reference = differences.std(ddof=1) / math.sqrt(len(differences))
    assert paired_stderr(base, other, (mean(base), mean(other))) == pytest.approx(reference, rel=1e-12)
    # Scored on the same documents, the two are correlated: the paired error is well under the
    # unpaired one (each mean's own error, added as if independent).
    unpaired = math.hypot(*(np.std(list(v.values()), ddof=1) / math.sqrt(len(v)) for v in (base, other)))
    assert reference < 0.8 * unpaired


def test_no_paired_error_where_the_documents_differ_or_the_metric_is_no_mean():
    base, other = outcomes(0)
    assert paired_stderr(base, {d: v for d, v in other.items() if d}, (mean(base), mean(other))) is None
    assert paired_stderr(base, other, (mean(base), 0.123)) is None  # aggregated otherwise (bleu, perplexity)
    assert paired_stderr({0: 1.0}, {0: 0.0}, (1.0, 0.0)) is None  # one document: no spread


def test_rows_carry_the_paired_error_read_from_lm_evals_samples():
    base, other = outcomes(3)

    def evaluation(values: dict[int, float]) -> Evaluation:
        samples = {
            "t": [
                {"doc_id": d, "filter": "none", "metrics": ["exact_match"], "exact_match": v} for d, v in values.items()
            ]
        }
        return Evaluation({"t": {KEY: (mean(values), 0.05)}}, per_document(samples), samples)

    [row] = compare(evaluation(base), evaluation(other))
    assert (row["task"], row["metric"], row["difference"]) == ("t", KEY, mean(other) - mean(base))
    assert row["difference_stderr"] == paired_stderr(base, other, (mean(base), mean(other)))
    assert (row["base_stderr"], row["export_stderr"]) == (0.05, 0.05)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("num_fewshot=two", "num_fewshot=two: a count"),
        ("limit=-3", "limit=-3: a count"),
        ("apply_chat_template=maybe", "apply_chat_template=maybe: allowed: true, false"),
        ("log_samples=[1]", "log_samples=[1]: allowed: true, false"),
        ("benchmarks=[]", "benchmarks=[]: tasks as [a,b]"),
        ("split=test", "split=test: allowed: heldout, selection, train"),
        ("compare=true", "adapter: required"),
        ("benchmarks=[a,b", "malformed override 'benchmarks=[a,b'"),
    ],
)
def test_evals_options_are_hydra_overrides_checked_in_one_line(option, message):
    adapter = [] if option.startswith("compare") else ["adapter=base"]
    with pytest.raises(ConfigError) as error:
        eval_options([*adapter, option])
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_evals_options_are_typed_by_hydras_grammar_and_the_rest_are_config_overrides():
    argv = ["adapter=a/b", "benchmarks=[gsm8k,arc_easy]", "num_fewshot=1", "apply_chat_template=true", "seed=3"]
    options, overrides = eval_options([*argv, "task.eval_size=8", "limit=5", "compare=True"])
    assert options == EvalOptions(
        adapter="a/b", compare=True, benchmarks=["gsm8k", "arc_easy"], limit=5, num_fewshot=1, apply_chat_template=True
    )
    assert overrides == ["seed=3", "task.eval_size=8"]
    assert eval_options(["adapter=base", "benchmarks=gsm8k"])[0].benchmarks == ["gsm8k"]  # one task, no brackets
    assert LmEvalOptions() == LmEvalOptions(None, None, False, False)  # every option off unless given
