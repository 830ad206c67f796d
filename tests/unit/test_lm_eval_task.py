"""task=lm_eval (evora/tasks/builtin/lm_eval_task.py) on the repository's lm-eval task (tests/data/lm_eval):
its splits hold every document once with lm-eval's own zero-shot prompt, and its reward is
lm-eval's own per-document metric of the completion cut where lm-eval's generation stops; the
kinds of task it does not take are refused in one line, before Ray."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lm_eval.tasks import TaskManager

from evora.errors import ConfigError
from evora.plan.compose import compose_run
from evora.tasks import build_task

TASKS = Path(__file__).resolve().parents[1] / "data" / "lm_eval"
SIZES = ["task.train_size=20", "task.selection_size=4", "task.eval_size=8", "task.prompts_per_generation=8"]


def overrides(name: str) -> list[str]:
    return ["task=lm_eval", f"task.lm_eval_task={name}", f"task.lm_eval_path={TASKS}", *SIZES]


@pytest.fixture(scope="module")
def task():
    return build_task(compose_run(overrides("evora_addition")).task, 0)


@pytest.fixture(scope="module")
def reference():
    """lm-eval's own task object, loaded from the task folder as lm-eval reads local data."""
    cwd = Path.cwd()
    os.chdir(TASKS)
    try:
        return TaskManager(include_path=str(TASKS)).load_task_or_group(["evora_addition"])["evora_addition"]
    finally:
        os.chdir(cwd)


def test_the_splits_hold_documents_once_with_lm_evals_own_prompts(task, reference):
    splits = task.splits()
    assert (len(splits.train), len(splits.selection), len(splits.heldout)) == (20, 4, 8)
    examples = [*splits.train, *splits.selection, *splits.heldout]
    docs = list(reference.test_docs())
    assert len({e.prompt for e in examples}) == len(examples)  # no document twice
    own = {reference.fewshot_context(doc, num_fewshot=0): str(reference.doc_to_target(doc)) for doc in docs}
    assert all(own[e.prompt] == e.answer and e.rendered == e.prompt for e in examples)


@pytest.mark.parametrize("completion", ["{answer}", "{answer}\n12+3=15", "{answer} ", " {answer}", "1{answer}", ""])
def test_the_reward_is_lm_evals_own_metric_of_the_completion_cut_at_its_stop_strings(task, reference, completion):
    example = task.splits().heldout[0]
    text = completion.format(answer=example.answer)
    generated = text.split("\n")[0]  # lm-eval's generation stops at the task's `until` ("\n")
    expected = reference.process_results(example.data["doc"], [generated])["exact_match"]
    assert task.reward(text, example) == expected
    assert task.correct(text, example) == (expected == 1.0)


def test_tasks_it_cannot_take_are_refused_in_one_line_before_ray():
    with pytest.raises(ConfigError, match="output_type loglikelihood; supported: generate_until"):
        compose_run(overrides("evora_addition_choice"))
    with pytest.raises(ConfigError, match="task.lm_eval_task=nope: no such lm-eval task"):
        compose_run(overrides("nope"))
    with pytest.raises(ConfigError, match="task.lm_eval_task=null"):
        compose_run(["task=lm_eval"])
