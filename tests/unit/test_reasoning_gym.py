"""task=reasoning_gym: problems from reasoning-gym's procedural datasets, scored by each dataset's
own score_answer in reward processes; its settings checked by name, type and the dataset's own
rules before Ray; the same splits for the same seed, held-out the same for every seed and never
in train; reasoning-gym datasets as task=mix's families."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from evora.errors import ConfigError
from evora.plan.compose import compose_run
from evora.tasks import build_task, task_config
from evora.tasks.base import AnswerTask
from evora.tasks.builtin.gym import TAGS_INSTRUCTION
from evora.tasks.registry import get_task, isolated_reward, reads_hub_data
from evora.tasks.reward_pool import RewardPool, reward_scorer

SMALL = {"train_size": 40, "eval_size": 12, "selection_size": 6}
CHAIN_SUM = {"dataset": "chain_sum", "options": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}


def gym_task(seed: int = 0, **fields):
    return build_task(task_config("reasoning_gym", **{**SMALL, **CHAIN_SUM, **fields}), seed)


def test_splits_are_seeded_disjoint_and_held_out_the_same_for_every_seed():
    first, again, other = gym_task(1).splits(), gym_task(1).splits(), gym_task(2).splits()
    assert first == again
    assert (len(first.train), len(first.selection), len(first.heldout)) == (40, 6, 12)
    assert first.heldout == other.heldout and first.train != other.train
    for splits in (first, other):  # single digits: few problems, so many a draw's problems are held out
        held = {e.prompt for e in splits.heldout}
        assert not held & {e.prompt for e in (*splits.train, *splits.selection)}


def test_a_completion_is_scored_by_the_datasets_own_score_answer():
    import reasoning_gym

    task = gym_task()
    example = task.splits().heldout[0]
    entry = example.data["entry"]
    scorer = reasoning_gym.create_dataset("chain_sum", size=1, seed=0)
    assert example.prompt.endswith(TAGS_INSTRUCTION) and example.answer == entry["answer"]
    for completion in (example.target, f"so <answer>{entry['answer']}</answer>", "<answer>no</answer>", "garbage"):
        answer = reasoning_gym.utils.extract_answer(completion)
        assert task.reward(completion, example) == scorer.score_answer(answer, entry)
    assert task.correct(example.target, example) and not task.correct("garbage", example)
    raw = gym_task(answer_format="raw")
    plain = raw.splits().heldout[0]
    assert plain.prompt == entry["question"] and raw.correct(f" {plain.answer}\n", plain)
    assert task.extracted(f"<answer>{entry['answer']}</answer>") == entry["answer"]
    assert not isinstance(task, AnswerTask)  # many datasets accept more than one answer: no majority vote


def test_its_reward_runs_in_reward_processes_and_its_data_is_made_here():
    cfg = task_config("reasoning_gym", **SMALL, **CHAIN_SUM)
    assert isolated_reward(cfg) and not reads_hub_data(cfg)
    assert not isolated_reward(task_config("reasoning_gym", **SMALL, **CHAIN_SUM, reward="judge"))
    scorer = reward_scorer(build_task(cfg, 0), cfg, 0)
    try:
        assert isinstance(scorer, RewardPool)
        examples = gym_task().splits().heldout[:4]
        scores = scorer.score([e.target for e in examples], list(examples))
        assert list(scores.rewards) == [1.0] * 4
    finally:
        scorer.close()
    mix = task_config("mix", families={"addition": 1, "reasoning_gym_chain_sum": 1}, **SMALL)
    assert isolated_reward(mix) and not isolated_reward(task_config("mix", families={"addition": 1}, **SMALL))


@pytest.mark.parametrize(
    "override,message",
    [
        ("task.dataset=nope", 'task.dataset="nope": not a reasoning-gym dataset; allowed: ab, acre,'),
        ("+task.options.min_term=2", "task.options.min_term=2: not a setting of chain_sum; allowed: min_terms,"),
        ("+task.options.min_terms=two", 'task.options.min_terms="two": must be a int, like its default 2'),
        ("+task.options.allow_negation=1", "task.options.allow_negation=1: must be a bool, like its default False"),
        ("+task.options.min_terms=9", "task.options={'min_terms': 9}: chain_sum refuses them ("),
        ("task.answer_format=json", 'task.answer_format="json": allowed: tags, raw'),
        ("task.plugins=[no_such_module]", 'task.plugins="no_such_module": cannot import it ('),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        compose_run(["task=reasoning_gym", "task.dataset=chain_sum", override])
    assert str(error.value).startswith(message), str(error.value)
    with pytest.raises(ConfigError, match=r"^task\.dataset=None: task=reasoning_gym needs a dataset"):
        compose_run(["task=reasoning_gym", "task.dataset=null"])


def test_options_take_their_defaults_types():
    run = compose_run(["task=reasoning_gym", "task.dataset=countdown", "+task.options.operators=[+,-]"])
    task = build_task(run.task, 0)
    assert task.options == {"operators": ("+", "-")}
    run = compose_run(["task=reasoning_gym", "task.dataset=leg_counting", "+task.options.min_animals=2"])
    assert build_task(run.task, 0).options == {"min_animals": 2}


def test_a_mix_takes_reasoning_gym_datasets_as_families_each_with_its_options():
    run = compose_run(
        [
            "task=mix",
            "task.families.arithmetic=0",
            "+task.families.reasoning_gym_chain_sum=1",
            "+task.family_options.reasoning_gym_chain_sum.options={max_digits: 1}",
            "task.eval_size=8",
        ]
    )
    mix = build_task(run.task, 0)
    heldout = mix.splits().heldout
    assert {e.family for e in heldout} == {"addition", "reasoning_gym_chain_sum"}
    gym = next(e for e in heldout if e.family == "reasoning_gym_chain_sum")
    assert mix.reward(gym.target, gym) == 1.0 and mix.families["reasoning_gym_chain_sum"].options == {"max_digits": 1}
    with pytest.raises(ConfigError) as error:
        compose_run(["task=mix", "+task.families.reasoning_gym_nope=1"])
    assert str(error.value).startswith('task.families.reasoning_gym_nope: task.dataset="nope": not a reasoning-gym')
    with pytest.raises(ConfigError) as error:
        compose_run(["task=mix", "+task.families.nope=1"])
    assert "or reasoning_gym_<dataset>" in str(error.value)
    assert get_task("reasoning_gym").family_key == "dataset"


def test_without_the_package_the_line_names_the_extra():
    """reasoning_gym made unimportable in a fresh interpreter (sys.modules entry None)."""
    code = (
        "import sys; sys.modules['reasoning_gym'] = None\n"
        "from evora.errors import ConfigError\n"
        "from evora.plan.compose import compose_run\n"
        "try:\n    compose_run(['task=reasoning_gym', 'task.dataset=chain_sum'])\n"
        "except ConfigError as error:\n    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == (
        "task=reasoning_gym needs the reasoning-gym package (evora's `tasks` extra: pip install 'evora[tasks]'), "
        "not installed here"
    ), out.stdout + out.stderr
