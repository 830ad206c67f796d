"""strategy=ga: a genetic algorithm over LoRA adapters (elitism, selection, pair-preserving
crossover, seeded mutation)."""

from typing import TYPE_CHECKING

from evora.strategies.ga.config import GAConfig, check_ga
from evora.strategies.registry import lazy_exports, register_strategy

register_strategy(
    "ga",
    config=GAConfig,
    refines=True,
    summary="genetic algorithm over the LoRA tensors (elitism, crossover, mutation)",
    validate=check_ga,
    center="elite",
    report_keys=("population", "keep_top", "parents", "selection", "crossover_rate", "mutation_scale"),
    console_keys=(("best_fitness", "best"),),
    strategy="evora.strategies.ga.strategy:GeneticAlgorithm",
)

if TYPE_CHECKING:
    from evora.strategies.ga.strategy import GAPayload, GASpec, GAState, GeneticAlgorithm
__getattr__ = lazy_exports("evora.strategies.ga.strategy", ("GAPayload", "GASpec", "GAState", "GeneticAlgorithm"))

__all__ = ["GAConfig", "GAPayload", "GASpec", "GAState", "GeneticAlgorithm"]
