"""EngineWorker: one engine per GPU (or per CPU slot) that evaluates work units.

A unit is a few candidate specs and prompt indices. The worker rebuilds each candidate
from the generation's payload (fetched once from the object store) and its spec,
writes it to tmpfs under a fresh LoRA id, runs one batched `generate` over every
(candidate, prompt) pair (each `samples` times when the split's decoding samples:
`distributed/cells.py`), scores the completions with the task's reward and returns
numbers only: rewards, token counts, timings, memory (and, when the unit asks, the
reference completions' perplexity and the completions' KL divergence from the base model).
Candidates of an in-place strategy (es_full) are not LoRAs: each perturbs the engine's own
weights for its requests (`distributed/in_place.py`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch

from evora.distributed.cells import (
    Cell,
    CellValues,
    Requests,
    cell_values,
    evaluated_cells,
    per_cell_means,
    requests_of,
    scatter,
    text_rows,
)
from evora.distributed.in_place import complete_in_place
from evora.distributed.memory_deaths import oom_kills
from evora.distributed.payloads import PayloadReader
from evora.distributed.units import GroupSum, GroupTask, RolloutResult, RolloutUnit
from evora.distributed.worker_memory import MemoryGauge
from evora.distributed.worker_rollouts import WorkerRollouts
from evora.distributed.worker_spec import ADAPTER_DTYPES, WorkerSpec, load_tokenizer, resolve_task
from evora.engines import AdapterRef, Completion, create_engine
from evora.engines.adapter_store import AdapterScratch
from evora.engines.deferred_imports import defer_sklearn
from evora.errors import RunError
from evora.lora import Tensors
from evora.lora.base_weights import read_weights
from evora.lora.noise import tensors_to
from evora.strategies import get_strategy
from evora.strategies.full_weights import InPlaceStrategy, MovesWeights, matrix_name, transposed_matrices
from evora.strategies.master_weights import MasterWeights
from evora.strategies.noise_sums import SummedStrategy
from evora.strategies.protocol import BASE, CENTER, MEMBER, PERTURB, layout_of, materialise
from evora.tasks.base import AnswerTask
from evora.tasks.decoding import Decoding, decoding_of, sample_seed
from evora.tasks.fitness import perplexity
from evora.tasks.prompts import PromptRenderer
from evora.tasks.reward_pool import reward_scorer
from evora.tasks.scores import RewardCounts, Scores


@dataclass(frozen=True)
class WorkUnit:
    specs: tuple[Any, ...]
    split: str  # train | selection | heldout
    prompt_indices: tuple[int, ...]
    keep_texts: bool = False
    perplexity: bool = False  # also score the reference completions (teacher forcing)
    kl: bool = False  # also the per-token KL(adapter || base) along each adapter's completions


EVALUATION_OPS = (BASE, CENTER, MEMBER)
EVALUATION_STREAM = "evaluation"


@dataclass
class UnitResult:
    """Per (candidate, prompt) numbers; rows follow `indices` (spec.index)."""

    indices: list[int]
    rewards: np.ndarray
    correct: np.ndarray  # bool; with several samples a cell, the aggregate's correctness in [0, 1]
    tokens: np.ndarray  # generated tokens (with several samples a cell, their mean)
    reward: RewardCounts
    timings: dict[str, float]
    worker: int
    rss_mb: float
    tokens_prompt: int = 0  # prompt tokens prefilled for generation
    tokens_scored: int = 0  # prompt + reference tokens run through for perplexity, + the KL's forwards
    perplexity: np.ndarray | None = None
    kl: np.ndarray | None = None  # mean per-token KL of each completion to the base model; 0 for BASE rows
    texts: list[list[str]] | None = None
    evaluated: np.ndarray | None = None  # [spec, prompt] bool when specs were routed to some prompts; None: all
    tokens_generated: int = 0  # over every sample
    samples: int = 1  # completions per cell
    correct_counts: np.ndarray | None = None  # [spec, prompt]: correct samples, with several a cell (pass@k)


class EngineWorker:
    def __init__(self, spec: WorkerSpec, index: int):
        defer_sklearn()  # before the tokenizer imports transformers.generation
        self.index = index
        self.layout = spec.layout
        self.max_tokens = spec.task.max_tokens
        torch.set_num_threads(spec.engine.cpu_threads)
        self.task, self.splits = spec.resolved or resolve_task(spec.task, spec.seed)
        self.rewards = reward_scorer(self.task, spec.task, spec.seed, spec.engine.device)
        self.renderer = PromptRenderer(
            load_tokenizer(spec.engine), spec.task.prompt_format, self.task.plain_template, spec.task.system_prompt
        )
        self._prompt_ids: dict[tuple[str, int], list[int]] = {}
        self.strategy = (
            None if spec.strategy is None else get_strategy(spec.strategy.name).build(spec.strategy, spec.seed)
        )
        self.dtype = ADAPTER_DTYPES[spec.adapter_dtype]
        self.engine = create_engine(spec.engine_name, spec.engine)
        self.scratch = AdapterScratch(spec.adapter_dir, spec.run_tag)
        self.model, self.revision = spec.engine.model, spec.engine.revision
        self.master: MasterWeights | None = None  # full-weight strategies: fp32 copies of the selected matrices
        self.master_device = spec.master_device  # where they live, and their noise is drawn
        self._original: Tensors | None = None  # full-weight strategies: the model's own selected matrices (KL)
        self.in_place = spec.strategy is not None and get_strategy(spec.strategy.name).in_place
        self.run_seed = spec.seed
        self.task_config = spec.task  # its decoding, per split
        self.memory = MemoryGauge()
        self._payload_here = PayloadReader(self.strategy, spec.noise_device)
        self.rollouts = WorkerRollouts(self.engine, self.scratch, self.layout, self.dtype, self._release)

    def info(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        return {
            "worker": self.index,
            "pid": os.getpid(),
            "node": context.get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            # The GPU model its noise is drawn on (a device class: checkpoint.noise_classes); cpu without one.
            "device": torch.cuda.get_device_name(0) if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu",
            "oom_kills": oom_kills(),  # the node's, at this worker's start (distributed/memory_deaths.py)
        }

    def prompt_ids(self, split: str, index: int) -> list[int]:
        key = (split, index)
        if key not in self._prompt_ids:
            self._prompt_ids[key] = self.renderer.ids(self.splits.get(split)[index])
        return self._prompt_ids[key]

    def evaluate(self, payload: Any, unit: WorkUnit) -> UnitResult:
        """`payload`: the strategy's, or a payloads.SharedPayload holding a reference to it."""
        start = time.perf_counter()
        payload = self._payload_here(payload)
        refs = self._adapters(payload, unit)
        materialised = time.perf_counter()
        examples = [self.splits.get(unit.split)[i] for i in unit.prompt_indices]
        prompts = [self.prompt_ids(unit.split, i) for i in unit.prompt_indices]
        mask = evaluated_cells(unit.specs, unit.prompt_indices)
        decoding = decoding_of(self.task_config, unit.split)
        requests = requests_of(mask, prompts, refs, decoding, self._seeds(unit))
        # A routed unit may hold no pair at all (members routed to other examples): no engine call.
        completions, measured = self._complete(payload, unit, requests) if requests.cells else ([], None)
        generated = time.perf_counter()
        values, scores = self._score(decoding, completions, [examples[c] for _, c in requests.cells])
        scored = time.perf_counter()
        rewarded = scatter(mask, np.logical_not(values.failed), False, bool)  # evaluated, and its rewards scored
        ppl, tokens_scored = self.perplexities(unit, examples, prompts, requests.cells, refs, mask)
        perplexity_done = time.perf_counter()
        kl, tokens_kl = self.kl_to_base(requests, completions, measured) if unit.kl else (None, 0)
        self._release(refs)
        return UnitResult(
            indices=[s.index for s in unit.specs],
            rewards=scatter(mask, values.rewards, np.nan),
            correct=scatter(mask, values.correct, False, bool if decoding.samples == 1 else np.float64),
            tokens=scatter(mask, values.tokens, 0, np.int64 if decoding.samples == 1 else np.float64),
            reward=scores.counts(failed_cells=int(sum(values.failed))),
            timings={
                "materialise": materialised - start,
                "generate": generated - materialised,
                "reward": scored - generated,
                "perplexity": perplexity_done - scored,
                "kl": time.perf_counter() - perplexity_done,
            },
            worker=self.index,
            rss_mb=self.memory.rss_mb(),
            tokens_prompt=sum(len(p) for p in requests.prompts),
            tokens_generated=sum(c.num_tokens for c in completions),
            tokens_scored=tokens_scored + tokens_kl,
            perplexity=ppl,
            kl=None if kl is None else scatter(mask, kl, np.nan),
            # With several samples a cell, its first sample's completion stands for it.
            texts=text_rows(mask, [c.text for c in completions[:: decoding.samples]]) if unit.keep_texts else None,
            evaluated=None if rewarded.all() else rewarded,
            samples=decoding.samples,
            correct_counts=None if values.correct_counts is None else scatter(mask, values.correct_counts, 0, np.int64),
        )

    def noise_sum(self, payload: Any, task: GroupTask) -> GroupSum:
        """A summed strategy's group of members' weighted noise (`payload`: the generation's, as
        `evaluate` got it, read once)."""
        start = time.perf_counter()
        payload = self._payload_here(payload)
        assert self.strategy is not None, "a summed strategy's workers build it"
        summed: SummedStrategy = self.strategy
        # The driver adds the groups on the host (it may have no GPU): a sum drawn on the GPU comes back.
        tensors = tensors_to(summed.group_sum(payload, task.sums, task.group), "cpu")
        return GroupSum(task.group, tensors, self.index, time.perf_counter() - start)

    def rollout(self, payload: Any, unit: RolloutUnit) -> RolloutResult:
        """A trainer's completions (GRPO's groups; `payload`: the step's `Policy`, as `evaluate`
        gets its payload) and, with `unit.logprobs`, their log-probabilities."""
        return self.rollouts.run(self._payload_here(payload), unit, self.index)

    def _adapters(self, payload: Any, unit: WorkUnit) -> list[AdapterRef | None]:
        """Each spec's adapter, loaded or held; None for the base model, the engine's own weights
        (CENTER of a full-weight strategy) and candidates that perturb those weights in place."""
        layout = layout_of(payload) or self.layout  # PBT members differ in rank and modules
        refs: list[AdapterRef | None] = []
        in_memory = self.engine.loads_from_memory
        for spec in unit.specs:
            tensors = None if self.in_place and spec.op == PERTURB else materialise(self.strategy, payload, spec)
            keep = None if tensors is None else self.scratch.keep(spec.label, tensors, layout, self.dtype, in_memory)
            refs.append(keep)
        return refs

    def _release(self, refs: list[AdapterRef | None]) -> None:
        loaded = [r for r in refs if r is not None]
        self.engine.release(loaded)
        self.scratch.remove(loaded)

    def _seeds(self, unit: WorkUnit) -> Callable[[int, int, int], int]:
        def seed(row: int, column: int, sample: int) -> int:
            spec, prompt = unit.specs[row], unit.prompt_indices[column]
            # Evaluations (base, center, members) share one stream: common random numbers, so two
            # adapters' held-out numbers differ by their weights, not by their draws.
            candidate = EVALUATION_STREAM if spec.op in EVALUATION_OPS else spec.label
            return sample_seed(self.run_seed, unit.split, candidate, prompt, sample)

        return seed

    def _complete(
        self, payload: Any, unit: WorkUnit, requests: Requests
    ) -> tuple[list[Completion], list[list[float]] | None]:
        """The requests' completions; in place, also each one's per-token KL to the model's own
        weights when the unit asks for it (measured while the candidate's weights are set)."""
        if not self.in_place:
            completions = self.engine.generate(requests.prompts, requests.adapters, self.max_tokens, requests.sampling)
            return completions, None
        kl_base = self._kl_base() if unit.kl else None
        return complete_in_place(self.engine, self._in_place(), payload, unit.specs, requests, self.max_tokens, kl_base)

    def _in_place(self) -> tuple[InPlaceStrategy, MasterWeights]:
        assert self.strategy is not None and self.master is not None, "in-place candidates need synced weights"
        return self.strategy, self.master

    def _score(
        self, decoding: Decoding, completions: list[Completion], examples: list[Any]
    ) -> tuple[CellValues, Scores]:
        """Each request's reward and correctness, aggregated per cell."""
        n = decoding.samples
        cell_examples = [e for e in examples for _ in range(n)]
        scores = self.rewards.score([c.text for c in completions], cell_examples)  # all at once
        answers = None
        if decoding.aggregate == "majority" and n > 1:
            answers = [self._answer(c.text, e) for c, e in zip(completions, cell_examples)]
        tokens = [c.num_tokens for c in completions]
        values = cell_values(decoding, scores.rewards, scores.correct, tokens, answers, scores.failed)
        return values, scores

    def _answer(self, completion: str, example: Any) -> str | None:
        assert isinstance(self.task, AnswerTask), "aggregate=majority is validated against the task"
        return self.task.answer(completion, example)

    def perplexities(
        self,
        unit: WorkUnit,
        examples: list[Any],
        prompts: list[list[int]],
        cells: list[Cell],
        refs: list[AdapterRef | None],
        mask: np.ndarray,
    ) -> tuple[np.ndarray | None, int]:
        """Perplexity of the reference completions under each cell's adapter (when the unit asks
        for it), and the tokens that scoring ran."""
        if not unit.perplexity:
            return None, 0
        targets = [self.renderer.target_ids(e) for e in examples]
        adapters = [refs[r] for r, _ in cells]
        logprobs = self.engine.score([prompts[c] for _, c in cells], [targets[c] for _, c in cells], adapters)
        tokens = sum(len(prompts[c]) + len(targets[c]) for _, c in cells)
        return scatter(mask, [perplexity(lp) for lp in logprobs], np.nan), tokens

    def kl_to_base(
        self, requests: Requests, completions: list[Completion], measured: list[list[float]] | None = None
    ) -> tuple[list[float], int]:
        """Mean per-token KL(adapter || base) of each cell's completions (0.0 for base rows and
        empty completions; the mean over a cell's samples), and the tokens it ran: prompt +
        completion, once with the adapter and once without. Under moved weights (full-weight
        strategies) the base is the model's own weights, and every row is measured; `measured`:
        per-request KLs measured already (in-place candidates)."""
        prompts, adapters, base = requests.prompts, requests.adapters, self._kl_base()
        rows = [i for i, a in enumerate(adapters) if a is not None or base is not None]
        if measured is not None:
            per_token = [measured[i] for i in rows]
        else:
            ids = [list(completions[i].token_ids) for i in rows]
            per_token = self.engine.kl_to_base([prompts[i] for i in rows], ids, [adapters[i] for i in rows], base)
        kl = np.zeros(len(prompts), dtype=np.float64)
        for i, values in zip(rows, per_token):
            kl[i] = float(np.mean(values)) if values else 0.0
        # Engines skip empty completions: nothing was run for them.
        tokens = 2 * sum(len(prompts[i]) + len(completions[i].token_ids) for i in rows if completions[i].token_ids)
        return per_cell_means(list(kl), requests.samples), tokens

    # --- base weights (full-weight strategies) ---------------------------------------------

    def sync_weights(
        self, snapshot: Tensors | None, snapshot_generation: int, updates: list[Any], expected: str | None = None
    ) -> dict[str, Any]:
        """Bring the engine's base weights to generation `snapshot_generation + len(updates)`:
        apply only the updates it lacks, or rebuild from the snapshot (None: the model's own
        weights) when it is ahead or behind it. Returns the checksum of the master copies."""
        started = time.perf_counter()
        target = snapshot_generation + len(updates)
        master = self.master
        if master is None or not snapshot_generation <= master.generation <= target:
            master = self._master_at(snapshot, snapshot_generation)
        norm = 0.0
        pending = updates[master.generation - snapshot_generation :]
        for update in pending:
            norm = self._full_weight().apply(master, update)
        if master is not self.master or pending:
            self.master = master
            self.engine.set_base_weights(master.tensors)
        checksum = master.checksum()
        if expected is not None and checksum != expected:
            raise RunError(
                f"worker {self.index}: its weights of generation {target} differ from the other workers' "
                f"(checksum {checksum[:12]} against {expected[:12]})"
            )
        return {
            "worker": self.index,
            "generation": target,
            "checksum": checksum,
            "finite": master.finite(),
            "update_norm": norm,
            "seconds": time.perf_counter() - started,
        }

    def _kl_base(self) -> Tensors | None:
        """The model's own weights of the selected matrices, once an engine's weights may have
        moved (full-weight strategies); None: the engine's weights are the base model's."""
        if self.master is None:
            return None
        if self._original is None:
            names = [matrix_name(slot.name) for slot in self.layout.modules]
            self._original = read_weights(self.model, names, self.revision)
        return self._original

    def _full_weight(self) -> MovesWeights:
        assert self.strategy is not None, "a full-weight run's workers build its strategy"
        return self.strategy

    def _master_at(self, snapshot: Tensors | None, generation: int) -> MasterWeights:
        transposed, strategy = transposed_matrices(self.layout), self._full_weight()
        if snapshot is not None and not strategy.anchored:
            return MasterWeights.from_snapshot(snapshot, generation, transposed).to(self.master_device)
        names = [matrix_name(slot.name) for slot in self.layout.modules]
        started = strategy.start_master(read_weights(self.model, names, self.revision), transposed)
        if snapshot is not None:  # decay's anchor: the model's own weights, never a snapshot's
            started = replace(MasterWeights.from_snapshot(snapshot, generation, transposed), anchor=started.anchor)
        return started.to(self.master_device)

    def master_weights(self) -> Tensors:
        """The master copies (and optimizer moments), for a snapshot or the export."""
        assert self.master is not None, "no base weights were synced on this worker"
        return self.master.snapshot()

    def shutdown(self) -> None:
        self.rewards.close()
        self.scratch.cleanup()
        self.engine.shutdown()
