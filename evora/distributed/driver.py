"""The run loop every ask/tell strategy shares: setup -> generations -> finish.

The driver runs as a Ray actor pinned to the node evora was started on (the run folder
lives there) and is the only writer of run state. Per generation it sends O(population)
numbers (specs) and one payload through the object store, and receives the candidate x
prompt matrices. It knows strategies only through the registry and the protocol
(`evora.strategies.protocol`). `run` is a generator: the CLI streams its events.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import ray
import torch

from evora.analysis.live import RewardPlotSink
from evora.analysis.plots import write_plots
from evora.config.schema import RunConfig
from evora.config.validate import check_split_sizes
from evora.distributed.evaluate import (
    candidate_matrices,
    candidate_texts,
    evaluate_split,
    row_means,
    search_units,
    spend_of,
)
from evora.distributed.finish import Outcome, final_event, report_against_base, write_run_summary
from evora.distributed.full_weights import EngineWeights, original_weights
from evora.distributed.pool import WorkerPool
from evora.distributed.portfolio import ROUTING_FILE, evaluate_portfolio, write_routing
from evora.distributed.training import training_context
from evora.distributed.worker import UnitResult, WorkUnit, engine_rank, worker_spec
from evora.engines.adapter_store import sweep_run_scratch
from evora.errors import RunError
from evora.lora.layout import build_layout
from evora.lora.modules import adaptable_modules
from evora.lora.noise import noise_key
from evora.lora.peft_io import save_adapter
from evora.models import hub_access, locate_model
from evora.models.parameters import count_parameters
from evora.strategies import get_strategy
from evora.strategies.budget import budget_of, matched_run
from evora.strategies.protocol import (
    BASE,
    CENTER,
    FULL_WEIGHT,
    GRADIENT,
    PORTFOLIO,
    GenerationResults,
    StrategyContext,
    Told,
    prompts_of,
    state_fields,
)
from evora.tasks import build_task
from evora.tasks.fitness import parse_fitness
from evora.tracking import checkpoint
from evora.tracking.compute import ComputeLedger, Spend, usage_of_summary
from evora.tracking.metrics import JsonlSink, MetricsSink, WandbSink
from evora.tracking.run_dir import LINEAGE_FILE, config_dict, run_tag, write_config
from evora.tracking.summary import read_summary


@dataclass
class Best:
    score: float  # the fitness it was chosen by: on the selection split if there is one, else held-out
    generation: int
    adapter: dict
    heldout: dict  # its held-out metrics


def spread(prefix: str, values: np.ndarray) -> dict[str, float]:
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_std": float(values.std()),
        f"{prefix}_min": float(values.min()),
        f"{prefix}_max": float(values.max()),
        f"{prefix}_p20": float(np.percentile(values, 20)),
        f"{prefix}_p80": float(np.percentile(values, 80)),
    }


def finite_fitness(fitness: np.ndarray) -> tuple[np.ndarray, int]:
    """NaN or infinite fitness (a broken reward) becomes the generation's worst finite value,
    so it can neither win a selection nor poison shaping; returns how many there were."""
    bad = ~np.isfinite(fitness)
    if bad.any():
        finite = fitness[~bad]
        fitness = np.where(bad, finite.min() if finite.size else 0.0, fitness)
    return fitness, int(bad.sum())


def knobs(strategy_cfg: Any) -> str:
    """The strategy's float settings: what to look at when its numbers blow up."""
    values = [f"strategy.{key}={value:g}" for key, value in asdict(strategy_cfg).items() if isinstance(value, float)]
    return ", ".join(values) or "the strategy's settings"


# Both checks stop a generation before it is checkpointed: the last checkpoint stays the good one.


def check_some_fitness(generation: int, invalid: int, population: int, strategy_cfg: Any) -> None:
    if invalid == population:
        raise RunError(
            f"generation {generation}: no candidate has a finite fitness; look at {knobs(strategy_cfg)} "
            "and task.fitness"
        )


def check_finite_center(generation: int, center: dict[str, Any], strategy_cfg: Any) -> None:
    broken = [name for name, tensor in center.items() if not bool(torch.isfinite(tensor).all())]
    if broken:
        raise RunError(
            f"generation {generation}: the update made {len(broken)} adapter tensor(s) non-finite "
            f"(e.g. {broken[0]}); look at {knobs(strategy_cfg)}"
        )


def timing_sums(results: list[UnitResult]) -> dict[str, float]:
    keys = ("materialise", "generate", "reward", "perplexity")
    return {f"seconds_{k}": float(sum(r.timings[k] for r in results)) for k in keys}


def routed_prompts(specs: list[Any]) -> tuple[int, ...]:
    """The generation's prompts when the strategy routes its candidates to prompts (the
    ecology's episodes): every prompt some spec names, in order; () when none does."""
    routed = [prompts_of(spec) for spec in specs]
    if all(r is None for r in routed):
        return ()
    return tuple(sorted({i for r in routed if r is not None for i in r}))


def matched_usage(strategy_cfg: Any) -> dict[str, float] | None:
    """The search usage of the run a strategy matches (strategy.match), from its summary."""
    folder = matched_run(strategy_cfg)
    if folder is None:
        return None
    summary = read_summary(folder)
    if summary is None:
        raise RunError(f"strategy.match={folder}: the run has no eval/summary.json (did it finish?)")
    return usage_of_summary(summary["compute"])


class Driver:
    def __init__(self, run: RunConfig, run_dir: str):
        self.run_cfg = run
        self.run_dir = Path(run_dir)
        self.run_tag = run_tag(run_dir)
        self.fitness = parse_fitness(run.task.fitness)
        self.entry = get_strategy(run.strategy.name)

    # --- setup ----------------------------------------------------------------------

    def _setup(self) -> None:
        run = self.run_cfg
        self.location = locate_model(run.model.path)
        with hub_access(run.model.path):  # a hub model's config is first fetched here
            shapes = adaptable_modules(
                self.location.path, revision=run.model.revision, trust_remote_code=run.model.trust_remote_code
            )
        self.strategy = self.entry.build(run.strategy, run.seed)
        # A full-weight strategy's candidates are LoRAs of its own perturbation rank, at scale 1.
        rank = self.strategy.perturbation_rank if self.entry.kind == FULL_WEIGHT else None
        self.layout = build_layout(
            shapes,
            rank=rank or run.lora.rank,
            alpha=rank or run.lora.alpha,
            target_modules=run.lora.target_modules,
            layers=run.lora.layers,
            base_model=self.location.path,
        )
        self.splits = build_task(run.task, run.seed).splits()
        check_split_sizes(run.task, self.splits)  # hub data is only seen here
        self._restore_or_init()
        self.budget = budget_of(run.strategy, matched_usage(run.strategy))
        self.stopping = self.budget is not None and self.budget.spent(self.ledger.search_usage())
        self.training, self.scorer = None, None
        if self.entry.trains_on_driver(self.strategy):
            self.training, self.scorer = training_context(
                run, self.location.path, self.layout, self.splits, self.budget, self._spent_now
            )
        self.sinks = self._open_sinks()
        completed = self.next_generation if self.resumed else -1
        self.lineage = JsonlSink(self.run_dir, completed, LINEAGE_FILE, lazy=True)
        self.completed_at_start, self.record_files = completed, {}
        # Named per driver process: a restarted driver's workers must not clash with the old ones' names.
        self.pool = WorkerPool.start(
            worker_spec(run, self.location.path, self.layout, self.run_tag, max_lora_rank=engine_rank(self.layout)),
            run.hardware,
            name_prefix=f"evora-worker-{self.run_tag}-{os.getpid()}",
        )
        self.weights = None
        if self.entry.kind == FULL_WEIGHT:
            self.weights = EngineWeights(self.strategy, self.pool, self.run_dir, self.snapshots, knobs(run.strategy))
            self.weights.to(self.state, self.next_generation)

    def _restore_or_init(self) -> None:
        path = checkpoint.latest_path(self.run_dir)
        self.resumed = path.exists()
        if self.resumed:
            saved = checkpoint.load_run_state(path, self.run_cfg.strategy.name, self.strategy.state_type)
            self.state = self.strategy.state_type(**saved["state"])
            loop = saved["loop"]
            self.next_generation, self.base, self.last = loop["next_generation"], loop["base"], loop["last"]
            self.best = Best(**loop["best"]) if loop["best"] else None
            self.ledger = ComputeLedger.from_state(loop["compute"])
            self.snapshots = list(loop.get("weight_snapshots", []))
            return
        run = self.run_cfg
        context = StrategyContext(
            run.seed,
            self.layout,
            self.location.path,
            run.model.revision,
            train_families=tuple(e.family for e in self.splits.train),
            prompts_per_generation=run.task.prompts_per_generation,
        )
        self.state = self.strategy.initial_state(context)
        self.next_generation, self.base, self.last, self.best = 0, None, None, None
        self.snapshots = []
        self.ledger = ComputeLedger(
            count_parameters(self.location.path, run.model.revision, run.model.trust_remote_code)
        )
        write_config(self.run_dir, run)

    def _open_sinks(self) -> list[MetricsSink]:
        run = self.run_cfg
        sinks: list[MetricsSink] = [
            JsonlSink(self.run_dir, self.next_generation if self.resumed else -1),
            RewardPlotSink(self.run_dir),
        ]
        if run.tracking.name == "wandb":
            tracking = run.tracking
            sinks.append(
                WandbSink(
                    self.run_dir,
                    project=tracking.wandb_project,
                    entity=tracking.wandb_entity,
                    group=tracking.wandb_group or run.name,
                    name=tracking.wandb_name or self.run_dir.name,
                    mode=tracking.wandb_mode,
                    config=config_dict(run),
                    figures=lambda: write_plots(self.run_dir),
                )
            )
        return sinks

    # --- the loop -------------------------------------------------------------------

    def run(self) -> Iterator[dict[str, Any]]:
        start = time.perf_counter()
        self._setup()
        self.ledger.add_seconds("setup", time.perf_counter() - start)  # every session's start-up, resumes too
        try:
            if self.base is None:
                self._initial_evaluation()
            yield {
                "kind": "start",
                "strategy": self.entry.name,
                "generations": None if self.budget else self.run_cfg.generations,
                "start": self.next_generation,
                "workers": len(self.pool),
                "base_heldout": self.base["reward"],
                "resumed": self.resumed,
                "adapter_parameters": None if self.weights else self.layout.num_parameters(),
                **(self._weights_note() if self.weights else {}),
                "setup_seconds": time.perf_counter() - start,
            }
            self.done = self.next_generation
            while not self._ended():
                yield self._generation(self.done)
                self.done += 1
            yield self._finish()
        finally:
            self._close()

    def _weights_note(self) -> dict[str, int]:
        """What a full-weight strategy moves, and the host memory it keeps on every worker."""
        weights = sum(slot.out_features * slot.in_features for slot in self.layout.modules)
        return {"full_weights": weights, "master_bytes": self.strategy.master_bytes(self.layout)}

    def _initial_evaluation(self) -> None:
        started, spend = time.perf_counter(), Spend()
        outcomes = self._evaluate("heldout", [BASE, CENTER], generation=0, spend=spend)
        self.base = outcomes[BASE]
        record = {
            "generation": 0,
            **{f"base_heldout_{k}": v for k, v in self.base.items()},
            **self._center_scores(0, outcomes[CENTER], spend),
        }
        self._account(record, Spend(), spend, 0.0, time.perf_counter() - started)
        self._log(record)

    def _generation(self, generation: int) -> dict[str, Any]:
        started = time.perf_counter()
        self._generation_started = started
        search = self._train if self.entry.kind == GRADIENT else self._evolve
        record, spend = search(generation)
        searched = time.perf_counter()
        done = generation + 1
        if self.budget is not None:
            self.stopping = self.budget.spent(self.ledger.search_usage(spend, searched - started))
        eval_spend = Spend()
        if self._eval_due(done):
            heldout = self._evaluate("heldout", [CENTER], done, spend=eval_spend)[CENTER]
            record.update(self._center_scores(done, heldout, eval_spend))
        finished = time.perf_counter()
        changes = self.pool.take_events()
        record.update(
            seconds=finished - started,
            seconds_heldout=finished - searched,
            workers=len(self.pool),
            workers_lost=record.get("workers_lost", 0) + sum(c["event"] == "worker-lost" for c in changes),
            workers_replaced=record.get("workers_replaced", 0) + sum(c["event"] == "worker-replaced" for c in changes),
        )
        self._account(record, spend, eval_spend, searched - started, finished - searched)
        self._log(record)
        self._checkpoint(done)
        events = record.pop("pool_events", []) + changes
        generations = None if self.budget else self.run_cfg.generations
        return {"kind": "generation", **record, "generations": generations, "pool_events": events}

    def _evolve(self, generation: int) -> tuple[dict[str, Any], Spend]:
        """A population generation: ask, evaluate every candidate on the workers, tell."""
        started = time.perf_counter()
        specs, payload = self.strategy.ask(self.state, generation)
        prompts = routed_prompts(specs) or self._prompt_batch(generation)
        texts = self.entry.keeps_texts(self.strategy)  # the ecology's self-training reads them
        engine = self.run_cfg.engine
        units = [
            WorkUnit(tuple(c), "train", prompts, keep_texts=texts, perplexity=self.fitness.needs_perplexity)
            for c in search_units(specs, engine.units, engine.max_loras, len(self.pool))
        ]
        results = self.pool.run(ray.put(payload), units)
        changes = self.pool.take_events()
        evaluated = time.perf_counter()
        generation_results, invalid = self._results(generation, prompts, results, len(specs))
        check_some_fitness(generation + 1, invalid, len(specs), self.run_cfg.strategy)
        told = self.strategy.tell(self.state, specs, generation_results)
        refined = self.strategy.refine(told.state, generation, self.training) if self.training else None
        if refined is not None:  # memetic: the elite got gradient steps
            stats, lineage = {**told.stats, **refined.stats}, told.lineage + refined.lineage
            told = Told(refined.state, stats, lineage, refined.spend, told.records)
        check_finite_center(generation + 1, self.strategy.center(told.state), self.run_cfg.strategy)
        if self.weights is not None:  # every worker applies the update to its own weights
            told.stats.update(self.weights.to(told.state, generation + 1))
        self.state = told.state
        for member in told.lineage:
            self.lineage.log(member)
        self._write_records(told.records)
        cells = generation_results.evaluated
        record: dict[str, Any] = {
            "generation": generation + 1,
            **spread("reward", row_means(generation_results.rewards, cells)),
            "accuracy_mean": float(generation_results.correct[cells].mean())
            if cells is not None
            else float(generation_results.correct.mean()),
            "fitness_invalid": invalid,
            **told.stats,
        }
        if self.fitness.text != "reward":
            record.update(spread("fitness", generation_results.fitness))
        record.update(
            tokens=int(generation_results.tokens.sum()),
            tokens_per_second=generation_results.tokens.sum() / max(evaluated - started, 1e-9),
            reward_errors=sum(r.reward_errors for r in results),
            reward_timeouts=sum(r.reward_timeouts for r in results),
            seconds_evaluate=evaluated - started,
            seconds_update=time.perf_counter() - evaluated,
            units=len(results),  # generate calls the candidates took (engine.units)
            **timing_sums(results),
            worker_rss_mb={str(r.worker): r.rss_mb for r in results},
            workers_lost=sum(c["event"] == "worker-lost" for c in changes),
            workers_replaced=sum(c["event"] == "worker-replaced" for c in changes),
            pool_events=changes,
        )
        spend = spend_of(results)
        spend.add(Spend(**told.spend))
        return record, spend

    def _train(self, generation: int) -> tuple[dict[str, Any], Spend]:
        """A gradient generation: the strategy trains on the driver; the loop evaluates as for any strategy."""
        started = time.perf_counter()
        told = self.strategy.improve(self.state, generation, self.training)
        check_finite_center(generation + 1, self.strategy.center(told.state), self.run_cfg.strategy)
        self.state = told.state
        spend = Spend(**told.spend)
        return {"generation": generation + 1, **told.stats, "seconds_train": time.perf_counter() - started}, spend

    def _write_records(self, records: dict[str, list[dict[str, Any]]]) -> None:
        """A strategy's own JSONL files (the ecology's episodes and organelles), truncated on resume like metrics."""
        for name, lines in records.items():
            if name not in self.record_files:
                self.record_files[name] = JsonlSink(self.run_dir, self.completed_at_start, name, lazy=True)
            for line in lines:
                self.record_files[name].log(line)

    def _spent_now(self, spend: dict[str, int]) -> bool:
        """Budget check inside a generation: the ledger, plus this generation's spend and time so far."""
        if self.budget is None:
            return False
        elapsed = time.perf_counter() - self._generation_started
        return self.budget.spent(self.ledger.search_usage(Spend(**spend), elapsed))

    def _ended(self) -> bool:
        if self.budget is not None:
            return self.stopping
        return self.done >= self.run_cfg.generations

    def _results(
        self, generation: int, prompts: tuple[int, ...], results: list[UnitResult], population: int
    ) -> tuple[GenerationResults, int]:
        m = candidate_matrices(results, population)
        evaluated = m["evaluated"]
        means = {
            "reward": row_means(m["rewards"], evaluated),
            "accuracy": row_means(m["correct"], evaluated),
            "tokens": row_means(m["tokens"], evaluated),
        }
        if m["perplexity"] is not None:
            means["perplexity"] = row_means(m["perplexity"], evaluated)
        fitness, invalid = finite_fitness(
            np.array([self.fitness({k: v[i] for k, v in means.items()}) for i in range(population)], dtype=np.float64)
        )
        texts = candidate_texts(results, population) if self.entry.keeps_texts(self.strategy) else None
        return GenerationResults(
            generation, prompts, m["rewards"], m["correct"], m["tokens"], m["perplexity"], fitness, evaluated, texts
        ), invalid

    def _account(
        self, record: dict[str, Any], search: Spend, evaluation: Spend, search_s: float, evaluation_s: float
    ) -> None:
        """Compute of this record into the ledger, and into the record (per generation and cumulative)."""
        ledger = self.ledger
        ledger.search.add(search)
        ledger.evaluation.add(evaluation)
        ledger.add_seconds("search", search_s)
        ledger.add_seconds("evaluation", evaluation_s)
        flops = search.flops(ledger.parameters)
        record.update(
            tokens_prompt=search.tokens_prompt,
            tokens_generated=search.tokens_generated,
            tokens_scored=search.tokens_scored,
            tokens_trained=search.tokens_trained,
            flops=flops["flops"],
            eval_flops=evaluation.flops(ledger.parameters)["flops"],
            cumulative_flops=ledger.search_flops(),
            wall_clock_s=sum(ledger.seconds.values()),
            time=time.time(),
        )

    # --- finish ---------------------------------------------------------------------

    def _finish(self) -> dict[str, Any]:
        started = time.perf_counter()
        done, spend = self.done, Spend()
        export = self._export_adapters if self.weights is None else self._export_weights
        best, adapters, details, evaluate = export(done, spend)
        report = report_against_base(
            evaluate,
            best.adapter,
            None,
            self.splits.heldout,
            task=self.run_cfg.task.name,
            split="heldout",
            adapter_name="adapters/best",
            out_dir=self.run_dir / "eval",
            stem="best_vs_base",
        )
        if self.entry.kind == PORTFOLIO:
            metrics = self._with_fitness(report["adapter_metrics"])
            best = replace(best, heldout={k: metrics[k] for k in self.last if k in metrics})
        self.ledger.evaluation.add(spend)
        self.ledger.add_seconds("evaluation", time.perf_counter() - started)
        outcome = Outcome(
            self.base,
            self.last,
            best.heldout,
            best.generation,
            None,
            "selection" if self.splits.selection else "heldout",
        )
        summary = write_run_summary(
            self.run_dir,
            strategy=self.run_cfg.strategy.name,
            generations=done,
            center=self.entry.center,
            outcome=outcome,
            counts=report["counts"],
            adapters=adapters,
            compute=self.ledger.summary(sum(self.ledger.seconds.values())),
            details=details,
        )
        return final_event(summary, self.run_dir)

    def _export_adapters(self, done: int, spend: Spend) -> tuple[Best, dict[str, str], dict[str, Any], Any]:
        """adapters/<center> and adapters/best (and a portfolio's members and routing map); the
        evaluation that compares the best adapter with the base model."""
        center_name, center = self.entry.center or "final", self.strategy.center(self.state)
        save_adapter(self.run_dir / "adapters" / center_name, center, self.layout)
        details = self._portfolio(done, spend) if self.entry.kind == PORTFOLIO else {}
        best = self._single_best(details, done) if details else self.best or Best(float("nan"), done, center, self.last)
        save_adapter(self.run_dir / "adapters" / "best", best.adapter, self.layout)
        adapters = {"best": "adapters/best", center_name: f"adapters/{center_name}"}
        if details:
            adapters.update(organelles="adapters/organelles", routing=ROUTING_FILE)

        def evaluate(theta: Any, layout: Any, ops: list[str]) -> dict[str, Any]:
            return self._evaluate(
                "heldout", ops, best.generation, theta=theta, keep_texts=True, perplexity=True, spend=spend
            )

        return best, adapters, details, evaluate

    def _export_weights(self, done: int, spend: Spend) -> tuple[Best, dict[str, str], dict[str, Any], Any]:
        """A full-weight run: model/ (the final weights, whole) and adapters/delta (their update as
        a LoRA); best_model/ and adapters/best when the best generation is an earlier one; the
        evaluation that compares the best generation's weights with the model's own."""
        model, rank = (self.location.path, self.run_cfg.model.revision), self.strategy.delta_rank
        original = original_weights(model, self.layout)
        best = self.best or Best(float("nan"), done, {}, self.last)
        error = self.weights.export(self.run_dir, "model", "delta", original, model, self.layout, rank)
        details = {"delta_rank": rank, "delta_relative_error": error, "best_delta_relative_error": error}
        adapters = {"best": "adapters/best", "delta": "adapters/delta", "model": "model"}
        if best.generation != done:
            self.weights.to(self.state, best.generation)
            details["best_delta_relative_error"] = self.weights.export(
                self.run_dir, "best_model", "best", original, model, self.layout, rank
            )
            adapters["best_model"] = "best_model"
        else:
            shutil.copytree(self.run_dir / "adapters" / "delta", self.run_dir / "adapters" / "best", dirs_exist_ok=True)

        def heldout_on_engine_weights() -> Any:
            ops = [BASE]  # no adapter: the engines' weights are the model evaluated
            return self._evaluate("heldout", ops, best.generation, keep_texts=True, perplexity=True, spend=spend)[BASE]

        return best, adapters, details, self.weights.compare_at(self.state, best.generation, heldout_on_engine_weights)

    def _single_best(self, details: dict[str, Any], done: int) -> Best:
        """A portfolio's adapters/best: its single best member on selection (the routing map's
        default), not the best center of the search; its held-out metrics come from the report."""
        ids, members = self.strategy.members(self.state)
        return Best(float("nan"), done, members[ids.index(details["single_best"]["id"])], {})

    def _portfolio(self, done: int, spend: Spend) -> dict[str, Any]:
        """A routed portfolio (the ecology): its routing map, held-out metrics, exported members."""
        ids, members = self.strategy.members(self.state)
        result = evaluate_portfolio(
            self.pool,
            ids,
            members,
            self.splits,
            self.strategy.train_routing(self.state),
            confidence=self.strategy.routing_confidence,
            max_loras=self.run_cfg.engine.max_loras,
            generation=done,
            spend=spend,
        )
        scores = result.pop("selection_scores")
        write_routing(self.run_dir, result["routing"], ids, members, self.layout, scores)
        return {**self.strategy.details(self.state), **result}

    def _close(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.shutdown()
        if getattr(self, "scorer", None) is not None:
            self.scorer.close()
        sweep_run_scratch(self.run_cfg.engine.adapter_dir, self.run_tag)
        extra = [getattr(self, "lineage", None), *getattr(self, "record_files", {}).values()]
        for sink in [*getattr(self, "sinks", []), *filter(None, extra)]:
            sink.close()

    # --- pieces ---------------------------------------------------------------------

    def _eval_due(self, done: int) -> bool:
        every = self.run_cfg.eval_every
        last = self.stopping if self.budget is not None else done == self.run_cfg.generations
        return last or (every > 0 and done % every == 0)

    def _prompt_batch(self, generation: int) -> tuple[int, ...]:
        """The generation's training prompts: a pure function of (seed, generation)."""
        rng = np.random.default_rng(noise_key(self.run_cfg.seed, "prompts", generation))
        picked = rng.choice(len(self.splits.train), size=self.run_cfg.task.prompts_per_generation, replace=False)
        return tuple(int(i) for i in picked)

    def _evaluate(
        self,
        split: str,
        ops: list[str],
        generation: int,
        theta: dict | None = None,
        keep_texts: bool = False,
        perplexity: bool = False,
        spend: Spend | None = None,
    ) -> dict[str, Any]:
        """Metrics (or, with keep_texts, whole outcomes) of BASE/CENTER on a split."""
        outcomes = evaluate_split(
            self.pool,
            theta if theta is not None else self.strategy.center(self.state),
            ops,
            split,
            len(self.splits.get(split)),
            generation=generation,
            keep_texts=keep_texts,
            perplexity=perplexity or self.fitness.needs_perplexity,
            spend=spend,
            # Under moved base weights an engine has no base model to measure the KL against.
            kl=self.weights is None,
        )
        if keep_texts:
            return outcomes
        return {op: self._with_fitness(o.metrics()) for op, o in outcomes.items()}

    def _with_fitness(self, metrics: dict[str, float]) -> dict[str, float]:
        return {**metrics, "fitness": self.fitness(metrics)}

    def _center_scores(self, done: int, heldout: dict[str, float], spend: Spend) -> dict[str, float]:
        """Record the center's held-out metrics, and keep it as the best if it is."""
        self.last = heldout
        scores = {f"heldout_{k}": v for k, v in heldout.items()}
        score = heldout["fitness"]
        if self.splits.selection:
            score = self._evaluate("selection", [CENTER], done, spend=spend)[CENTER]["fitness"]
            scores["selection_fitness"] = score
        if self.best is None or score > self.best.score:
            center = self.strategy.center(self.state)
            self.best = Best(score, done, {k: v.clone() for k, v in center.items()}, heldout)
        return scores

    def _log(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(record)

    def _checkpoint(self, done: int) -> None:
        loop = {
            "next_generation": done,
            "base": self.base,
            "last": self.last,
            "best": None if self.best is None else asdict(self.best),
            "compute": self.ledger.state(),
        }
        if self.weights is not None:
            self.weights.snapshot_if_due(done)
            loop["weight_snapshots"] = self.weights.keep(None if self.best is None else self.best.generation)
        saved = checkpoint.run_state(self.run_cfg.strategy.name, self.state, state_fields(self.state), loop)
        checkpoint.atomic_save(saved, checkpoint.latest_path(self.run_dir))
        if self.weights is not None:
            self.weights.remove_unlisted()
        keep = self.run_cfg.tracking.checkpoint_keep_every
        if keep and done % keep == 0:
            checkpoint.atomic_save(saved, self.run_dir / "checkpoints" / f"gen_{done}.pt")
