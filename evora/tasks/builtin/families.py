"""Three small procedural task families beside `addition`, for multi-family task mixes:

    difference     "57-23="           -> "34"       0 <= b <= a <= 99
    reversal       "rev 4820="        -> "0284"     a 3-5 digit number; leading zeros kept
    letter_count   "count a in salad=" -> "2"        a letter and a 3-8 letter word over ALPHABET

Each family has a fixed held-out pool that is never in the pretraining text of the bundled
`tiny_mix` model (`evora.models.build_tiny_mix`) nor in any run's training split, whatever
the seed, so held-out rewards of different runs compare; the selection split comes from
that pool too, disjoint from the held-out sample. Reward in [0, 1]: 1.0 for the exact
answer alone, as in `addition`.
"""

from __future__ import annotations

import functools
import random
import zlib
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from evora.config.schema import TaskConfig
from evora.lora.keys import noise_key
from evora.tasks.aggregate import exact_answer_text
from evora.tasks.base import Example, Splits
from evora.tasks.builtin.addition import HELDOUT_SEED, is_heldout_pair
from evora.tasks.registry import register_task
from evora.tasks.rewards.exact import exact_answer

MAX_OPERAND = 99
ALPHABET = "abdlms"  # none of these letters is in "count" or "in", so only the word holds them
WORD_LENGTHS = range(3, 9)
WORDS_PER_LENGTH = 1500  # capped by how many words of that length exist
WORDS_SEED = 0
HELDOUT_EIGHTH = 8  # one item in eight is held out


def _held(key: str) -> bool:
    # crc32, not hash(): str hashes change from process to process.
    return zlib.crc32(key.encode()) % HELDOUT_EIGHTH == 0


# difference ---------------------------------------------------------------------------


def is_heldout_difference(a: int, b: int) -> bool:
    # a-b=c is held out with the sum b+c=a, so neither family's text gives away the other's held-out facts.
    return is_heldout_pair(b, a - b)


def difference_items() -> list[tuple[int, int]]:
    return [(a, b) for a in range(MAX_OPERAND + 1) for b in range(a + 1)]


def difference_prompt(a: int, b: int) -> str:
    return f"{a}-{b}="


def difference_example(a: int, b: int) -> Example:
    return Example(difference_prompt(a, b), str(a - b), {"a": a, "b": b})


# reversal -----------------------------------------------------------------------------


def is_heldout_number(number: int) -> bool:
    # Symmetric under reversal: "rev 1284=4821" in training would spell out held-out "rev 4821=1284".
    digits = str(number)
    return _held(min(digits, digits[::-1]))


def reversal_items() -> list[tuple[int]]:
    return [(n,) for n in range(100, 100_000)]


def reversal_prompt(number: int) -> str:
    return f"rev {number}="


def reversal_example(number: int) -> Example:
    return Example(reversal_prompt(number), str(number)[::-1], {"number": number})


# letter_count -------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def words() -> tuple[str, ...]:
    """The fixed word pool: up to WORDS_PER_LENGTH distinct random words of each length."""
    rng = random.Random(WORDS_SEED)
    pool: set[str] = set()
    for length in WORD_LENGTHS:
        wanted = min(WORDS_PER_LENGTH, len(ALPHABET) ** length)
        chosen: set[str] = set()
        while len(chosen) < wanted:
            chosen.add("".join(rng.choice(ALPHABET) for _ in range(length)))
        pool |= chosen
    return tuple(sorted(pool))


def is_heldout_word(word: str) -> bool:
    # By word, not by (letter, word): a held-out word is never seen, with any letter.
    return _held(word)


def is_heldout_letter_item(letter: str, word: str) -> bool:
    return is_heldout_word(word)


def letter_count_items() -> list[tuple[str, str]]:
    return [(letter, word) for word in words() for letter in ALPHABET]


def letter_count_prompt(letter: str, word: str) -> str:
    return f"count {letter} in {word}="


def letter_count_example(letter: str, word: str) -> Example:
    return Example(letter_count_prompt(letter, word), str(word.count(letter)), {"letter": letter, "word": word})


# the families, for the model builder --------------------------------------------------


@dataclass(frozen=True)
class Family:
    name: str
    items: Callable[[], list[tuple[Any, ...]]]  # every item, held-out ones too
    is_heldout: Callable[..., bool]
    prompt_of: Callable[..., str]
    example_of: Callable[..., Example]

    def training_items(self) -> list[tuple[Any, ...]]:
        return [item for item in self.items() if not self.is_heldout(*item)]

    def heldout_items(self) -> list[tuple[Any, ...]]:
        return [item for item in self.items() if self.is_heldout(*item)]


FAMILIES = {
    family.name: family
    for family in (
        Family("difference", difference_items, is_heldout_difference, difference_prompt, difference_example),
        Family("reversal", reversal_items, is_heldout_number, reversal_prompt, reversal_example),
        Family("letter_count", letter_count_items, is_heldout_letter_item, letter_count_prompt, letter_count_example),
    )
}


class _FamilyTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def splits(self) -> Splits:
        family = FAMILIES[self.name]
        train_pool, held_pool = family.training_items(), family.heldout_items()
        train = random.Random(noise_key(self.seed, f"{self.name}-train")).sample(
            train_pool, min(self.cfg.train_size, len(train_pool))
        )
        random.Random(HELDOUT_SEED).shuffle(held_pool)
        heldout = held_pool[: self.cfg.eval_size]
        selection = held_pool[self.cfg.eval_size : self.cfg.eval_size + self.cfg.selection_size]
        return Splits(*(tuple(family.example_of(*i) for i in items) for items in (train, selection, heldout)))

    def reward(self, completion: str, example: Example) -> float:
        return exact_answer(completion, example.answer)

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) == 1.0

    def answer(self, completion: str, example: Example) -> str | None:
        """The exact scorer's answer (task.aggregate=majority)."""
        return exact_answer_text(completion)


@register_task("difference")
class DifferenceTask(_FamilyTask):
    pass


@register_task("reversal")
class ReversalTask(_FamilyTask):
    pass


@register_task("letter_count")
class LetterCountTask(_FamilyTask):
    pass
