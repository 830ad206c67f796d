"""EngineWorker: one engine per GPU (or per CPU slot) that evaluates work units.

A unit is a few candidate specs and prompt indices. The worker rebuilds each candidate
from the generation's payload (fetched once from the object store) and its spec,
writes it to tmpfs under a fresh LoRA id, runs one batched `generate` over every
(candidate, prompt) pair, scores the completions with the task's reward and returns
numbers only: rewards, token counts, timings, memory (and, when the unit asks, the
reference completions' perplexity and the completions' KL divergence from the base model).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from evora.config.schema import RunConfig, TaskConfig, vllm_lora_rank
from evora.engines import AdapterRef, Completion, EngineSpec, create_engine
from evora.engines.adapter_store import AdapterScratch
from evora.errors import RunError
from evora.lora import Tensors
from evora.lora.base_weights import read_weights
from evora.lora.layout import AdapterLayout
from evora.strategies import get_strategy
from evora.strategies.full_weights import FullWeightStrategy, MasterWeights, matrix_name, transposed_matrices
from evora.strategies.protocol import materialise, prompts_of
from evora.tasks import Splits, Task, build_task
from evora.tasks.fitness import perplexity
from evora.tasks.prompts import PromptRenderer
from evora.tasks.reward_pool import reward_scorer

ADAPTER_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs, and no more: its engine, the task, and the strategy config
    that rebuilds candidates (None for evaluation-only pools)."""

    engine_name: str
    engine: EngineSpec
    task: TaskConfig
    seed: int  # the run seed: data splits and candidate noise derive from it
    layout: AdapterLayout
    adapter_dtype: str  # candidates are materialised in the engine's dtype
    adapter_dir: str
    run_tag: str  # names this run's tmpfs scratch folders
    strategy: Any = None
    # The task and its splits as the run plan resolved them; None: the worker builds them from `task`.
    resolved: tuple[Task, Splits] | None = None


@dataclass(frozen=True)
class WorkUnit:
    specs: tuple[Any, ...]
    split: str  # train | selection | heldout
    prompt_indices: tuple[int, ...]
    keep_texts: bool = False
    perplexity: bool = False  # also score the reference completions (teacher forcing)
    kl: bool = False  # also the per-token KL(adapter || base) along each adapter's completions


@dataclass
class UnitResult:
    """Per (candidate, prompt) numbers; rows follow `indices` (spec.index)."""

    indices: list[int]
    rewards: np.ndarray
    correct: np.ndarray  # bool
    tokens: np.ndarray
    reward_errors: int
    reward_timeouts: int
    timings: dict[str, float]
    worker: int
    rss_mb: float
    tokens_prompt: int = 0  # prompt tokens prefilled for generation
    tokens_scored: int = 0  # prompt + reference tokens run through for perplexity, + the KL's forwards
    perplexity: np.ndarray | None = None
    kl: np.ndarray | None = None  # mean per-token KL of each completion to the base model; 0 for BASE rows
    texts: list[list[str]] | None = None
    evaluated: np.ndarray | None = None  # [spec, prompt] bool when specs were routed to some prompts; None: all


def engine_spec(run: RunConfig, model_path: str, max_lora_rank: int | None = None) -> EngineSpec:
    hw, engine = run.hardware, run.engine
    return EngineSpec(
        model=model_path,
        tokenizer=run.model.tokenizer,
        revision=run.model.revision,
        dtype=run.model.dtype,
        max_model_len=run.model.max_model_len,
        max_lora_rank=max_lora_rank or run.lora.rank,
        max_loras=engine.max_loras,
        max_cpu_loras=host_lora_slots(run),
        max_num_seqs=engine.max_num_seqs,
        enforce_eager=engine.enforce_eager,
        tensor_parallel_size=hw.tensor_parallel_size,
        gpu_memory_utilization=hw.gpu_memory_utilization,
        kv_cache_gib=hw.kv_cache_gib,
        cpu_threads=hw.cpu_threads_per_worker,
        seed=run.seed,
        trust_remote_code=run.model.trust_remote_code,
        device="cuda" if hw.gpus_per_worker > 0 else "cpu",
        ignore_eos=engine.ignore_eos,
        adapters_in_memory=engine.adapters_in_memory,
        vllm_args=dict(engine.vllm_args),
    )


def host_lora_slots(run: RunConfig) -> int:
    """Adapters an engine keeps loaded on its host: a work unit's candidates. Under
    `engine.units=whole` a unit is a worker's share of the population: all of it, were that
    worker the last one left (beyond this, vLLM would evict and re-read adapters mid-call)."""
    engine = run.engine
    if engine.units == "whole":
        return max(engine.max_loras, int(getattr(run.strategy, "population", 0) or 0))
    return engine.max_loras


def engine_rank(layout: AdapterLayout) -> int:
    return vllm_lora_rank(layout.rank)


def adapter_dtype(model_dtype: str, model_path: str) -> str:
    """The engine's dtype: candidates are materialised in it (fp32 master weights stay on the driver)."""
    if model_dtype == "auto":
        config_file = Path(model_path) / "config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        model_dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    return model_dtype if model_dtype in ADAPTER_DTYPES else "float32"


def worker_spec(
    run: RunConfig,
    model_path: str,
    layout: AdapterLayout,
    run_tag: str,
    *,
    with_strategy: bool = True,
    max_lora_rank: int | None = None,
    resolved: tuple[Task, Splits] | None = None,
) -> WorkerSpec:
    # The engine wraps the modules the layout targets (PBT: the union over its search space).
    engine = replace(engine_spec(run, model_path, max_lora_rank), lora_target_modules=tuple(layout.target_modules))
    return WorkerSpec(
        run.engine.name,
        engine,
        run.task,
        run.seed,
        layout,
        adapter_dtype(run.model.dtype, model_path),
        run.engine.adapter_dir,
        run_tag,
        run.strategy if with_strategy else None,
        resolved,
    )


def resolve_task(cfg: TaskConfig, seed: int) -> tuple[Task, Splits]:
    task = build_task(cfg, seed)
    return task, task.splits()


def load_tokenizer(spec: EngineSpec) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        spec.tokenizer or spec.model, revision=spec.revision, trust_remote_code=spec.trust_remote_code
    )


def evaluated_cells(unit: WorkUnit) -> np.ndarray:
    """[spec, prompt] bool: every cell, except where a spec names the prompts it is evaluated on."""
    mask = np.ones((len(unit.specs), len(unit.prompt_indices)), dtype=bool)
    for row, spec in enumerate(unit.specs):
        routed = prompts_of(spec)
        if routed is not None:
            wanted = set(routed)
            mask[row] = [index in wanted for index in unit.prompt_indices]
    return mask


def scatter(mask: np.ndarray, values: Any, fill: Any, dtype: Any = np.float64) -> np.ndarray:
    """Values of the evaluated cells (row-major) into a [spec, prompt] matrix; `fill` elsewhere."""
    out = np.full(mask.shape, fill, dtype=dtype)
    out[mask] = np.asarray(values, dtype=dtype)
    return out


def text_rows(mask: np.ndarray, texts: list[str]) -> list[list[str]]:
    rows, it = [], iter(texts)
    for row in mask:
        rows.append([next(it) if evaluated else "" for evaluated in row])
    return rows


def process_tree_rss_mb() -> float:
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]) / 2**20


class EngineWorker:
    def __init__(self, spec: WorkerSpec, index: int):
        self.index = index
        self.layout = spec.layout
        self.max_tokens = spec.task.max_tokens
        torch.set_num_threads(spec.engine.cpu_threads)
        self.task, self.splits = spec.resolved or resolve_task(spec.task, spec.seed)
        self.rewards = reward_scorer(self.task, spec.task, spec.seed)
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

    def info(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        return {
            "worker": self.index,
            "pid": os.getpid(),
            "node": context.get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }

    def prompt_ids(self, split: str, index: int) -> list[int]:
        key = (split, index)
        if key not in self._prompt_ids:
            self._prompt_ids[key] = self.renderer.ids(self.splits.get(split)[index])
        return self._prompt_ids[key]

    def evaluate(self, payload: Any, unit: WorkUnit) -> UnitResult:
        start = time.perf_counter()
        layout = getattr(payload, "layout", None) or self.layout  # PBT members differ in rank and modules
        refs = []
        keep = self.scratch.hold if self.engine.loads_from_memory else self.scratch.write
        for spec in unit.specs:
            tensors = materialise(self.strategy, payload, spec)
            refs.append(None if tensors is None else keep(spec.label, tensors, layout, self.dtype))
        materialised = time.perf_counter()
        examples = [self.splits.get(unit.split)[i] for i in unit.prompt_indices]
        prompts = [self.prompt_ids(unit.split, i) for i in unit.prompt_indices]
        mask = evaluated_cells(unit)
        cells = [(row, col) for row in range(len(refs)) for col in range(len(prompts)) if mask[row, col]]
        pairs_prompts, pairs_adapters = [prompts[c] for _, c in cells], [refs[r] for r, _ in cells]
        # A routed unit may hold no pair at all (members routed to other examples): no engine call.
        completions = self.engine.generate(pairs_prompts, pairs_adapters, self.max_tokens) if cells else []
        generated = time.perf_counter()
        scores = self.rewards.score([c.text for c in completions], [examples[c] for _, c in cells])  # all at once
        scored = time.perf_counter()
        ppl, tokens_scored = self.perplexities(unit, examples, prompts, cells, pairs_adapters, mask)
        perplexity_done = time.perf_counter()
        kl, tokens_kl = self.kl_to_base(pairs_prompts, completions, pairs_adapters) if unit.kl else (None, 0)
        loaded = [r for r in refs if r is not None]
        self.engine.release(loaded)
        self.scratch.remove(loaded)
        return UnitResult(
            indices=[s.index for s in unit.specs],
            rewards=scatter(mask, scores.rewards, np.nan),
            correct=scatter(mask, scores.correct, False, bool),
            tokens=scatter(mask, [c.num_tokens for c in completions], 0, np.int64),
            reward_errors=scores.errors,
            reward_timeouts=scores.timeouts,
            timings={
                "materialise": materialised - start,
                "generate": generated - materialised,
                "reward": scored - generated,
                "perplexity": perplexity_done - scored,
                "kl": time.perf_counter() - perplexity_done,
            },
            worker=self.index,
            rss_mb=process_tree_rss_mb(),
            tokens_prompt=sum(len(p) for p in pairs_prompts),
            tokens_scored=tokens_scored + tokens_kl,
            perplexity=ppl,
            kl=None if kl is None else scatter(mask, kl, np.nan),
            texts=text_rows(mask, [c.text for c in completions]) if unit.keep_texts else None,
            evaluated=None if mask.all() else mask,
        )

    def perplexities(
        self,
        unit: WorkUnit,
        examples: list[Any],
        prompts: list[list[int]],
        cells: list[tuple[int, int]],
        adapters: list[AdapterRef | None],
        mask: np.ndarray,
    ) -> tuple[np.ndarray | None, int]:
        """Perplexity of the reference completions under each cell's adapter (when the unit asks
        for it), and the tokens that scoring ran."""
        if not unit.perplexity:
            return None, 0
        targets = [self.renderer.target_ids(e) for e in examples]
        logprobs = self.engine.score([prompts[c] for _, c in cells], [targets[c] for _, c in cells], adapters)
        tokens = sum(len(prompts[c]) + len(targets[c]) for _, c in cells)
        return scatter(mask, [perplexity(lp) for lp in logprobs], np.nan), tokens

    def kl_to_base(
        self, prompts: list[list[int]], completions: list[Completion], adapters: list[AdapterRef | None]
    ) -> tuple[np.ndarray, int]:
        """Mean per-token KL(adapter || base) of each completion (0.0 for base rows and empty
        completions), and the tokens it ran: prompt + completion, once with the adapter and
        once without."""
        rows = [i for i, a in enumerate(adapters) if a is not None]
        per_token = self.engine.kl_to_base(
            [prompts[i] for i in rows], [list(completions[i].token_ids) for i in rows], [adapters[i] for i in rows]
        )
        kl = np.zeros(len(prompts), dtype=np.float64)
        for i, values in zip(rows, per_token):
            kl[i] = float(np.mean(values)) if values else 0.0
        # Engines skip empty completions: nothing was run for them.
        tokens = 2 * sum(len(prompts[i]) + len(completions[i].token_ids) for i in rows if completions[i].token_ids)
        return kl, tokens

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

    def _full_weight(self) -> FullWeightStrategy:
        assert self.strategy is not None, "a full-weight run's workers build its strategy"
        return self.strategy

    def _master_at(self, snapshot: Tensors | None, generation: int) -> MasterWeights:
        transposed = transposed_matrices(self.layout)
        if snapshot is not None:
            return MasterWeights.from_snapshot(snapshot, generation, transposed)
        names = [matrix_name(slot.name) for slot in self.layout.modules]
        return self._full_weight().start_master(read_weights(self.model, names, self.revision), transposed)

    def master_weights(self) -> Tensors:
        """The master copies (and optimizer moments), for a snapshot or the export."""
        assert self.master is not None, "no base weights were synced on this worker"
        return self.master.snapshot()

    def shutdown(self) -> None:
        self.rewards.close()
        self.scratch.cleanup()
        self.engine.shutdown()
