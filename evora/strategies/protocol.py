"""The strategy contract: specs, payloads, results and state, all typed plain data.

    specs, payload = strategy.ask(state, generation)     # O(population) numbers + one payload
    ... workers rebuild each candidate: strategy.materialise(payload, spec) ...
    told = strategy.tell(state, specs, results)          # results: whole candidate x prompt matrices

A candidate never crosses the network as weights: it is a spec a worker rebuilds exactly
from the generation's payload. State is a dataclass of tensors, numbers, strings and
lists of them, so a checkpoint stores it as it is (`state_fields` / `state_from_fields`).

A gradient strategy (SFT, GRPO) has no population: each generation it improves its state
itself, on the driver, from a `TrainingContext`, and the loop evaluates its center like any
other strategy's:

    told = strategy.improve(state, generation, context)   # told.spend: the tokens it processed
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol

import numpy as np

from evora.lora import Tensors
from evora.lora.layout import AdapterLayout
from evora.tasks.base import Example
from evora.training.rollouts import RolloutSampler

PERTURB = "perturb"  # payload + seeded noise
CENTER = "center"  # the evaluation payload's adapter
BASE = "base"  # no adapter: the base model
MEMBER = "member"  # one of a members payload's adapters (an ecology's organelles)


@dataclass(frozen=True)
class CandidateSpec:
    """A candidate the loop asks workers to evaluate; strategies may define their own spec
    types (the GA's carries parents), as long as they have `generation`, `index`, `op`, `label`."""

    generation: int
    index: int  # position in the population; results come back in this order
    member: int = 0  # noise member id (the pair index when antithetic)
    sign: int = 1
    op: str = PERTURB
    prompts: tuple[int, ...] | None = None  # the columns this candidate is evaluated on; None: all

    @property
    def label(self) -> str:
        if self.op == MEMBER:
            return f"g{self.generation}-m{self.member}"
        if self.op != PERTURB:
            return f"g{self.generation}-{self.op}"
        return f"g{self.generation}-c{self.index}{'+' if self.sign > 0 else '-'}"


@dataclass(frozen=True)
class EvalPayload:
    """What evaluation specs (BASE, CENTER) are rebuilt from: one adapter, and its layout
    when it is not the run's (PBT members differ in rank and modules)."""

    center: Tensors | None
    layout: AdapterLayout | None = None


@dataclass(frozen=True)
class MembersPayload:
    """Several adapters at once (MEMBER specs pick one by `member`): a routed portfolio."""

    members: tuple[Tensors, ...]
    layout: AdapterLayout | None = None


@dataclass(frozen=True)
class StrategyContext:
    """What a strategy may need to start: plain data, no engine."""

    seed: int
    layout: AdapterLayout
    model_path: str  # local directory or hub id, for per-layer noise scales
    revision: str | None = None
    train_families: tuple[str, ...] = ()  # the family of each train example (task=mix; "" otherwise)
    prompts_per_generation: int = 0  # task.prompts_per_generation


@dataclass(frozen=True)
class GenerationResults:
    """Every candidate on every prompt of a generation; rows follow spec.index."""

    generation: int
    prompt_indices: tuple[int, ...]  # train-split indices, the columns
    rewards: np.ndarray  # [candidates, prompts]
    correct: np.ndarray  # [candidates, prompts], bool
    tokens: np.ndarray  # [candidates, prompts], generated tokens
    perplexity: np.ndarray | None  # [candidates, prompts] when the fitness needs it
    fitness: np.ndarray  # [candidates]: task.fitness of the row means, non-finite values replaced
    evaluated: np.ndarray | None = None  # [candidates, prompts] bool, when specs carry `prompts`; None: every cell
    texts: list[list[str]] | None = None  # [candidates][prompts] completions ("" where not evaluated), when the
    # strategy refines and keeps texts (RefiningStrategy: the ecology's self-training); None otherwise
    cell_fitness: np.ndarray | None = None  # [candidates, prompts]: task.fitness of each cell (shaping=per_prompt)


@dataclass
class Spend:
    """Tokens processed: what a run's compute is counted in (tracking/compute.py turns it into
    FLOPs), and what a gradient strategy reports of its training (Told.spend)."""

    tokens_prompt: int = 0
    tokens_generated: int = 0
    tokens_scored: int = 0
    tokens_trained: int = 0

    def add(self, other: Spend) -> None:
        for f in dataclasses.fields(self):
            vars(self)[f.name] += vars(other)[f.name]

    def tokens(self) -> int:
        return self.tokens_prompt + self.tokens_generated + self.tokens_scored + self.tokens_trained

    def flops(self, parameters: int) -> dict[str, float]:
        inference = 2.0 * parameters * (self.tokens_prompt + self.tokens_generated + self.tokens_scored)
        training = 6.0 * parameters * self.tokens_trained
        return {"flops_inference": inference, "flops_training": training, "flops": inference + training}

    def summary(self, parameters: int) -> dict[str, float]:
        return {**dataclasses.asdict(self), **self.flops(parameters)}


@dataclass
class Told:
    """What `tell` returns: the next state, scalar statistics for the logging hooks, and
    family-tree records (lineage.jsonl), if the strategy keeps one; `stop` when the strategy
    ends the run after this generation (the loop then evaluates, checkpoints and finishes)."""

    state: Any
    stats: dict[str, float]
    lineage: list[dict[str, Any]] = field(default_factory=list)
    spend: Spend = field(default_factory=Spend)  # what it trained on (gradient strategies, refinement)
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # more JSONL files: name -> lines
    stop: str | None = None  # why the strategy ends the run here, one line (CMA-ES's stop()); None: it goes on


@dataclass(frozen=True)
class TrainingContext:
    """What a gradient strategy trains from, built on the driver: the train split rendered
    as the engines see it, the task's bounded reward, and the budget check."""

    seed: int
    layout: AdapterLayout
    model_path: str
    train: tuple[Example, ...]
    prompt_text: Callable[[Example], str]  # the prompt as text, exactly as the engines see it
    prompt_ids: Callable[[Example], list[int]]
    special_tokens: bool  # whether prompt_text is tokenized with the tokenizer's special tokens (no chat template)
    target_ids: Callable[[Example], list[int]]  # the reference completion, ended by EOS
    pad_id: int
    rewards: Callable[[list[str], list[int]], list[float]]  # (completions, train indices) -> rewards
    spent: Callable[[Spend], bool]  # whether the run's budget is used up, given this call's spend
    device: str  # cpu | cuda
    max_tokens: int  # the task's completion budget (task.max_tokens)
    planned_steps: int  # the run's optimizer steps (generations x steps per generation), for schedules
    # (completion, train index) -> its canonical answer (tasks.base.AnswerTask), for majority votes;
    # None where the task has none (its answers are not strings to compare)
    answer: Callable[[str, int], str | None] | None = None
    # Samples completions on the run's engine workers (GRPO's rollouts); None where there are none.
    sample: RolloutSampler | None = None


class Strategy(Protocol):
    state_type: ClassVar[type]  # the state dataclass; its STATE_VERSION is checked on resume

    def initial_state(self, context: StrategyContext) -> Any: ...

    def ask(self, state: Any, generation: int) -> tuple[list[Any], Any]:
        """The generation's specs and its payload (sent once, via the object store)."""

    def materialise(self, payload: Any, spec: Any) -> Tensors:
        """A spec's adapter tensors (fp32), rebuilt from the payload."""

    def tell(self, state: Any, specs: list[Any], results: GenerationResults) -> Told: ...

    def center(self, state: Any) -> Tensors:
        """The adapter the state stands for (ES: the mean), for evaluation and export."""


class GradientStrategy(Protocol):
    state_type: ClassVar[type]

    def initial_state(self, context: StrategyContext) -> Any: ...

    def improve(self, state: Any, generation: int, context: TrainingContext) -> Told:
        """One generation of training (ending early once `context.spent(...)`); Told.spend counts its tokens."""

    def center(self, state: Any) -> Tensors: ...


class RefiningStrategy(Strategy, Protocol):
    """Registered with `refines=True`: a population strategy whose config may follow each tell
    with gradient refinement (the memetic GA, the ecology under plasticity=sft)."""

    @property
    def refines(self) -> bool:
        """Whether this configuration refines: the loop then builds a TrainingContext."""

    @property
    def keeps_texts(self) -> bool:
        """Whether `tell` reads the candidates' completions (GenerationResults.texts)."""

    def refine(self, state: Any, generation: int, context: TrainingContext) -> Told | None: ...


class DeviceNoiseStrategy(Strategy, Protocol):
    """Registered with `device_noise=True`: every draw of its noise is made on the engine workers
    (`materialise`, and `group_sum` when summed), never on the driver, so a worker may draw it on
    its GPU (hardware.noise_device; docs/architecture.md, "Determinism rules")."""

    def payload_to(self, payload: Any, device: str) -> Any:
        """The generation's payload with its tensors on `device`, where its candidates' noise is
        then drawn; any other payload (an evaluation's) as it is."""


class PortfolioStrategy(Strategy, Protocol):
    """A population that serves as a routed portfolio (the ecology): at the finish the loop
    chooses a routing map (family -> member) on the selection split and evaluates it."""

    routing_confidence: float  # standard errors a specialist must lead the single best by (portfolio.routing_map)

    def members(self, state: Any) -> tuple[list[str], list[Tensors]]:
        """The members' ids and adapters."""

    def train_routing(self, state: Any) -> dict[str, str]:
        """family -> member id from the search's own statistics, and "default" (no selection split)."""

    def details(self, state: Any) -> dict[str, Any]:
        """Numbers for the summary's details."""


def materialise(strategy: Strategy | None, payload: Any, spec: Any) -> Tensors | None:
    """Any spec's adapter: None for BASE, the evaluation payload's for CENTER, else the strategy's."""
    if spec.op == BASE:
        return None
    if spec.op == CENTER:
        return payload.center or None  # {}: the engines' own weights stand for the center (full-weight strategies)
    if spec.op == MEMBER:
        return payload.members[spec.member]
    assert strategy is not None, "candidate specs need the run's strategy"
    return strategy.materialise(payload, spec)


class Spec(Protocol):
    """What the loop reads of a candidate spec: CandidateSpec's fields, which a strategy's own spec
    types (the GA's, the ecology's) carry too."""

    @property
    def generation(self) -> int: ...

    @property
    def index(self) -> int: ...

    @property
    def op(self) -> str: ...

    @property
    def prompts(self) -> tuple[int, ...] | None: ...

    @property
    def label(self) -> str: ...


def prompts_of(spec: Spec) -> tuple[int, ...] | None:
    """The columns a spec is evaluated on (None: every prompt of its unit)."""
    return spec.prompts


def layout_of(payload: Any) -> AdapterLayout | None:
    """An evaluation payload's own layout (PBT members differ in rank and modules); None: the run's
    (a strategy's payloads are always on the run's layout)."""
    return payload.layout if isinstance(payload, (EvalPayload, MembersPayload)) else None


def state_fields(state: Any) -> dict[str, Any]:
    """A state dataclass as a dict of its fields (shallow: tensors are not copied)."""
    values = vars(state)
    return {f.name: values[f.name] for f in dataclasses.fields(state)}


def state_from_fields(state_type: type, fields: dict[str, Any]) -> Any:
    return state_type(**fields)


def clone_tensors(tensors: Tensors) -> Tensors:
    import torch  # here, not at the top: the CLI reads this module's protocols without torch

    return {k: v.detach().to(torch.float32).clone() for k, v in tensors.items()}


def tensors_norm(tensors: Tensors) -> float:
    """The L2 norm of all the tensors together, in float64."""
    import torch

    return math.sqrt(sum(float(torch.linalg.vector_norm(t, dtype=torch.float64)) ** 2 for t in tensors.values()))


def fitness_results(generation: int, fitness: np.ndarray) -> GenerationResults:
    """Results that carry only a fitness vector (one prompt whose reward is the fitness):
    for strategies driven by analytic objectives, as in the unit tests."""
    fitness = np.asarray(fitness, dtype=np.float64)
    column = fitness.reshape(-1, 1)
    tokens = np.zeros_like(column, dtype=np.int64)
    return GenerationResults(generation, (0,), column, column > 0, tokens, None, fitness, cell_fitness=column)
