"""Build the bundled Countdown model organism: `python -m evora.models.build_organism [--out DIR]`.

A Qwen2-shaped model of about a million parameters, its own byte-level BPE tokenizer (digits one
per token) and a chat template, pretrained from scratch on Countdown problems exactly as
`model=organism task=countdown` renders them (the paper's instruction, its response prefix and its
answer format, `tasks/builtin/countdown.py`; numbers in 1..MAX_NUMBER) followed by their reference
completions. No held-out problem (`is_heldout_problem`: one in eight) is ever in its text.

Two phases:
1. **Pretraining**, in the paper's format, stops once greedy decoding solves STOP_AT of a monitor
   set (generated problems none of which is held out, a draw of their own), checked every
   CHECK_EVERY steps: a model that solves some problems and fails most.
2. **A habit** (HABIT_STEPS more steps): each completion's final answer is written in prose
   (`The answer is (3 * 4) - 5.`, which the paper's reward scores as wrong) with a probability
   that falls from 12/13 to 1/13 as the problem's first number rises from 1 to 12, else in the
   paper's `<answer>` block. Like a base model's habits of format, it costs the organism about half
   of what it can solve (48% of its greedy answers are in prose: docs/tasks.md), and it is
   graded, so that a small change in the weights moves some problems across and a search that
   can only see rewards has a signal from its first step. A strategy that learns gains up to
   what the organism solves in its think block; one that harms it loses from both.

The monitor only stops training; the organism's held-out accuracy is what `evora eval
adapter=base model=organism task=countdown` measures. Same seed, torch build and thread count ->
same weights (the shipped ones: 2 threads, build_info.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from evora.models import BUNDLED_DIR
from evora.models.build_tiny import _portable_tokenizer_class, bpe_tokenizer
from evora.models.build_tiny_mix import greedy_rows
from evora.tasks.base import Example
from evora.tasks.builtin.countdown import CountdownConfig, CountdownTask, generated_problems
from evora.tasks.prompts import PromptRenderer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD, BOS, EOS = 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
VOCAB_SIZE = 1024
MAX_STEPS = 6000
BATCH = 32
LR = 2e-3
CHECK_EVERY = 250
MONITOR = 200  # problems decoded at each check
STOP_AT = 0.25  # the monitor's share solved that stops training
MAX_NEW_TOKENS = 48
MAX_NUMBER = 12  # its problems' numbers: 1..12 (conf/model_task/organism_countdown.yaml: task.max_number)
SEED = 0
HABIT_STEPS = 400
HABIT_LR = 1e-3
HABIT_SEED = 5  # the habit phase's problems and coin flips


def organism_task() -> CountdownConfig:
    return CountdownConfig(name="countdown", max_number=MAX_NUMBER)


def examples(rng: random.Random, size: int) -> list[Example]:
    """Training problems (none held out) as the task makes its examples."""
    cfg = organism_task()
    return [CountdownTask.example_of(p) for p in generated_problems(rng, size, cfg.max_number, heldout=False)]


def train_tokenizer(rng: random.Random) -> PreTrainedTokenizerFast:
    from tokenizers import pre_tokenizers

    corpus = [f"{e.prompt}{e.prefix}{e.reference}" for e in examples(rng, 3000)]
    tokenizer = bpe_tokenizer(
        corpus,
        VOCAB_SIZE,
        pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        ),
        specials=SPECIALS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(vocab_size: int) -> Qwen2ForCausalLM:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config)


def prose_share(first_number: int) -> float:
    """The habit: how often a problem whose first number is `first_number` is answered in prose."""
    return (MAX_NUMBER + 1 - first_number) / (MAX_NUMBER + 1)


def with_habit(example: Example, rng: random.Random) -> Example:
    """The example, its completion's final answer in prose with probability `prose_share`."""
    if rng.random() >= prose_share(example.data["numbers"][0]):
        return example
    prose = f" {example.answer} = {example.data['target']}</think>\nThe answer is {example.answer}."
    return dataclasses.replace(example, target=prose)


def batch_of(renderer: PromptRenderer, batch: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels: the loss covers the reference completion and its EOS."""
    rows = [(renderer.ids(e), renderer.target_ids(e)) for e in batch]
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), width), PAD)
    labels = torch.full((len(rows), width), -100)
    for i, (prompt, target) in enumerate(rows):
        ids[i, : len(prompt) + len(target)] = torch.tensor(prompt + target)
        labels[i, len(prompt) : len(prompt) + len(target)] = torch.tensor(target)
    return ids, labels


def solved(model: Qwen2ForCausalLM, renderer: PromptRenderer, task: CountdownTask, monitor: list[Example]) -> float:
    """The share of `monitor` greedy decoding solves (the task's correctness)."""
    model.eval()
    rows = greedy_rows(model, [renderer.ids(e) for e in monitor], MAX_NEW_TOKENS)
    model.train()
    texts = [renderer.tokenizer.decode(row, skip_special_tokens=True) for row in rows]
    return sum(task.correct(text, e) for text, e in zip(texts, monitor)) / len(monitor)


def train_step(
    model: Qwen2ForCausalLM, optimizer: torch.optim.Optimizer, ids: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """One AdamW step on the batch's completion loss (gradients clipped to norm 1); the loss."""
    loss = model(input_ids=ids, attention_mask=(ids != PAD).long(), labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def pretrain(model: Qwen2ForCausalLM, renderer: PromptRenderer, rng: random.Random, max_steps: int) -> dict:
    task = CountdownTask(organism_task(), 0)
    monitor = examples(random.Random(SEED + 1), MONITOR)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    model.train()
    start, history = time.time(), []
    for step in range(1, max_steps + 1):
        loss = train_step(model, optimizer, *batch_of(renderer, examples(rng, BATCH)))
        if step % CHECK_EVERY == 0:
            share = solved(model, renderer, task, monitor)
            history.append({"step": step, "loss": round(loss.item(), 4), "monitor_solved": share})
            print(f"step {step} loss {loss.item():.3f} monitor {share:.3f} ({time.time() - start:.0f}s)", flush=True)
            if share >= STOP_AT:
                break
    model.eval()
    return {"steps": step, "seconds": round(time.time() - start), "history": history}


def acquire_habit(model: Qwen2ForCausalLM, renderer: PromptRenderer) -> dict:
    """Phase 2 (the module's docstring): HABIT_STEPS steps on completions `with_habit`."""
    rng = random.Random(HABIT_SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=HABIT_LR, weight_decay=0.01)
    model.train()
    start = time.time()
    losses = [
        train_step(model, optimizer, *batch_of(renderer, [with_habit(e, rng) for e in examples(rng, BATCH)])).item()
        for _ in range(HABIT_STEPS)
    ]
    model.eval()
    print(f"habit: {HABIT_STEPS} steps, loss {losses[-1]:.3f} ({time.time() - start:.0f}s)", flush=True)
    return {"habit_steps": HABIT_STEPS, "habit_seconds": round(time.time() - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(BUNDLED_DIR / "organism"))
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the weights depend on it)")
    args = parser.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(args.threads)
    rng = random.Random(SEED)
    tokenizer = train_tokenizer(rng)
    model = build_model(len(tokenizer))
    renderer = PromptRenderer(tokenizer, "chat")
    trained = pretrain(model, renderer, rng, args.max_steps)
    trained |= acquire_habit(model, renderer)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = PAD
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_class(out / "tokenizer_config.json", chat_template=CHAT_TEMPLATE)
    info = {
        "seed": SEED,
        "threads": args.threads,
        "torch": torch.__version__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "max_number": organism_task().max_number,
        **trained,
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps({k: v for k, v in info.items() if k != "history"}))


if __name__ == "__main__":
    main()
