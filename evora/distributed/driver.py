"""The run loop every ask/tell and gradient strategy shares: setup -> generations -> finish.

The driver runs as a Ray actor pinned to the node evora was started on (the run folder
lives there) and is the only writer of run state. It takes the run plan (`plan.run_plan`)
and assembles its phases once, from the strategy's registered kind (`strategies/kinds.py`): the
generation's search, the exporter, gradient training where the strategy trains on the driver,
the engines' base weights where it moves them. It knows
strategies only through the registry and the protocols; it never probes one. `run` is a
generator: the CLI streams its events.
"""

from __future__ import annotations

import gc
import os
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from evora.distributed.exporters import ExportParts
from evora.distributed.finish import Outcome, final_event, report_against_base, write_run_summary
from evora.distributed.full_weights import EngineWeights
from evora.distributed.loop_state import LoopState
from evora.distributed.plan_ref import PlanRef
from evora.distributed.pool import WorkerPool
from evora.distributed.recorder import Recorder, start_event
from evora.distributed.scoring import CenterScoring
from evora.distributed.search import Search, SearchParts, knobs
from evora.distributed.training import training_context
from evora.distributed.worker_spec import engine_rank, worker_spec
from evora.engines.adapter_store import sweep_run_scratch
from evora.plan.run_plan import RunPlan
from evora.strategies.protocol import StrategyContext, state_fields
from evora.tracking import checkpoint
from evora.tracking.compute import ComputeLedger, Spend
from evora.tracking.events import FinalEvent, StartEvent, WorkerLost, WorkerReplaced
from evora.tracking.run_dir import run_tag, write_config


class Driver:
    """The run loop; on Ray it runs inside `driver_actor.DriverActor`, restartable, its
    constructor given no object-store reference and its plan given to `run`."""

    def __init__(self, run_dir: str):
        self.run_dir = Path(run_dir)
        self.run_tag = run_tag(run_dir)
        # What `_setup` opens, closed last-opened first (workers before their scratch is swept),
        # however far set-up got.
        self.opened = ExitStack()

    def _take(self, plan: RunPlan) -> None:
        self.plan, self.run_cfg = plan, plan.run
        self.entry = plan.entry
        self.budget = plan.budget

    # --- setup ----------------------------------------------------------------------

    def _setup(self) -> None:
        if (threads := self.run_cfg.hardware.driver_threads) is not None:
            torch.set_num_threads(threads)  # before the strategy builds anything: fixed reductions
        self.strategy = self.entry.build(self.run_cfg.strategy, self.run_cfg.seed)
        self._restore_or_init()
        self.recorder = recorder = Recorder(self.run_cfg, self.run_dir, self.loop.ledger, self.completed_at_start)
        self.opened.callback(recorder.close)
        self.stopping = self.budget is not None and self.budget.spent(self.loop.ledger.search_usage())
        self.opened.callback(sweep_run_scratch, self.run_cfg.engine.adapter_dir, self.run_tag)
        self.pool = pool = self._start_pool()
        self.opened.callback(pool.shutdown)
        gpu = pool.infos[0].get("device", "cpu")  # the workers' GPU model (one class a run)
        self.devices = checkpoint.noise_classes(self.plan.noise_device, self.plan.master_device, gpu)
        training = None
        if self.entry.trains_on_driver(self.strategy):
            training, scorer = training_context(self.plan, self.budget, self._spent_now, pool)
            self.opened.callback(scorer.close)
        self.weights: EngineWeights | None = None
        holding = self.entry.kind.engine_weights()  # what the kind's tell moves: the engines' weights
        if holding is not None:
            snapshots = self.loop.weight_snapshots
            self.weights = holding(self.strategy, pool, self.run_dir, snapshots, knobs(self.run_cfg.strategy))
            self.weights.to(self.state, self.loop.next_generation)
        self.scoring = CenterScoring(pool, self.plan, completions=recorder.wants_completions)
        texts = self.entry.keeps_texts(self.strategy)  # the ecology's self-training reads them
        parts: SearchParts[Any] = SearchParts(
            self.plan,
            self.strategy,
            pool,
            recorder,
            training,
            self.weights,
            texts,
            summed=self.strategy if self.entry.summed else None,
            refining=self.strategy if self.entry.refines else None,
        )
        self.search: Search = self.entry.kind.search_class()(parts)

    def _start_pool(self) -> WorkerPool:
        layout = self.plan.layout
        spec = worker_spec(
            self.run_cfg,
            self.plan.model_path,
            layout,
            self.run_tag,
            max_lora_rank=engine_rank(layout),
            resolved=(self.plan.task, self.plan.splits),
            master_device=self.plan.master_device,
            noise_device=self.plan.noise_device,
        )
        # Named per driver process: a restarted driver's workers must not clash with the old ones' names.
        return WorkerPool.start(spec, self.run_cfg.hardware, name_prefix=f"evora-worker-{self.run_tag}-{os.getpid()}")

    def _restore_or_init(self) -> None:
        path = checkpoint.latest_path(self.run_dir)
        self.resumed = path.exists()
        if self.resumed:
            saved = checkpoint.load_run_state(path, self.run_cfg.strategy.name, self.strategy.state_type)
            self.saved_devices: dict[str, str] | None = saved.get("devices")
            self.state = self.strategy.state_type(**saved["state"])
            self.loop = LoopState.from_saved(saved["loop"])
            self.completed_at_start = self.loop.next_generation
            return
        plan = self.plan
        context = StrategyContext(
            self.run_cfg.seed,
            plan.layout,
            plan.model_path,
            self.run_cfg.model.revision,
            train_families=tuple(e.family for e in plan.splits.train),
            prompts_per_generation=self.run_cfg.task.prompts_per_generation,
        )
        self.state = self.strategy.initial_state(context)
        self.saved_devices = None
        self.loop = LoopState(ComputeLedger(plan.parameters))
        self.completed_at_start = -1
        write_config(self.run_dir, self.run_cfg)

    # --- the loop -------------------------------------------------------------------

    def run(self, plan_ref: PlanRef) -> Iterator[Mapping[str, Any]]:
        start = time.perf_counter()
        self._take(plan_ref.get())
        try:
            self._setup()
            self.loop.ledger.add_seconds("setup", time.perf_counter() - start)  # every session's start-up, resumes too
            if self.loop.base is None:
                self._initial_evaluation()
            # Set-up's objects live as long as the run: out of the collector's sight, a full
            # collection (the live plot runs one a draw) costs only what the loop allocates.
            gc.collect()
            gc.freeze()
            yield self._start_event(time.perf_counter() - start)
            self.done = self.loop.next_generation
            while not self._ended():
                yield self._generation(self.done)
                self.done += 1
            yield self._finish()
        finally:
            self.opened.close()

    def _start_event(self, setup_seconds: float) -> StartEvent:
        loop, layout = self.loop, self.plan.layout
        moved = None
        if self.weights is not None:  # what a full-weight strategy moves, and the host memory it keeps on every worker
            weights = sum(slot.out_features * slot.in_features for slot in layout.modules)
            moved = {"full_weights": weights, "master_bytes": self.strategy.master_bytes(layout)}
        assert loop.base is not None
        master_device = self.plan.master_device if self.weights is not None else None
        return start_event(
            self.entry.name,
            generations=self._planned_generations(),
            start=loop.next_generation,
            workers=len(self.pool),
            base_heldout=loop.base["reward"],
            resumed=self.resumed,
            adapter_parameters=None if self.weights else layout.num_parameters(),
            setup_seconds=setup_seconds,
            moved=moved,
            units=self.search.units(self.state, loop.next_generation),
            master_device=master_device,
            device_change=checkpoint.device_change(self.saved_devices, self.devices),
        )

    def _initial_evaluation(self) -> None:
        started, spend = time.perf_counter(), Spend()
        record = self.scoring.initial(self.loop, self.strategy.center(self.state), spend)
        self.recorder.account(record, Spend(), spend, 0.0, time.perf_counter() - started)
        self.recorder.log(record)
        self.recorder.completions(0, self.scoring.rows)

    def _generation(self, generation: int) -> dict[str, Any]:
        started = self._generation_started = time.perf_counter()
        searched = self.search.step(self.state, generation)
        self.state, record = searched.state, searched.record
        if searched.stop is not None:  # the strategy ends the run here: this generation is its last
            self.loop.stopped = record["stop"] = searched.stop
        search_done, done = time.perf_counter(), generation + 1
        if self.budget is not None:
            self.stopping = self.budget.spent(self.loop.ledger.search_usage(searched.spend, search_done - started))
        eval_spend = Spend()
        due = self._eval_due(done)
        if due:
            record.update(self.scoring.heldout(self.loop, done, self.strategy.center(self.state), eval_spend))
        finished = time.perf_counter()
        changes = self.pool.take_events()
        record.update(
            seconds=finished - started,
            seconds_heldout=finished - search_done,
            workers=len(self.pool),
            workers_lost=record.get("workers_lost", 0) + sum(isinstance(c, WorkerLost) for c in changes),
            workers_replaced=record.get("workers_replaced", 0) + sum(isinstance(c, WorkerReplaced) for c in changes),
        )
        self.recorder.account(record, searched.spend, eval_spend, search_done - started, finished - search_done)
        self.recorder.log(record)
        if due:
            self.recorder.completions(done, self.scoring.rows)
        self._checkpoint(done)
        events = [*(searched.pool_events or []), *changes]  # for the console, not the metrics
        return {"kind": "generation", **record, "generations": self._planned_generations(), "pool_events": events}

    def _spent_now(self, spend: Spend) -> bool:
        """Budget check inside a generation: the ledger, plus this generation's spend and time so far."""
        if self.budget is None:
            return False
        elapsed = time.perf_counter() - self._generation_started
        return self.budget.spent(self.loop.ledger.search_usage(spend, elapsed))

    def _planned_generations(self) -> int | None:
        return None if self.budget else self.run_cfg.generations

    def _ended(self) -> bool:
        return self._last(self.done)

    def _last(self, done: int) -> bool:
        """Whether the run ends after `done` generations: the strategy ended it (Told.stop), its
        budget is spent, or its generations are done."""
        if self.loop.stopped is not None:
            return True
        if self.budget is not None:
            return self.stopping
        return done >= self.run_cfg.generations

    def _eval_due(self, done: int) -> bool:
        every = self.run_cfg.eval_every
        return self._last(done) or (every > 0 and done % every == 0)

    # --- finish ---------------------------------------------------------------------

    def _finish(self) -> FinalEvent:
        started, done, spend, loop = time.perf_counter(), self.done, Spend(), self.loop
        export = self.entry.kind.export_function()(
            ExportParts(
                self.plan, self.run_dir, self.strategy, self.state, loop, done, self.scoring, self.weights, spend
            )
        )
        heldout = self.plan.splits.heldout
        report = report_against_base(
            export.evaluate,
            export.best.adapter,
            None,
            heldout,
            task=self.run_cfg.task.name,
            split="heldout",
            adapter_name="adapters/best",
            out_dir=self.run_dir / "eval",
            stem="best_vs_base",
        )
        best = export.best
        if export.best_scored_by_report:
            metrics = self.scoring.with_fitness(report["adapter_metrics"])
            best = replace(best, heldout={k: metrics[k] for k in loop.last or {} if k in metrics})
        loop.ledger.evaluation.add(spend)
        loop.ledger.add_seconds("evaluation", time.perf_counter() - started)
        assert loop.base is not None
        chosen_on = "selection" if self.plan.splits.selection else "heldout"
        summary = write_run_summary(
            self.run_dir,
            run=self.run_cfg,
            heldout_size=len(heldout),
            strategy=self.run_cfg.strategy.name,
            generations=done,
            center=self.entry.center,
            outcome=Outcome(loop.base, loop.last, best.heldout, best.generation, None, chosen_on),
            counts=report["counts"],
            adapters=export.adapters,
            compute=loop.ledger.summary(sum(loop.ledger.seconds.values())),
            details=export.details,
            stopped=loop.stopped,
        )
        return final_event(summary, self.run_dir)

    # --- checkpoints ----------------------------------------------------------------

    def _checkpoint(self, done: int) -> None:
        loop = self.loop
        loop.next_generation = done
        if self.weights is not None:
            self.weights.snapshot_if_due(done)
            loop.weight_snapshots = self.weights.keep(None if loop.best is None else loop.best.generation)
        saved = checkpoint.run_state(
            self.run_cfg.strategy.name, self.state, state_fields(self.state), loop.to_saved(), self.devices
        )
        checkpoint.atomic_save(saved, checkpoint.latest_path(self.run_dir))
        if self.weights is not None:
            self.weights.remove_unlisted()
        keep = self.run_cfg.tracking.checkpoint_keep_every
        if keep and done % keep == 0:
            checkpoint.atomic_save(saved, self.run_dir / "checkpoints" / f"gen_{done}.pt")
