"""Each built-in strategy against the protocol of the kind it registers (`protocol.KINDS`),
checked by the type checker (`make test` runs mypy over evora/): a missing or mistyped
member is a type error here, not an AttributeError in the middle of a run. Never called."""

from __future__ import annotations

from evora.strategies.ecology.strategy import Ecology
from evora.strategies.eggroll.strategy import EggrollStrategy
from evora.strategies.es.strategy import EvolutionStrategy
from evora.strategies.es_full.strategy import EsFullStrategy
from evora.strategies.full_weights import FullWeightStrategy, InPlaceStrategy
from evora.strategies.ga.strategy import GeneticAlgorithm
from evora.strategies.grpo.strategy import GroupRelativePolicyOptimization
from evora.strategies.noise_sums import SummedStrategy
from evora.strategies.protocol import GradientStrategy, PortfolioStrategy, RefiningStrategy, Strategy
from evora.strategies.sft.strategy import SupervisedFineTuning


def built_ins_conform(
    es: EvolutionStrategy,
    ga: GeneticAlgorithm,
    ecology: Ecology,
    eggroll: EggrollStrategy,
    es_full: EsFullStrategy,
    sft: SupervisedFineTuning,
    grpo: GroupRelativePolicyOptimization,
) -> None:
    population: list[Strategy] = [es, ga]
    refining: list[RefiningStrategy] = [ga, ecology]  # registered with refines=True
    portfolio: PortfolioStrategy = ecology
    full_weight: list[FullWeightStrategy] = [eggroll, es_full]
    in_place: InPlaceStrategy = es_full  # registered with in_place=True
    summed: SummedStrategy = es  # registered with summed=True
    gradient: list[GradientStrategy] = [sft, grpo]
    del population, refining, portfolio, full_weight, in_place, summed, gradient
