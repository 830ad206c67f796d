"""The difference, reversal and letter_count tasks, and the bundled tiny_mix model that knows
them and addition: seeded disjoint splits, held-out pools kept out of training, golden
rewards, and greedy accuracy strictly between 0 and 1 on every family."""

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from evora.models import build_tiny_mix, locate_model
from evora.tasks import build_task, task_config
from evora.tasks.builtin.addition import is_heldout_pair
from evora.tasks.builtin.families import (
    FAMILIES,
    difference_example,
    letter_count_example,
    reversal_example,
    words,
)

TINY_MIX = Path(locate_model("evora:tiny_mix").path)
ALL_FAMILIES = ("addition", *FAMILIES)


def item_of(example):
    return tuple(example.data.values())


@pytest.mark.parametrize("name", list(FAMILIES))
def test_splits_are_seeded_disjoint_and_heldout_fixed(name):
    cfg = task_config(name, train_size=500, selection_size=50, eval_size=100)
    splits = build_task(cfg, seed=3).splits()
    assert splits == build_task(cfg, seed=3).splits()
    train, selection, held = ({item_of(e) for e in split} for split in (splits.train, splits.selection, splits.heldout))
    assert (len(train), len(selection), len(held)) == (500, 50, 100)
    assert not train & held and not selection & held and not train & selection
    assert all(FAMILIES[name].is_heldout(*item) for item in held | selection)
    other_seed = build_task(cfg, seed=4).splits()
    assert other_seed.heldout == splits.heldout  # held-out fixed so seeds compare
    assert other_seed.train != splits.train


@pytest.mark.parametrize("name", list(FAMILIES))
def test_heldout_pool_never_meets_the_training_pool(name):
    family = FAMILIES[name]
    train, held = set(family.training_items()), set(family.heldout_items())
    assert not train & held and train | held == set(family.items())
    assert 0.08 < len(held) / len(family.items()) < 0.18  # about an eighth
    assert len(held) >= 500 and len(train) >= 4000


def test_heldout_pools_keep_related_facts_out_too():
    # a-b=c is held out exactly when b+c=a is; a number exactly when its reversal is; a word with every letter.
    assert all(
        is_heldout_pair(b, a - b) == FAMILIES["difference"].is_heldout(a, b) for a, b in FAMILIES["difference"].items()
    )
    reversal = FAMILIES["reversal"]
    assert all(reversal.is_heldout(n) == reversal.is_heldout(int(str(n)[::-1])) for (n,) in reversal.items() if n % 10)
    held = FAMILIES["letter_count"].heldout_items()
    assert {word for _, word in held} & {word for _, word in FAMILIES["letter_count"].training_items()} == set()
    assert len(words()) == len(set(words())) >= 5000 and all(3 <= len(w) <= 8 for w in words())


def test_examples_carry_their_operands():
    assert difference_example(57, 23) == difference_example(57, 23)
    assert (difference_example(57, 23).prompt, difference_example(57, 23).answer) == ("57-23=", "34")
    assert difference_example(57, 23).data == {"a": 57, "b": 23}
    assert (reversal_example(4820).prompt, reversal_example(4820).answer) == ("rev 4820=", "0284")
    assert reversal_example(4820).data == {"number": 4820}
    example = letter_count_example("a", "salad")
    assert (example.prompt, example.answer, example.data) == (
        "count a in salad=",
        "2",
        {"letter": "a", "word": "salad"},
    )
    assert letter_count_example("m", "salad").answer == "0"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_reward_is_one_for_the_answer_alone(name):
    task = build_task(task_config(name, train_size=8, eval_size=8), seed=0)
    assert task.reward_range == (0.0, 1.0)
    for example in task.splits().train + task.splits().heldout:
        assert task.reward(example.answer, example) == 1.0 and task.correct(f" {example.answer}\n", example)
        other = task.splits().train[0]
        run_on = f"{example.answer} {other.prompt}{other.answer}"
        for wrong in (run_on, "", example.answer + "1", "x" + example.answer):
            assert task.reward(wrong, example) == 0.0 and not task.correct(wrong, example)
    leading_zero = reversal_example(4820)
    assert build_task(task_config("reversal"), seed=0).reward("284", leading_zero) == 0.0


def test_build_info_records_middling_heldout_accuracy_per_family():
    info = json.loads((TINY_MIX / "build_info.json").read_text())
    for name in ALL_FAMILIES:
        breakdown = info["heldout_greedy"][name]
        assert 0.1 < breakdown["exact"] < 0.9, name
        assert breakdown["first_answer"] >= breakdown["exact"], name


@torch.no_grad()
def test_bundled_tiny_mix_answers_part_of_every_family():
    tokenizer = AutoTokenizer.from_pretrained(TINY_MIX)
    model = AutoModelForCausalLM.from_pretrained(TINY_MIX).eval()
    for name in ALL_FAMILIES:
        task = build_task(task_config(name, eval_size=40), seed=0)
        examples = task.splits().heldout
        batch = tokenizer([e.prompt for e in examples], padding=True, padding_side="left", return_tensors="pt")
        out = model.generate(**batch, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, batch.input_ids.shape[1] :], skip_special_tokens=True)
        accuracy = sum(task.correct(text, e) for text, e in zip(texts, examples)) / len(examples)
        assert 0.0 < accuracy < 1.0, (name, accuracy)


def test_the_build_is_reproducible():
    """Same seed, same steps: the same tokenizer and the same weights, bit for bit."""

    def build(steps: int):
        torch.manual_seed(build_tiny_mix.SEED)
        rng = random.Random(build_tiny_mix.SEED)
        mix = build_tiny_mix.sources()
        tokenizer = build_tiny_mix.train_tokenizer(rng, mix)
        model = build_tiny_mix.build_model(len(tokenizer))
        build_tiny_mix.pretrain(model, tokenizer, rng, mix, steps)
        return tokenizer.backend_tokenizer.to_str(), model.state_dict()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the build does: reproducible reductions
    try:
        (vocab, weights), (vocab_again, weights_again) = build(3), build(3)
    finally:
        torch.set_num_threads(threads)
    assert vocab == vocab_again and weights.keys() == weights_again.keys()
    assert all(torch.equal(weights[k], weights_again[k]) for k in weights)
