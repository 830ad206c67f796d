"""task=mix: families, their shares of every split, held-out-only families, per-family
rewards and prompt templates."""

from __future__ import annotations

from collections import Counter

import pytest

from evora.tasks import build_task, task_config
from evora.tasks.builtin.mix import shares
from evora.tasks.prompts import PromptRenderer


def mix(**overrides):
    cfg = dict(name="mix", families={"addition": 1, "arithmetic": 3}, train_size=100, eval_size=40, selection_size=20)
    return build_task(task_config(**{**cfg, **overrides}), seed=3)


@pytest.mark.parametrize("total", [0, 1, 7, 100, 101])
def test_shares_follow_the_weights_and_sum_exactly(total):
    split = shares(total, {"x": 1, "y": 3, "z": 0.5})
    assert sum(split.values()) == total
    assert all(abs(split[k] - total * w / 4.5) < 1 for k, w in {"x": 1, "y": 3, "z": 0.5}.items())


def test_every_example_carries_its_family_and_splits_follow_the_weights():
    splits = mix().splits()
    assert Counter(e.family for e in splits.train) == {"addition": 25, "arithmetic": 75}
    assert Counter(e.family for e in splits.selection) == {"addition": 5, "arithmetic": 15}
    assert Counter(e.family for e in splits.heldout) == {"addition": 10, "arithmetic": 30}
    assert mix().splits() == splits  # the same for the same seed
    heldout_prompts = {e.prompt for e in splits.heldout}
    assert not heldout_prompts & {e.prompt for e in splits.train}


def test_heldout_families_appear_only_in_the_heldout_split():
    splits = mix(heldout_families=["arithmetic"]).splits()
    assert {e.family for e in splits.train} == {e.family for e in splits.selection} == {"addition"}
    assert len(splits.train) == 100 and len(splits.selection) == 20
    assert Counter(e.family for e in splits.heldout) == {"addition": 10, "arithmetic": 30}


def test_a_zero_weight_leaves_a_family_out():
    splits = mix(families={"addition": 1, "arithmetic": 0}).splits()
    assert {e.family for e in splits.heldout} == {"addition"}


def test_rewards_and_templates_are_the_family_own():
    task = mix()
    splits = task.splits()
    addition = next(e for e in splits.heldout if e.family == "addition")
    arithmetic = next(e for e in splits.heldout if e.family == "arithmetic")
    assert task.reward(addition.answer, addition) == 1.0 and task.reward(addition.answer + " 1+1=2", addition) == 0.0
    assert task.reward(f"so #### {arithmetic.answer}", arithmetic) == 1.0  # the numeric family's own rule

    class Plain:
        chat_template = None

    renderer = PromptRenderer(Plain(), "plain", task.plain_template)
    assert renderer.text(addition) == addition.prompt
    assert renderer.text(arithmetic) == f"Question: {arithmetic.prompt}\nAnswer: "
