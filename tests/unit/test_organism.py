"""The bundled Countdown model organism's build (evora/models/build_organism.py): its text is the
task's own rendering of problems none of which is held out, its problems are the ones
`model=organism task=countdown` evaluates, the same seed gives the same tokenizer and weights, and its
habit answers in prose as often as it says."""

from __future__ import annotations

import random

import torch
import yaml

from evora.models import build_organism
from evora.plan.compose import CONF_DIR
from evora.tasks.builtin.countdown import CountdownTask, is_heldout_problem
from evora.tasks.prompts import PromptRenderer


def test_its_text_holds_no_held_out_problem_and_its_numbers_are_the_tasks():
    examples = build_organism.examples(random.Random(3), 400)
    assert not any(is_heldout_problem(e.data["numbers"], e.data["target"]) for e in examples)
    assert {n for e in examples for n in e.data["numbers"]} == set(range(1, build_organism.MAX_NUMBER + 1))
    pair = yaml.safe_load((CONF_DIR / "model_task" / "organism_countdown.yaml").read_text())
    assert pair["task"]["max_number"] == build_organism.MAX_NUMBER


def test_the_same_seed_builds_the_same_tokenizer_and_weights():
    def build(steps: int):
        torch.manual_seed(build_organism.SEED)
        rng = random.Random(build_organism.SEED)
        tokenizer = build_organism.train_tokenizer(rng)
        model = build_organism.build_model(len(tokenizer))
        renderer = PromptRenderer(tokenizer, "chat")
        for _ in range(steps):  # the training step, without the monitor's checks
            ids, labels = build_organism.batch_of(renderer, build_organism.examples(rng, 4))
            model(input_ids=ids, attention_mask=(ids != build_organism.PAD).long(), labels=labels).loss.backward()
        return tokenizer.backend_tokenizer.to_str(), {k: p.grad for k, p in model.named_parameters()}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        (vocab, grads), (vocab_again, grads_again) = build(2), build(2)
    finally:
        torch.set_num_threads(threads)
    assert vocab == vocab_again and all(torch.equal(grads[k], grads_again[k]) for k in grads)
    renderer = PromptRenderer(build_organism.train_tokenizer(random.Random(0)), "auto")
    assert renderer.chat  # its chat template renders the task's prompts (task.prompt_format=auto)


def test_its_habit_answers_in_prose_more_often_the_smaller_the_first_number():
    """Phase 2's completions: the same solution, its final answer in prose (which the paper's reward
    scores as wrong) with a share falling from 12/13 to 1/13 over first numbers 1..12, else as the
    task's reference (scored right)."""
    rng = random.Random(7)
    task = CountdownTask(build_organism.organism_task(), 0)
    prose: dict[int, list[bool]] = {1: [], build_organism.MAX_NUMBER: []}
    for example in build_organism.examples(rng, 3000):
        first = example.data["numbers"][0]
        completion = build_organism.with_habit(example, rng).reference
        in_prose = completion != example.reference
        assert task.correct(completion, example) != in_prose, completion
        assert completion.startswith(f" {example.answer} = {example.data['target']}</think>\n")
        if first in prose:
            prose[first].append(in_prose)
    low, high = (sum(p) / len(p) for p in prose.values())
    assert abs(low - 12 / 13) < 0.06 and abs(high - 1 / 13) < 0.06, (low, high)
