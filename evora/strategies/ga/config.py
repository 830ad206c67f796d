"""strategy=ga: its config schema and the rules checked before Ray starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from evora.config.checks import choice, require
from evora.strategies.adapter_init import check_init
from evora.strategies.shaping import PER_PROMPT


@dataclass(frozen=True)
class GAConfig:
    name: str = "ga"
    population: int = 16
    keep_top: int = 2  # elites carried unchanged into the next generation
    parents: int = 4  # best members of a generation that may parent the next one (>= keep_top)
    selection: str = "tournament"  # truncation | tournament (among the parents)
    shaping: str = "none"  # none: rank by fitness | per_prompt: by the mean of per-prompt z-scored fitness
    tournament_size: int = 2
    crossover_rate: float = 0.2
    crossover: str = "module"  # module | layer | blend
    mutation_rate: float = 1.0  # chance that a module (its A and B) is mutated
    mutation_scale: float = 0.01
    self_adaptive: bool = False  # each member carries its own mutation scale
    adaptation_rate: float = 0.2  # log-normal step of a self-adaptive scale
    encoding: str = "tensors"  # tensors | seeds (a chain of mutation seeds; needs crossover_rate=0)
    noise_scale: str = "uniform"  # uniform | per_layer
    init: str = "random"  # random | path
    init_a_std: Optional[float] = None
    init_b_std: float = 0.0
    init_path: Optional[str] = None
    refine: str = "none"  # memetic GA: none | sft | grpo gradient steps for the elite (Lamarckian)
    refine_every: int = 5  # refine after every k-th generation
    refine_steps: int = 10  # gradient steps per refinement
    refine_learning_rate: float = 2.0e-4  # AdamW learning rate of a refinement (fresh optimizer each time)
    refine_group_size: int = 8  # refine=grpo: completions per prompt


def check_ga(ga: GAConfig, run: Any = None) -> None:
    choice("strategy.shaping", ga.shaping, ("none", PER_PROMPT))
    _check_selection(ga)
    _check_variation(ga)
    check_init(ga)
    _check_refine(ga)


def _check_selection(ga: GAConfig) -> None:
    """Population, elites, parents and how parents are picked."""
    require(ga.population >= 2, "strategy.population", ga.population, "must be an integer >= 2")
    require(
        1 <= ga.keep_top < ga.population,
        "strategy.keep_top",
        ga.keep_top,
        f"must be in 1..strategy.population - 1 ({ga.population - 1}): elites leave room for offspring",
    )
    require(
        ga.keep_top <= ga.parents <= ga.population,
        "strategy.parents",
        ga.parents,
        f"must be in strategy.keep_top..strategy.population ({ga.keep_top}..{ga.population})",
    )
    choice("strategy.selection", ga.selection, ("truncation", "tournament"))
    require(
        1 <= ga.tournament_size <= ga.parents,
        "strategy.tournament_size",
        ga.tournament_size,
        f"must be in 1..strategy.parents ({ga.parents})",
    )


def _check_variation(ga: GAConfig) -> None:
    """Crossover, mutation and the encoding they act on."""
    for key in ("crossover_rate", "mutation_rate"):
        value = vars(ga)[key]
        require(0 <= value <= 1, f"strategy.{key}", value, "must be in [0, 1]")
    if ga.crossover_rate > 0:
        require(
            ga.parents >= 2,
            "strategy.crossover_rate",
            ga.crossover_rate,
            "crossover needs two parents: set strategy.parents >= 2 or strategy.crossover_rate=0",
        )
    choice("strategy.crossover", ga.crossover, ("module", "layer", "blend"))
    require(ga.mutation_scale > 0, "strategy.mutation_scale", ga.mutation_scale, "must be > 0")
    require(ga.adaptation_rate >= 0, "strategy.adaptation_rate", ga.adaptation_rate, "must be >= 0")
    choice("strategy.encoding", ga.encoding, ("tensors", "seeds"))
    if ga.encoding == "seeds":
        require(
            ga.crossover_rate == 0,
            "strategy.encoding",
            ga.encoding,
            "seeds (a chain of mutation seeds) needs strategy.crossover_rate=0",
        )


def _check_refine(ga: GAConfig) -> None:
    """The memetic GA's gradient refinement of the elite."""
    choice("strategy.refine", ga.refine, ("none", "sft", "grpo"))
    if ga.refine != "none":
        for key in ("refine_every", "refine_steps"):
            require(vars(ga)[key] >= 1, f"strategy.{key}", vars(ga)[key], "must be an integer >= 1")
        require(ga.refine_learning_rate > 0, "strategy.refine_learning_rate", ga.refine_learning_rate, "must be > 0")
        require(ga.refine_group_size >= 2, "strategy.refine_group_size", ga.refine_group_size, "must be >= 2")
        require(
            ga.encoding == "tensors",
            "strategy.refine",
            ga.refine,
            "a refined elite is a new adapter, not a chain of seeds: needs strategy.encoding=tensors",
        )
