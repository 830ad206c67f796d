"""task=reasoning_gym: problems from one of reasoning-gym's procedural datasets (Apache-2.0, offline,
about 100 of them), each completion scored by the dataset's own `score_answer`:

    evora task=reasoning_gym task.dataset=countdown +task.options.min_numbers=3 +task.options.max_numbers=4
    evora task=mix task.families.arithmetic=0 +task.families.reasoning_gym_chain_sum=1

`task.options` are the dataset's own settings (the fields of its config class), checked before Ray
by name and type and by the dataset's own `validate()`. `task.plugins` are modules imported first
that register datasets of your own (`reasoning_gym.register_dataset`).

The held-out problems are drawn with a key of the dataset and its options alone, so runs of every
seed are evaluated on the same ones; selection and train with the run seed, less any problem whose
question is held out. `score_answer` is third-party code: it runs in evora's reward processes
(`tasks/reward_pool.py`), bounded in time and memory, like a user's reward.

Under `task.answer_format=tags` (reasoning-gym's convention) each prompt asks for the answer
inside <answer></answer> and the last such block is scored; under `raw` the whole completion,
stripped, is the answer. Reward in [0, 1] (reasoning-gym's), correct at 1.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from evora.config.checks import choice, fail
from evora.config.schema import TaskConfig
from evora.errors import ConfigError
from evora.lora.keys import noise_key
from evora.tasks.base import Example, Splits
from evora.tasks.registry import register_task

ANSWER_FORMATS = ("tags", "raw")
TAGS_INSTRUCTION = "Give only the final answer, inside <answer></answer> tags."
FIXED = ("seed", "size")  # a dataset config's fields evora sets itself
DRAWS = 8  # train draws at most this many times its size, to replace problems that are held out


@dataclass(frozen=True)
class ReasoningGymConfig(TaskConfig):
    dataset: Optional[str] = None  # a reasoning-gym dataset, e.g. countdown, chain_sum, leg_counting
    options: dict[str, Any] = field(default_factory=dict)  # the dataset's own settings, e.g. {min_numbers: 3}
    answer_format: str = "tags"  # tags: the last <answer>...</answer> is the answer | raw: the whole completion
    plugins: list[str] = field(default_factory=list)  # modules imported first: datasets of your own


def gym() -> Any:
    """The reasoning_gym package, or the one line that says how to install it."""
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(
            "task=reasoning_gym needs the reasoning-gym package (evora's `tasks` extra: pip install 'evora[tasks]'), "
            "not installed here"
        ) from None
    return reasoning_gym


def load_plugins(plugins: list[str]) -> None:
    for module in plugins:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise fail("task.plugins", module, f"cannot import it ({error})") from None


def dataset_config(cfg: ReasoningGymConfig) -> type:
    """The dataset's config class, after the plugins have registered theirs."""
    gym()
    load_plugins(cfg.plugins)
    from reasoning_gym.factory import DATASETS

    if cfg.dataset not in DATASETS:
        raise fail("task.dataset", cfg.dataset, f"not a reasoning-gym dataset; allowed: {', '.join(sorted(DATASETS))}")
    return DATASETS[cfg.dataset][1]


def typed_options(cfg: ReasoningGymConfig) -> dict[str, Any]:
    """task.options as the dataset's config takes them: known keys, values of their defaults'
    types (a list where the default is a tuple becomes one)."""
    fields = {f.name: f for f in dataclasses.fields(dataset_config(cfg)) if f.name not in FIXED}
    options = {}
    for key, value in cfg.options.items():
        if key not in fields:
            raise fail(f"task.options.{key}", value, f"not a setting of {cfg.dataset}; allowed: {', '.join(fields)}")
        default = fields[key].default
        options[key] = typed(f"task.options.{key}", value, default)
    return options


def typed(key: str, value: Any, default: Any) -> Any:
    """`value` as its setting's default's type: a list for a tuple, an int for a float."""
    if default is None or default is dataclasses.MISSING:
        return value
    if isinstance(default, tuple) and isinstance(value, (list, tuple)):
        return tuple(value)
    if isinstance(default, float) and type(value) is int:
        return float(value)
    if isinstance(value, type(default)) and isinstance(value, bool) == isinstance(default, bool):
        return value
    raise fail(key, value, f"must be a {type(default).__name__}, like its default {default!r}")


def create(cfg: ReasoningGymConfig, options: dict[str, Any], key: int, size: int) -> Any:
    """The dataset of `size` problems drawn with `key` (reasoning-gym's item i: Random(key + i))."""
    try:
        return gym().create_dataset(cfg.dataset, seed=key, size=size, **options)
    except (AssertionError, ValueError, TypeError) as error:  # the dataset's own validate()
        raise ConfigError(f"task.options={cfg.options}: {cfg.dataset} refuses them ({error})") from None


def check_reasoning_gym(cfg: ReasoningGymConfig) -> None:
    """Before Ray: the package, the plugins, the dataset, its options (by name, type and its own
    rules) and the answer format."""
    if cfg.dataset is None:
        raise fail("task.dataset", None, "task=reasoning_gym needs a dataset, e.g. task.dataset=countdown")
    choice("task.answer_format", cfg.answer_format, ANSWER_FORMATS)
    create(cfg, typed_options(cfg), 0, 1)


@register_task(
    "reasoning_gym",
    config=ReasoningGymConfig,
    validate=check_reasoning_gym,
    isolated=True,
    family_key="dataset",
    local_dataset=True,
)
class ReasoningGymTask:
    name: ClassVar[str]
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    def __init__(self, cfg: ReasoningGymConfig, seed: int):
        check_reasoning_gym(cfg)
        self.cfg, self.seed = cfg, seed
        self.options = typed_options(cfg)
        self.scorer = create(cfg, self.options, 0, 1)  # score_answer reads the dataset's config, not its items
        from reasoning_gym.utils import extract_answer

        self._extract = extract_answer

    def _key(self, *parts: object) -> int:
        return noise_key("reasoning_gym", self.cfg.dataset, sorted(self.options.items()), *parts)

    def _problems(self, key: int, size: int) -> list[dict[str, Any]]:
        if size == 0:
            return []
        dataset = create(self.cfg, self.options, key, size)
        return [dataset[i] for i in range(size)]

    def splits(self) -> Splits:
        cfg = self.cfg
        heldout = self._problems(self._key("heldout"), cfg.eval_size)
        held = {p["question"] for p in heldout}
        wanted = cfg.selection_size + cfg.train_size
        rest: list[dict[str, Any]] = []
        size = wanted
        while len(rest) < wanted and size <= DRAWS * max(wanted, 1):
            rest = [p for p in self._problems(self._key("train", self.seed), size) if p["question"] not in held]
            size *= 2
        if len(rest) < wanted:
            raise ConfigError(
                f"task.train_size={cfg.train_size}: {cfg.dataset} gave {len(rest)} problems outside the held-out "
                f"set of {cfg.eval_size} in {size // 2} draws; ask for fewer, or widen task.options"
            )
        selection, train = rest[: cfg.selection_size], rest[cfg.selection_size : wanted]
        return Splits(*(tuple(map(self.example, part)) for part in (train, selection, heldout)))

    def example(self, problem: dict[str, Any]) -> Example:
        answer = str(problem["answer"])
        if self.cfg.answer_format == "tags":
            prompt, target = f"{problem['question'].rstrip()}\n\n{TAGS_INSTRUCTION}", f"<answer>{answer}</answer>"
        else:
            prompt, target = problem["question"], answer
        return Example(prompt, answer, {"entry": problem}, target=target)

    # `extracted`, not `answer`: not an AnswerTask, since many datasets accept more than one
    # answer (countdown's expressions), so equal strings are no canonical answer to vote on.
    def extracted(self, completion: str) -> str | None:
        if self.cfg.answer_format == "raw":
            return completion.strip() or None
        return self._extract(completion)

    def reward(self, completion: str, example: Example) -> float:
        return float(self.scorer.score_answer(self.extracted(completion), example.data["entry"]))

    def correct(self, completion: str, example: Example) -> bool:
        return self.reward(completion, example) >= 1.0
