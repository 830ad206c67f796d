"""Build the bundled tiny model: `python -m evora.models.build_tiny [--out DIR]`.

A byte-level BPE tokenizer (digits split one per token) and a 2-layer Llama, trained
from scratch for a few minutes on synthetic text of the quickstart task:

    <bos>12+34=46<eos>                     answer, then stop
    <bos>57+68=125 3+40=43<eos>            answer, then more sums (packed text)

The chance that the text stops after an answer falls smoothly from 75% (sum 0) to 25%
(sum 198), so greedy decoding stops after small sums and runs on after large ones: the
model knows most sums but answers "just the sum" only about half the time, and some
sums always sit near the stop/run-on threshold, so any adapter that moves it earns
reward at once. That gap is what the quickstart's evolution closes. A few countdown problems teach the tokenizer
and the model that task's format. Held-out sums (`tasks.addition.is_heldout_pair`) are
never in the training text. Same seed, torch build and thread count -> same weights.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from evora.models import BUNDLED_DIR
from evora.tasks.builtin.addition import heldout_pairs, prompt_of, training_pairs
from evora.tasks.builtin.countdown import countdown_prompt, generate_problem

if TYPE_CHECKING:
    from tokenizers.pre_tokenizers import PreTokenizer
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>"]
PAD, BOS, EOS = 0, 1, 2
VOCAB_SIZE = 512
STEPS = 2000
BATCH = 64
COUNTDOWN_EVERY = 10  # every 10th step trains on a small countdown batch instead
COUNTDOWN_BATCH = 8
SEED = 0


def stop_probability(answer: int) -> float:
    return 0.75 - 0.5 * answer / 198


def addition_sample(rng: random.Random, pairs: list[tuple[int, int]]) -> tuple[str, str]:
    """(prompt, completion) of packed addition text."""
    a, b = rng.choice(pairs)
    prompt, completion, total = prompt_of(a, b), str(a + b), a + b
    while rng.random() > stop_probability(total):
        c, d = rng.choice(pairs)
        total = c + d
        completion += f" {prompt_of(c, d)}{total}"
    return prompt, completion


def countdown_sample(rng: random.Random) -> tuple[str, str]:
    problem = generate_problem(rng, count=rng.choice((3, 4)))
    return (
        countdown_prompt(problem["numbers"], problem["target"]),
        f" I combine the numbers.</think>\n<answer>{problem['solution']}</answer>",
    )


def train_tokenizer(rng: random.Random) -> PreTrainedTokenizerFast:
    from tokenizers import pre_tokenizers

    pairs = training_pairs()
    corpus = ["".join(addition_sample(rng, pairs)) for _ in range(5000)]
    corpus += ["".join(countdown_sample(rng)) for _ in range(500)]
    return bpe_tokenizer(
        corpus,
        VOCAB_SIZE,
        pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        ),
    )


def bpe_tokenizer(
    corpus: list[str], vocab_size: int, pre_tokenizer: PreTokenizer, specials: list[str] = SPECIALS
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of `vocab_size` trained on `corpus` after `pre_tokenizer`, with
    `specials` (pad, BOS and EOS first) and BOS on every encoded text (shared with build_tiny_mix
    and build_organism)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    # BOS on every encoded text, so vLLM and transformers tokenize prompts identically.
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", BOS)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIALS[BOS],
        eos_token=SPECIALS[EOS],
        pad_token=SPECIALS[PAD],
        model_max_length=512,
    )


def build_model(vocab_size: int) -> LlamaForCausalLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def batch_of(tokenizer: PreTrainedTokenizerBase, samples: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels; the loss covers the completion and its EOS only."""
    rows = []
    for prompt, completion in samples:
        p = tokenizer(prompt).input_ids
        c = tokenizer(completion, add_special_tokens=False).input_ids + [EOS]
        rows.append((p + c, len(p)))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), PAD)
    labels = torch.full((len(rows), width), -100)
    for i, (row, n_prompt) in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, n_prompt : len(row)] = torch.tensor(row[n_prompt:])
    return ids, labels


def pretrain(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, rng: random.Random, steps: int) -> None:
    pairs = training_pairs()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.15)
    model.train()
    start = time.time()
    for step in range(steps):
        if step % COUNTDOWN_EVERY == COUNTDOWN_EVERY - 1:
            samples = [countdown_sample(rng) for _ in range(COUNTDOWN_BATCH)]
        else:
            samples = [addition_sample(rng, pairs) for _ in range(BATCH)]
        ids, labels = batch_of(tokenizer, samples)
        loss = model(input_ids=ids, attention_mask=(ids != PAD).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if (step + 1) % 200 == 0:
            print(f"step {step + 1}/{steps} loss {loss.item():.3f} ({time.time() - start:.0f}s)", flush=True)
    model.eval()


@torch.no_grad()
def heldout_breakdown(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, n: int = 400) -> dict[str, float]:
    """Greedy answers on held-out sums: exact (the task's reward) and first-number accuracy."""
    pairs = random.Random(1).sample(heldout_pairs(), n)
    prompts = [tokenizer(prompt_of(a, b)).input_ids for a, b in pairs]
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    out = model.generate(  # type: ignore[misc]  # transformers types its self as a Protocol mypy rejects
        input_ids=ids,
        attention_mask=(ids != PAD).long(),
        max_new_tokens=8,
        do_sample=False,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )[:, width:]
    exact = first = 0
    for (a, b), row in zip(pairs, out.tolist()):
        text = cast(str, tokenizer.decode(row[: row.index(EOS)] if EOS in row else row))  # one row: one str
        exact += text.strip() == str(a + b)
        first += text.split(" ")[0] == str(a + b)
    return {"exact": exact / n, "first_number": first / n}


def _portable_tokenizer_class(path: Path, chat_template: str | None = None) -> None:
    # transformers 5 writes its own class name, and a chat template to a file of its own; older
    # releases and vLLM's loaders know this class, and read a template from this file.
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if chat_template is not None:
        config["chat_template"] = chat_template
    path.write_text(json.dumps(config, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(BUNDLED_DIR / "tiny"))
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # reproducible reductions
    rng = random.Random(SEED)
    tokenizer = train_tokenizer(rng)
    model = build_model(len(tokenizer))
    pretrain(model, tokenizer, rng, args.steps)
    breakdown = heldout_breakdown(model, tokenizer)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = PAD
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_class(out / "tokenizer_config.json")
    info = {
        "seed": SEED,
        "steps": args.steps,
        "torch": torch.__version__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "heldout_greedy": breakdown,
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
