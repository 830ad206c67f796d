"""The bundled Countdown model organism's build (evora/models/build_organism.py): its text is the
task's own rendering of problems none of which is held out, its problems are the ones
`model=organism task=countdown` evaluates, and the same seed gives the same tokenizer and weights."""

from __future__ import annotations

import random

import torch
import yaml

from evora.models import build_organism
from evora.plan.compose import CONF_DIR
from evora.tasks.builtin.countdown import is_heldout_problem
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
