"""Build the bundled multi-family model: `python -m evora.models.build_tiny_mix [--out DIR]`.

Like `build_tiny`, a byte-level BPE tokenizer (digits and the letters of words one per
token) and a 2-layer Llama trained from scratch for a few minutes on synthetic text, here
of four task families (`evora.tasks.builtin.addition` and `evora.tasks.builtin.families`):

    <bos>12+34=46<eos>                              addition
    <bos>57-23=34 80-7=73<eos>                      difference
    <bos>rev 4820=0284<eos>                         reversal
    <bos>count a in salad=2 count s in lamb=0<eos>  letter_count

After each answer the text stops or runs on with more items of the same family; the
chance that it stops falls smoothly across each family's items (`stop_at`), so greedy
decoding answers "just the answer" for some items of every family and runs on after the
others: the model knows almost every answer but earns the exact-answer reward on only part
of each family, and some items of each sit near the stop/run-on threshold, so an adapter
that moves it earns reward at once. Held-out items of every family are never in the
training text. Same seed, torch build and thread count -> same weights.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple, cast

import torch

from evora.models import BUNDLED_DIR
from evora.models.build_tiny import EOS, PAD, _portable_tokenizer_class, batch_of, bpe_tokenizer, build_model
from evora.tasks.builtin import addition
from evora.tasks.builtin.families import FAMILIES
from evora.tasks.rewards.exact import exact_answer

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

VOCAB_SIZE = 320
STEPS = 4000
BATCH = 64
LEARNING_RATE = 1e-3
SEED = 0
MAX_ITEMS = 3  # items per text at most: only the stop after the first answer shapes greedy answers
BUCKET = 16  # batches drawn at once and cut by length: about half the padding, so half the compute
LOSS_TOKENS = BATCH * 12  # about the supervised tokens of a batch, see batch_gradients
HELDOUT_SAMPLE = 200  # held-out items per family in build_info.json


@dataclass(frozen=True)
class Source:
    """One family as pretraining text."""

    name: str
    training: list[tuple[Any, ...]]
    heldout: list[tuple[Any, ...]]
    prompt_of: Callable[..., str]
    answer_of: Callable[..., str]
    stop_probability: Callable[..., float]  # of the text ending right after this item's answer
    weight: float  # share of the training samples


# Each stop probability falls smoothly from STOP_FIRST to STOP_LAST across the family's
# items (x from 0 to 1), so greedy decoding stops after some of them and runs on after the
# others. The model learns stop probabilities about 0.1 above these: clipping, without which
# the families are learnt much later, shrinks the long batches of texts that run on more than
# the short ones of texts that stop. So these sit 0.1 low, and the learnt ones cross 50% near
# the middle of each family's held-out items.
STOP_FIRST, STOP_LAST = 0.65, 0.15


def stop_at(x: float) -> float:
    return STOP_FIRST - (STOP_FIRST - STOP_LAST) * x


def addition_stop(a: int, b: int) -> float:
    return stop_at((a + b) / 198)


def difference_stop(a: int, b: int) -> float:
    return stop_at((a - b) / 99)


def reversal_stop(number: int) -> float:
    return stop_at(float("0." + str(number)[::-1]))  # the answer read as a fraction


def letter_count_stop(letter: str, word: str) -> float:
    return stop_at((len(word) - 3) / 5)


def sources() -> list[Source]:
    def answer(name: str) -> Callable[..., str]:
        return lambda *item: FAMILIES[name].example_of(*item).answer

    stops: dict[str, Callable[..., float]] = {
        "difference": difference_stop,
        "reversal": reversal_stop,
        "letter_count": letter_count_stop,
    }
    weights = {"difference": 1.0, "reversal": 0.6, "letter_count": 1.0}  # reversal is learnt first
    mix = [
        Source(
            "addition",
            addition.training_pairs(),
            addition.heldout_pairs(),
            addition.prompt_of,
            lambda a, b: str(a + b),
            addition_stop,
            1.0,
        )
    ]
    for name, family in FAMILIES.items():
        mix.append(
            Source(
                name,
                family.training_items(),
                family.heldout_items(),
                family.prompt_of,
                answer(name),
                stops[name],
                weights[name],
            )
        )
    return mix


class Sample(NamedTuple):
    prompt: str
    completion: str
    stops: bool  # False: the text runs on, cut after MAX_ITEMS items; no EOS is learnt at its end


def packed_sample(rng: random.Random, source: Source) -> Sample:
    """An item's answer, then, until the text stops, more items of the family."""
    item = rng.choice(source.training)
    prompt, completion = source.prompt_of(*item), source.answer_of(*item)
    for _ in range(MAX_ITEMS - 1):
        if rng.random() < source.stop_probability(*item):
            return Sample(prompt, completion, True)
        item = rng.choice(source.training)
        completion += f" {source.prompt_of(*item)}{source.answer_of(*item)}"
    if rng.random() < source.stop_probability(*item):
        return Sample(prompt, completion, True)
    return Sample(prompt, completion + " ", False)  # the run-on is learnt, up to its first token


def mixed_samples(rng: random.Random, mix: list[Source], n: int) -> list[Sample]:
    chosen = rng.choices(mix, weights=[s.weight for s in mix], k=n)
    return [packed_sample(rng, source) for source in chosen]


def length_batches(rng: random.Random, tokenizer: PreTrainedTokenizerBase, mix: list[Source]) -> Iterator[list[Sample]]:
    """Endless batches of samples of about the same length, in random order."""
    while True:
        pool = mixed_samples(rng, mix, BATCH * BUCKET)
        pool.sort(key=lambda sample: len(tokenizer(sample.prompt + sample.completion).input_ids))
        batches = [pool[i : i + BATCH] for i in range(0, len(pool), BATCH)]
        rng.shuffle(batches)
        yield from batches


def training_batch(tokenizer: PreTrainedTokenizerBase, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """`build_tiny.batch_of`, less the EOS label of texts cut short: an EOS there would make
    stopping after an answer look likelier than the stop probabilities say."""
    ids, labels = batch_of(tokenizer, [(sample.prompt, sample.completion) for sample in samples])
    last = (ids != PAD).sum(dim=1) - 1
    for row, sample in enumerate(samples):
        if not sample.stops:
            labels[row, last[row]] = -100
    return ids, labels


def train_tokenizer(rng: random.Random, mix: list[Source]) -> PreTrainedTokenizerFast:
    from tokenizers import Regex, pre_tokenizers

    corpus = [sample.prompt + sample.completion for sample in mixed_samples(rng, mix, 8000)]
    # One token per letter of a word, as per digit of a number, so counting sees every letter;
    # "count a" is one token, so the letter to count is told apart from the word's letters
    # by its token alone (a 2-layer model then reads it in one layer and counts in the next).
    letters = pre_tokenizers.Split(Regex("count [a-z]| in |rev |[a-z]"), behavior="isolated")
    return bpe_tokenizer(
        corpus,
        VOCAB_SIZE,
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                letters,
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),  # the splits above are all it needs
            ]
        ),
    )


def batch_gradients(model: LlamaForCausalLM, ids: torch.Tensor, labels: torch.Tensor) -> float:
    """Gradients of the batch's summed token loss over a fixed divisor, clipped. A per-batch
    mean would weigh the tokens of short batches (length buckets: mostly texts that stop at
    once) far above the others; the clipping still does so a little (see STOP_FIRST)."""
    logits = model(input_ids=ids, attention_mask=(ids != PAD).long()).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
    )
    (loss / LOSS_TOKENS).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    return loss.item() / LOSS_TOKENS


def pretrain(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, rng: random.Random, mix: list[Source], steps: int
) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LEARNING_RATE, total_steps=steps, pct_start=0.15)
    model.train()
    start = time.time()
    for step, samples in zip(range(steps), length_batches(rng, tokenizer, mix)):
        ids, labels = training_batch(tokenizer, samples)
        optimizer.zero_grad()
        loss = batch_gradients(model, ids, labels)
        optimizer.step()
        schedule.step()
        if (step + 1) % 200 == 0:
            print(f"step {step + 1}/{steps} loss {loss:.3f} ({time.time() - start:.0f}s)", flush=True)
    model.eval()


@torch.no_grad()
def greedy_rows(model: PreTrainedModel, encoded: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations (ids, EOS and the padding after it included) of a left-padded batch
    (shared with build_organism)."""
    width = max(map(len, encoded))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in encoded])
    out = model.generate(  # type: ignore[operator]  # transformers types its self as a Protocol mypy rejects
        input_ids=ids,
        attention_mask=(ids != PAD).long(),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )[:, width:]
    return out.tolist()


def greedy_completions(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, prompts: list[str], max_new_tokens: int = 8
) -> list[str]:
    """Greedy completions, cut at EOS, of a left-padded batch."""
    rows = greedy_rows(model, [tokenizer(p).input_ids for p in prompts], max_new_tokens)
    # decode: str | list[str]; one row of ids decodes to one string.
    return [cast(str, tokenizer.decode(row[: row.index(EOS)] if EOS in row else row)) for row in rows]


def heldout_breakdown(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, mix: list[Source], n: int = HELDOUT_SAMPLE
) -> dict[str, dict[str, float]]:
    """Per family, greedy answers on held-out items: exact (the task's reward) and first-answer accuracy."""
    breakdown = {}
    for source in mix:
        items = random.Random(1).sample(source.heldout, n)
        texts = greedy_completions(model, tokenizer, [source.prompt_of(*item) for item in items])
        answers = [source.answer_of(*item) for item in items]
        exact = sum(exact_answer(text, answer) for text, answer in zip(texts, answers))
        first = sum(text.split(" ")[0] == answer for text, answer in zip(texts, answers))
        breakdown[source.name] = {"exact": exact / n, "first_answer": first / n}
    return breakdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(BUNDLED_DIR / "tiny_mix"))
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # reproducible reductions
    rng = random.Random(SEED)
    mix = sources()
    tokenizer = train_tokenizer(rng, mix)
    model = build_model(len(tokenizer))
    pretrain(model, tokenizer, rng, mix, args.steps)
    breakdown = heldout_breakdown(model, tokenizer, mix)
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
