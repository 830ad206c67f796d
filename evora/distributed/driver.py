"""The driver: runs the ask/evaluate/tell loop and is the only writer of run state.

It runs as a Ray actor pinned to the node evora was started on (the run folder lives
there). Per generation it sends O(population) numbers (specs) and one payload through
the object store, and receives O(population x prompts) numbers. `run` is a generator:
the CLI streams one summary per generation from it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import ray

from evora.config.schema import RunConfig
from evora.distributed.pool import WorkerPool
from evora.distributed.worker import UnitResult, WorkerSpec, WorkUnit
from evora.engines.adapter_store import sweep_run_scratch
from evora.lora.base_weights import per_layer_scales
from evora.lora.init import adapter_from_path, random_adapter
from evora.lora.layout import AdapterLayout, build_layout, linear_shapes_of_model
from evora.lora.noise import noise_key
from evora.lora.peft_io import save_adapter
from evora.models import locate_model
from evora.strategies import build_strategy
from evora.strategies.base import BASE, CENTER, CandidateSpec, Strategy
from evora.tasks import build_task
from evora.tracking import checkpoint
from evora.tracking.metrics import JsonlSink, MetricsSink, WandbSink
from evora.tracking.run_dir import config_dict, write_config

EVAL_CHUNK = 64  # held-out prompts per work unit


@dataclass
class Best:
    heldout: float
    generation: int
    adapter: dict


def chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def reward_stats(fitness: np.ndarray) -> dict[str, float]:
    return {"reward_mean": float(fitness.mean()), "reward_std": float(fitness.std()),
            "reward_min": float(fitness.min()), "reward_max": float(fitness.max()),
            "reward_p20": float(np.percentile(fitness, 20)), "reward_p80": float(np.percentile(fitness, 80))}


def timing_sums(results: list[UnitResult]) -> dict[str, float]:
    keys = ("materialise", "generate", "reward", "release")
    return {f"seconds_{k}": float(sum(r.timings[k] for r in results)) for k in keys}


def run_tag(run_dir: str | Path) -> str:
    """A short tag naming the run's tmpfs scratch folders."""
    return hashlib.blake2b(str(Path(run_dir).resolve()).encode(), digest_size=4).hexdigest()


class Driver:
    def __init__(self, run: RunConfig, run_dir: str):
        self.run_cfg = run
        self.run_dir = Path(run_dir)
        self.run_tag = run_tag(run_dir)

    # --- setup ----------------------------------------------------------------------

    def _setup(self) -> None:
        run = self.run_cfg
        self.location = locate_model(run.model.path)
        self.layout = build_layout(
            linear_shapes_of_model(self.location.path, revision=run.model.revision,
                                   trust_remote_code=run.model.trust_remote_code),
            rank=run.lora.rank, alpha=run.lora.alpha, target_modules=run.lora.target_modules,
            layers=run.lora.layers, base_model=self.location.path)
        scales = (per_layer_scales(self.layout, self.location.path, run.model.revision)
                  if run.strategy.noise_scale == "per_layer" else {})
        self.strategy: Strategy = build_strategy(run.strategy, run.seed, scales)
        self.splits = build_task(run.task, run.seed).splits()
        self._restore_or_init()
        self.sinks = self._open_sinks()
        self.pool = WorkerPool.start(WorkerSpec(run, self.location.path, self.layout, scales, self.run_tag))

    def _restore_or_init(self) -> None:
        path = checkpoint.latest_path(self.run_dir)
        self.resumed = path.exists()
        if self.resumed:
            saved = checkpoint.load(path)
            self.state = saved["strategy_state"]
            self.next_generation = saved["next_generation"]
            self.base_heldout = saved["base_heldout"]
            self.last_heldout = saved["last_heldout"]
            self.best = Best(**saved["best"]) if saved["best"] else None
            return
        self.state = self.strategy.initial_state(self._initial_adapter(self.layout))
        self.next_generation, self.base_heldout, self.last_heldout, self.best = 0, None, None, None
        write_config(self.run_dir, self.run_cfg)

    def _initial_adapter(self, layout: AdapterLayout) -> dict:
        es = self.run_cfg.strategy
        if es.init == "path":
            return adapter_from_path(layout, es.init_path)
        return random_adapter(layout, self.run_cfg.seed, es.init_a_std, es.init_b_std)

    def _open_sinks(self) -> list[MetricsSink]:
        run = self.run_cfg
        sinks: list[MetricsSink] = [JsonlSink(self.run_dir, self.next_generation if self.resumed else -1)]
        if run.tracking.name == "wandb":
            tracking = run.tracking
            sinks.append(WandbSink(self.run_dir, project=tracking.wandb_project, entity=tracking.wandb_entity,
                                   group=tracking.wandb_group or run.name, name=self.run_dir.name,
                                   mode=tracking.wandb_mode, config=config_dict(run)))
        return sinks

    # --- the loop -------------------------------------------------------------------

    def run(self) -> Iterator[dict[str, Any]]:
        start = time.perf_counter()
        self._setup()
        try:
            if self.base_heldout is None:
                self._initial_evaluation()
            yield {"kind": "start", "generations": self.run_cfg.generations, "start": self.next_generation,
                   "workers": len(self.pool), "base_heldout": self.base_heldout, "resumed": self.resumed,
                   "adapter_parameters": self.layout.num_parameters(), "setup_seconds": time.perf_counter() - start}
            for generation in range(self.next_generation, self.run_cfg.generations):
                yield self._generation(generation)
            yield self._finish()
        finally:
            self._close()

    def _initial_evaluation(self) -> None:
        scores = self._heldout(0, [BASE, CENTER])
        self.base_heldout, self.last_heldout = scores[BASE], scores[CENTER]
        self._log({"generation": 0, "heldout_reward": self.last_heldout, "base_heldout_reward": self.base_heldout,
                   "time": time.time()})

    def _generation(self, generation: int) -> dict[str, Any]:
        started = time.perf_counter()
        specs, payload = self.strategy.ask(self.state, generation)
        prompts = self._prompt_batch(generation)
        units = [WorkUnit(tuple(c), "train", prompts) for c in chunks(specs, self.run_cfg.engine.max_loras)]
        results = self.pool.run(ray.put(payload), units)
        evaluated = time.perf_counter()
        rewards = self._reward_matrix(results, len(specs))
        fitness = rewards.mean(axis=1)
        self.state, update_stats = self.strategy.tell(self.state, specs, fitness)
        updated = time.perf_counter()
        done = generation + 1
        record: dict[str, Any] = {"generation": done, **reward_stats(fitness), **update_stats}
        if self._eval_due(done):
            record["heldout_reward"] = self._heldout(done, [CENTER])[CENTER]
        finished = time.perf_counter()
        tokens = int(sum(r.tokens.sum() for r in results))
        record.update(tokens=tokens, tokens_per_second=tokens / max(evaluated - started, 1e-9),
                      reward_errors=sum(r.reward_errors for r in results), seconds=finished - started,
                      seconds_evaluate=evaluated - started, seconds_update=updated - evaluated,
                      seconds_heldout=finished - updated, **timing_sums(results),
                      worker_rss_mb=self._worker_rss(results), time=time.time())
        self._log(record)
        self._checkpoint(done)
        return {"kind": "generation", **record, "generations": self.run_cfg.generations}

    def _finish(self) -> dict[str, Any]:
        done = self.run_cfg.generations
        final = self.last_heldout
        adapters = self.run_dir / "adapters"
        center = self.strategy.center(self.state)
        save_adapter(adapters / "mean", center, self.layout)
        best = self.best or Best(final, done, center)
        save_adapter(adapters / "best", best.adapter, self.layout)
        summary = {"base_heldout": self.base_heldout, "final_heldout": final, "best_heldout": best.heldout,
                   "best_generation": best.generation, "generations": done}
        (self.run_dir / "eval").mkdir(exist_ok=True)
        (self.run_dir / "eval" / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return {"kind": "final", **summary, "run_dir": str(self.run_dir)}

    def _close(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.shutdown()
        sweep_run_scratch(self.run_cfg.engine.adapter_dir, self.run_tag)
        for sink in getattr(self, "sinks", []):
            sink.close()

    # --- pieces ---------------------------------------------------------------------

    def _eval_due(self, done: int) -> bool:
        every = self.run_cfg.eval_every
        return done == self.run_cfg.generations or (every > 0 and done % every == 0)

    def _prompt_batch(self, generation: int) -> tuple[int, ...]:
        """The generation's training prompts: a pure function of (seed, generation)."""
        rng = np.random.default_rng(noise_key(self.run_cfg.seed, "prompts", generation))
        picked = rng.choice(len(self.splits.train), size=self.run_cfg.task.prompts_per_generation, replace=False)
        return tuple(int(i) for i in picked)

    def _heldout(self, generation: int, ops: list[str]) -> dict[str, float]:
        """Mean held-out reward of the base model and/or the strategy's center."""
        center = self.strategy.center(self.state)
        specs = tuple(CandidateSpec(generation, i, op=op) for i, op in enumerate(ops))
        indices = list(range(len(self.splits.heldout)))
        units = [WorkUnit(specs, "heldout", tuple(c)) for c in chunks(indices, EVAL_CHUNK)]
        rewards = np.concatenate([r.rewards for r in self.pool.run(ray.put({"theta": center}), units)], axis=1)
        scores = {op: float(rewards[i].mean()) for i, op in enumerate(ops)}
        if CENTER in scores:
            self.last_heldout = scores[CENTER]
            if self.best is None or scores[CENTER] > self.best.heldout:
                self.best = Best(scores[CENTER], generation, {k: v.clone() for k, v in center.items()})
        return scores

    @staticmethod
    def _reward_matrix(results: list[UnitResult], population: int) -> np.ndarray:
        rows: list[np.ndarray | None] = [None] * population
        for result in results:
            for row, index in enumerate(result.indices):
                rows[index] = result.rewards[row]
        return np.stack(rows)

    @staticmethod
    def _worker_rss(results: list[UnitResult]) -> dict[str, float]:
        latest: dict[str, float] = {}
        for result in results:
            latest[str(result.worker)] = result.rss_mb
        return latest

    def _log(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(record)

    def _checkpoint(self, done: int) -> None:
        saved = {"version": 1, "next_generation": done, "strategy_state": self.state,
                 "base_heldout": self.base_heldout, "last_heldout": self.last_heldout,
                 "best": None if self.best is None else vars(self.best)}
        checkpoint.atomic_save(saved, checkpoint.latest_path(self.run_dir))
        keep = self.run_cfg.tracking.checkpoint_keep_every
        if keep and done % keep == 0:
            checkpoint.atomic_save(saved, self.run_dir / "checkpoints" / f"gen_{done}.pt")
