"""The driver: runs the ask/evaluate/tell loop and is the only writer of run state.

It runs as a Ray actor pinned to the node evora was started on (the run folder lives
there). Per generation it sends O(population) numbers (specs) and one payload through
the object store, and receives O(population x prompts) numbers. `run` is a generator:
the CLI streams one summary per generation from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import ray

from evora.analysis.comparison import build_report, write_reports
from evora.config.schema import RunConfig
from evora.config.validate import check_split_sizes
from evora.distributed.evaluate import candidate_metrics, chunks, evaluate_split
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
from evora.strategies.base import BASE, CENTER, Strategy
from evora.tasks import build_task
from evora.tasks.fitness import parse_fitness
from evora.tracking import checkpoint
from evora.tracking.metrics import JsonlSink, MetricsSink, RewardPlotSink, WandbSink
from evora.tracking.run_dir import LINEAGE_FILE, config_dict, write_config


@dataclass
class Best:
    score: float  # the fitness it was chosen by: on the selection split if there is one, else held-out
    generation: int
    adapter: dict
    heldout: dict  # its held-out metrics


def run_tag(run_dir: str | Path) -> str:
    """A short tag naming the run's tmpfs scratch folders."""
    return hashlib.blake2b(str(Path(run_dir).resolve()).encode(), digest_size=4).hexdigest()


def spread(prefix: str, values: np.ndarray) -> dict[str, float]:
    return {f"{prefix}_mean": float(values.mean()), f"{prefix}_std": float(values.std()),
            f"{prefix}_min": float(values.min()), f"{prefix}_max": float(values.max()),
            f"{prefix}_p20": float(np.percentile(values, 20)), f"{prefix}_p80": float(np.percentile(values, 80))}


def finite_fitness(fitness: np.ndarray) -> tuple[np.ndarray, int]:
    """NaN or infinite fitness (a broken reward) becomes the generation's worst finite value,
    so it can neither win a selection nor poison shaping; returns how many there were."""
    bad = ~np.isfinite(fitness)
    if bad.any():
        finite = fitness[~bad]
        fitness = np.where(bad, finite.min() if finite.size else 0.0, fitness)
    return fitness, int(bad.sum())


def timing_sums(results: list[UnitResult]) -> dict[str, float]:
    keys = ("materialise", "generate", "reward", "perplexity")
    return {f"seconds_{k}": float(sum(r.timings[k] for r in results)) for k in keys}


class Driver:
    def __init__(self, run: RunConfig, run_dir: str):
        self.run_cfg = run
        self.run_dir = Path(run_dir)
        self.run_tag = run_tag(run_dir)
        self.fitness = parse_fitness(run.task.fitness)

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
        check_split_sizes(run.task, self.splits)  # hub data is only seen here
        self._restore_or_init()
        self.sinks = self._open_sinks()
        completed = self.next_generation if self.resumed else -1
        self.lineage = JsonlSink(self.run_dir, completed, LINEAGE_FILE) if hasattr(self.strategy, "lineage") else None
        # Named per driver process: a restarted driver's workers must not clash with the old ones' names.
        self.pool = WorkerPool.start(WorkerSpec(run, self.location.path, self.layout, scales, self.run_tag),
                                     name_prefix=f"evora-worker-{self.run_tag}-{os.getpid()}")

    def _restore_or_init(self) -> None:
        path = checkpoint.latest_path(self.run_dir)
        self.resumed = path.exists()
        if self.resumed:
            saved = checkpoint.load(path)
            self.state = saved["strategy_state"]
            self.next_generation = saved["next_generation"]
            self.base, self.last = saved["base"], saved["last"]
            self.best = Best(**saved["best"]) if saved["best"] else None
            return
        self.state = self.strategy.initial_state(self._initial_adapter(self.layout))
        self.next_generation, self.base, self.last, self.best = 0, None, None, None
        write_config(self.run_dir, self.run_cfg)

    def _initial_adapter(self, layout: AdapterLayout) -> dict:
        es = self.run_cfg.strategy
        if es.init == "path":
            return adapter_from_path(layout, es.init_path)
        return random_adapter(layout, self.run_cfg.seed, es.init_a_std, es.init_b_std)

    def _open_sinks(self) -> list[MetricsSink]:
        run = self.run_cfg
        sinks: list[MetricsSink] = [JsonlSink(self.run_dir, self.next_generation if self.resumed else -1),
                                    RewardPlotSink(self.run_dir)]
        if run.tracking.name == "wandb":
            tracking = run.tracking
            sinks.append(WandbSink(self.run_dir, project=tracking.wandb_project, entity=tracking.wandb_entity,
                                   group=tracking.wandb_group or run.name,
                                   name=tracking.wandb_name or self.run_dir.name,
                                   mode=tracking.wandb_mode, config=config_dict(run)))
        return sinks

    # --- the loop -------------------------------------------------------------------

    def run(self) -> Iterator[dict[str, Any]]:
        start = time.perf_counter()
        self._setup()
        try:
            if self.base is None:
                self._initial_evaluation()
            yield {"kind": "start", "generations": self.run_cfg.generations, "start": self.next_generation,
                   "workers": len(self.pool), "base_heldout": self.base["reward"], "resumed": self.resumed,
                   "adapter_parameters": self.layout.num_parameters(), "setup_seconds": time.perf_counter() - start}
            for generation in range(self.next_generation, self.run_cfg.generations):
                yield self._generation(generation)
            yield self._finish()
        finally:
            self._close()

    def _initial_evaluation(self) -> None:
        outcomes = self._evaluate("heldout", [BASE, CENTER], generation=0)
        self.base = outcomes[BASE]
        record = {"generation": 0, **{f"base_heldout_{k}": v for k, v in self.base.items()},
                  **self._center_scores(0, outcomes[CENTER]), "time": time.time()}
        self._log(record)

    def _generation(self, generation: int) -> dict[str, Any]:
        started = time.perf_counter()
        specs, payload = self.strategy.ask(self.state, generation)
        prompts = self._prompt_batch(generation)
        units = [WorkUnit(tuple(c), "train", prompts, perplexity=self.fitness.needs_perplexity)
                 for c in chunks(specs, self.run_cfg.engine.max_loras)]
        results = self.pool.run(ray.put(payload), units)
        evaluated = time.perf_counter()
        metrics = candidate_metrics(results, len(specs))
        fitness, invalid = finite_fitness(
            np.array([self.fitness({k: v[i] for k, v in metrics.items()}) for i in range(len(specs))]))
        previous = self.state
        self.state, update_stats = self.strategy.tell(self.state, specs, fitness)
        if self.lineage is not None:
            for member in self.strategy.lineage(previous, specs, fitness, self.state):
                self.lineage.log(member)
        updated = time.perf_counter()
        done = generation + 1
        record: dict[str, Any] = {"generation": done, **spread("reward", metrics["reward"]),
                                  "accuracy_mean": float(metrics["accuracy"].mean()), "fitness_invalid": invalid,
                                  **update_stats}
        if self.fitness.text != "reward":
            record.update(spread("fitness", fitness))
        if self._eval_due(done):
            record.update(self._center_scores(done, self._evaluate("heldout", [CENTER], done)[CENTER]))
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
        adapters = self.run_dir / "adapters"
        center = self.strategy.center(self.state)
        save_adapter(adapters / self.strategy.center_name, center, self.layout)
        best = self.best or Best(float("nan"), done, center, self.last)
        save_adapter(adapters / "best", best.adapter, self.layout)
        counts = self._compare_best(best)
        summary = {"base_heldout": self.base["reward"], "final_heldout": self.last["reward"],
                   "best_heldout": best.heldout["reward"], "best_generation": best.generation, "generations": done,
                   "base_heldout_metrics": self.base, "final_heldout_metrics": self.last,
                   "best_heldout_metrics": best.heldout,
                   "best_chosen_on": "selection" if self.splits.selection else "heldout", "best_vs_base": counts,
                   "center": self.strategy.center_name}
        (self.run_dir / "eval" / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return {"kind": "final", **summary, "run_dir": str(self.run_dir)}

    def _compare_best(self, best: Best) -> dict[str, int]:
        """The base-vs-adapter report of adapters/best on the held-out split; its counts."""
        outcomes = self._evaluate("heldout", [BASE, CENTER], best.generation, theta=best.adapter, keep_texts=True,
                                  perplexity=True)
        report = build_report(self.splits.heldout, outcomes[CENTER], outcomes[BASE], task=self.run_cfg.task.name,
                              split="heldout", adapter_name="adapters/best")
        write_reports(report, self.run_dir / "eval", stem="best_vs_base")
        return report["counts"]

    def _close(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.shutdown()
        sweep_run_scratch(self.run_cfg.engine.adapter_dir, self.run_tag)
        for sink in [*getattr(self, "sinks", []), *filter(None, [getattr(self, "lineage", None)])]:
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

    def _evaluate(self, split: str, ops: list[str], generation: int, theta: dict | None = None,
                  keep_texts: bool = False, perplexity: bool = False) -> dict[str, Any]:
        """Metrics (or, with keep_texts, whole outcomes) of BASE/CENTER on a split."""
        outcomes = evaluate_split(self.pool, theta if theta is not None else self.strategy.center(self.state), ops,
                                  split, len(self.splits.get(split)), generation=generation, keep_texts=keep_texts,
                                  perplexity=perplexity or self.fitness.needs_perplexity)
        if keep_texts:
            return outcomes
        return {op: self._with_fitness(o.metrics()) for op, o in outcomes.items()}

    def _with_fitness(self, metrics: dict[str, float]) -> dict[str, float]:
        return {**metrics, "fitness": self.fitness(metrics)}

    def _center_scores(self, done: int, heldout: dict[str, float]) -> dict[str, float]:
        """Record the center's held-out metrics, and keep it as the best if it is."""
        self.last = heldout
        scores = {f"heldout_{k}": v for k, v in heldout.items()}
        score = heldout["fitness"]
        if self.splits.selection:
            score = self._evaluate("selection", [CENTER], done)[CENTER]["fitness"]
            scores["selection_fitness"] = score
        if self.best is None or score > self.best.score:
            center = self.strategy.center(self.state)
            self.best = Best(score, done, {k: v.clone() for k, v in center.items()}, heldout)
        return scores

    @staticmethod
    def _worker_rss(results: list[UnitResult]) -> dict[str, float]:
        return {str(r.worker): r.rss_mb for r in results}

    def _log(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(record)

    def _checkpoint(self, done: int) -> None:
        saved = {"version": 2, "next_generation": done, "strategy_state": self.state, "base": self.base,
                 "last": self.last, "best": None if self.best is None else asdict(self.best)}
        checkpoint.atomic_save(saved, checkpoint.latest_path(self.run_dir))
        keep = self.run_cfg.tracking.checkpoint_keep_every
        if keep and done % keep == 0:
            checkpoint.atomic_save(saved, self.run_dir / "checkpoints" / f"gen_{done}.pt")
