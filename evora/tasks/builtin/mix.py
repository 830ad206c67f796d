"""task=mix: several tasks at once, each a family, for strategies that specialise (the ecology).

    task.families: {addition: 1, difference: 1, reversal: 1, letter_count: 1}

Each family is a registered task, built with its task's config: the mix's shared keys, its
share of the split sizes (by weight; shares sum to the sizes exactly) and its own keys from
`task.family_options` (e.g. `{countdown: {number_rule: at_most_once}}`). Every example carries its family
(`Example.family`), and rewards dispatch on it, so each family keeps its own reward.
`task.heldout_families` are families seen only in the held-out split: their train and
selection shares are given to the others (a family-shift evaluation). Train and selection
are shuffled with the run seed; held-out with a fixed seed, so its head mixes families and
runs of different seeds compare on the same examples.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

from evora.config.checks import require
from evora.config.schema import TaskConfig
from evora.errors import ConfigError
from evora.lora.keys import noise_key
from evora.tasks.base import AnswerTask, Example, Splits
from evora.tasks.registry import family_entry, isolated_reward, register_task

HELDOUT_SEED = 0
SHARED = tuple(f.name for f in dataclasses.fields(TaskConfig))  # the keys a family takes from the mix


@dataclass(frozen=True)
class MixConfig(TaskConfig):
    families: dict[str, float] = field(default_factory=dict)  # family (a registered task) -> weight
    heldout_families: list[str] = field(default_factory=list)  # families only in the held-out split
    # A family's own keys (its task's config), e.g. {countdown: {number_rule: at_most_once}}.
    family_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def shares(total: int, weights: dict[str, float]) -> dict[str, int]:
    """`total` split by weight, largest remainders first (ties: family order), summing to `total`."""
    if total == 0 or not weights:
        return {name: 0 for name in weights}
    whole = sum(weights.values())
    exact = {name: total * w / whole for name, w in weights.items()}
    out = {name: int(value) for name, value in exact.items()}
    order = sorted(weights, key=lambda name: -(exact[name] - out[name]))
    for name in order[: total - sum(out.values())]:
        out[name] += 1
    return out


def weighted(cfg: MixConfig) -> dict[str, float]:
    """The families in the mix: weight 0 leaves a family out (Hydra merges dict overrides
    into the defaults, so `task.families.arithmetic=0` is how a default family is dropped)."""
    return {name: weight for name, weight in cfg.families.items() if weight != 0}


def family_config(cfg: MixConfig, name: str) -> TaskConfig:
    """Family `name`'s config: its task's, with the mix's shared keys, its share of the split
    sizes, and its `task.family_options`."""
    trained = {f: w for f, w in weighted(cfg).items() if f not in cfg.heldout_families}
    shared = {key: vars(cfg)[key] for key in SHARED}
    sizes = {
        "train_size": shares(cfg.train_size, trained).get(name, 0),
        "selection_size": shares(cfg.selection_size, trained).get(name, 0),
        "eval_size": shares(cfg.eval_size, weighted(cfg))[name],
    }
    entry, named = family_entry(name)
    options = dict(cfg.family_options.get(name, {}))
    own = {f.name for f in dataclasses.fields(entry.config)} - set(SHARED)
    for key in options:
        if key not in own:
            raise ConfigError(
                f"task.family_options.{name}.{key}: unknown key; allowed: {', '.join(sorted(own)) or 'none'}"
            )
    return entry.config(**{**shared, **sizes, **named, **options, "name": entry.name})


def check_mix(cfg: MixConfig) -> None:
    """task=mix's rules, before Ray: families named, registered, weighted, each valid by its own
    rules; held-out families among them."""
    for name, weight in cfg.families.items():
        require(name != "mix", f"task.families.{name}", weight, "a mix cannot contain a mix")
        family_entry(name)  # a registered task, or a task's family by name (reasoning_gym_<dataset>)
        require(weight >= 0, f"task.families.{name}", weight, "must be a weight >= 0 (0 leaves it out)")
    families = weighted(cfg)
    require(bool(families), "task.families", dict(cfg.families), "task=mix needs a family of weight > 0")
    for name in cfg.family_options:
        if name not in families:
            raise ConfigError(f"task.family_options.{name}: not one of task.families ({', '.join(families)})")
    for name in cfg.heldout_families:
        if name not in families:
            raise ConfigError(f"task.heldout_families={name}: not one of task.families ({', '.join(families)})")
    trained = [name for name in families if name not in cfg.heldout_families]
    require(bool(trained), "task.heldout_families", list(cfg.heldout_families), "leaves no family to train on")
    for name in families:
        family = family_config(cfg, name)
        try:
            family_entry(name)[0].check(family)
        except ConfigError as error:  # a family's own key is set in task.family_options.<family>
            raise ConfigError(f"task.families.{name}: {error}") from None


def any_isolated(cfg: MixConfig) -> bool:
    """Whether a family's reward runs third-party code: then the mix's is scored in reward processes."""
    return any(isolated_reward(family_config(cfg, name)) for name in weighted(cfg))


@register_task("mix", config=MixConfig, validate=check_mix, isolated=any_isolated)
class MixTask:
    name: ClassVar[str]
    reward_range: tuple[float, float] = (0.0, 1.0)  # per instance: the families' widest

    def __init__(self, cfg: MixConfig, seed: int):
        check_mix(cfg)
        self.cfg = cfg
        self.seed = seed
        self.families = {name: family_entry(name)[0].task(family_config(cfg, name), seed) for name in weighted(cfg)}
        low = min(type(t).reward_range[0] for t in self.families.values())
        high = max(type(t).reward_range[1] for t in self.families.values())
        self.reward_range = (low, high)
        self.plain_template = {name: type(task).plain_template for name, task in self.families.items()}
        if all(isinstance(task, AnswerTask) for task in self.families.values()):
            self.answer = self._answer  # an AnswerTask only when every family is one: set per instance

    def splits(self) -> Splits:
        parts = {name: task.splits() for name, task in self.families.items()}

        def tagged(split: str, name: str) -> list[Example]:
            return [dataclasses.replace(e, family=name) for e in parts[name].get(split)]

        def mixed(split: str, shuffle_seed: int) -> tuple[Example, ...]:
            examples = [e for name in self.families for e in tagged(split, name)]
            random.Random(shuffle_seed).shuffle(examples)
            return tuple(examples)

        return Splits(
            mixed("train", noise_key(self.seed, "mix-train")),
            mixed("selection", noise_key(self.seed, "mix-selection")),
            mixed("heldout", HELDOUT_SEED),
        )

    def reward(self, completion: str, example: Example) -> float:
        return self.families[example.family].reward(completion, example)

    def correct(self, completion: str, example: Example) -> bool:
        return self.families[example.family].correct(completion, example)

    def _answer(self, completion: str, example: Example) -> str | None:
        family = self.families[example.family]
        assert isinstance(family, AnswerTask)
        return family.answer(completion, example)
