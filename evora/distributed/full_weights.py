"""The engines' base weights under a full-weight strategy (EGGROLL): kept in step on every
worker, snapshotted, restored on resume, exported.

The driver holds no weights. A generation's weights are a recipe: the newest snapshot at or
before it (None: the model's own weights) and the updates since, a few numbers each
(`strategy.update_of`). Every worker brings its fp32 master copies to the recipe itself
(`EngineWorker.sync_weights`: only the updates it lacks) and reports a checksum; the
checksums must agree. A replacement worker is synced the same way when it joins the pool.
Every `snapshot_every` generations worker 0's master copies are written to
`checkpoints/weights_gen_<g>.safetensors` (fp32); the checkpoint lists the snapshots to keep
(the newest, and the newest at or before the best generation), so resume and the finish's
best model replay from a snapshot, never from the start of a long run.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import ray
from safetensors.torch import load_file, save_file

from evora.distributed.evaluate import SplitOutcome
from evora.distributed.pool import WorkerPool
from evora.errors import RunError
from evora.lora import Tensors
from evora.lora.base_weights import read_weights
from evora.lora.layout import AdapterLayout
from evora.lora.peft_io import save_adapter
from evora.lora.resize import low_rank_delta
from evora.models.export import model_folder, write_model
from evora.strategies.full_weights import MovesWeights, matrix_name
from evora.strategies.protocol import BASE, CENTER

SNAPSHOT = "weights_gen_{}.safetensors"


class EngineWeights:
    def __init__(self, strategy: MovesWeights, pool: WorkerPool, run_dir: Path, snapshots: list[int], knobs: str):
        self.strategy = strategy
        self.pool = pool
        self.folder = run_dir / "checkpoints"
        self.snapshots = sorted(snapshots)
        self.knobs = knobs  # the strategy's float settings, named when an update blows up
        self.generation = -1
        self.checksum: str | None = None
        self._recipe: tuple[Any, int, Any] = (None, 0, [])
        self._snapshot_refs: dict[int, Any] = {}
        pool.on_join = self._join

    # --- keeping the workers in step ---------------------------------------------------

    def to(self, state: Any, generation: int) -> dict[str, float]:
        """Every worker's weights to those after `generation` updates; returns the last update's
        norm and the slowest worker's seconds."""
        start = max([s for s in self.snapshots if s <= generation], default=0)
        updates = [self.strategy.update_of(state, g) for g in range(start, generation)]
        self._recipe = (self._snapshot_ref(start), start, ray.put(updates))
        self.checksum = None  # a replacement joining meanwhile is checked at the next sync
        reports = self.pool.broadcast("sync_weights", *self._recipe)
        checksums = sorted({r["checksum"] for r in reports})
        if len(checksums) > 1:
            by_worker = ", ".join(f"worker {r['worker']}: {r['checksum'][:12]}" for r in reports)
            raise RunError(f"generation {generation}: the workers' weights differ ({by_worker}); stopping")
        if not reports[0]["finite"]:
            raise RunError(
                f"generation {generation}: the update made the base weights non-finite; look at {self.knobs}"
            )
        self.generation, self.checksum = generation, checksums[0]
        # A replacement that joined during this sync was brought to these weights by `_join`
        # and applied nothing now (norm 0): the norm is that of the workers that applied it.
        norm = max(r["update_norm"] for r in reports)
        return {"update_norm": norm, "seconds_weights": max(r["seconds"] for r in reports)}

    def _join(self, actor: Any) -> None:
        ray.get(actor.sync_weights.remote(*self._recipe, self.checksum))

    def _snapshot_ref(self, generation: int) -> Any:
        if generation == 0:
            return None
        if generation not in self._snapshot_refs:
            self._snapshot_refs = {generation: ray.put(load_file(str(self.folder / SNAPSHOT.format(generation))))}
        return self._snapshot_refs[generation]

    # --- snapshots ----------------------------------------------------------------------

    def snapshot_if_due(self, done: int) -> None:
        if done % self.strategy.snapshot_every or done in self.snapshots:
            return
        tensors = ray.get(self.pool.first_live().master_weights.remote())
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / SNAPSHOT.format(done)
        partial = path.with_name(path.name + ".partial")
        save_file(tensors, str(partial))
        os.replace(partial, path)
        self.snapshots.append(done)

    def keep(self, best_generation: int | None) -> list[int]:
        """The snapshots the next checkpoint lists: the newest, and the newest at or before the best."""
        keep = set(self.snapshots[-1:])
        if best_generation is not None:
            keep.update([s for s in self.snapshots if s <= best_generation][-1:])
        self.snapshots = sorted(keep)
        return list(self.snapshots)

    def remove_unlisted(self) -> None:
        """Snapshot files the last checkpoint does not list (after it was written)."""
        listed = {SNAPSHOT.format(g) for g in self.snapshots}
        for file in self.folder.glob(SNAPSHOT.format("*")):
            if file.name not in listed:
                file.unlink(missing_ok=True)

    # --- the finish ---------------------------------------------------------------------

    def master(self) -> Tensors:
        tensors = ray.get(self.pool.first_live().master_weights.remote())
        return {k: v for k, v in tensors.items() if "/" not in k}  # without optimizer moments

    def export(
        self,
        run_dir: Path,
        folder_name: str,
        adapter_name: str,
        original: Tensors,
        model: tuple[str, str | None],
        layout: AdapterLayout,
        delta_rank: int,
    ) -> float:
        """The current weights as a model folder, and their update as a rank-k PEFT LoRA;
        returns the LoRA's relative error."""
        weights = self.master()
        write_model(model_folder(*model), run_dir / folder_name, weights)
        delta_layout = replace(layout, rank=delta_rank, alpha=float(delta_rank))
        deltas = {}
        for slot in layout.modules:
            name = matrix_name(slot.name)
            delta = weights[name] - original[name]
            deltas[slot.name] = delta.T if slot.stored_transposed else delta  # LoRA factors are [out, in]
        tensors, error = low_rank_delta(deltas, delta_layout)
        save_adapter(run_dir / "adapters" / adapter_name, tensors, delta_layout)
        return error

    def compare_at(
        self, state: Any, best_generation: int, evaluate_base: Callable[[], SplitOutcome]
    ) -> Callable[..., dict[str, SplitOutcome]]:
        """An `Evaluate` for `report_against_base`: the weights of `best_generation` stand for
        the adapter (CENTER), the model's own weights for BASE, each on the engines' base path."""

        def evaluate(adapter: Any, layout: Any, ops: list[str]) -> dict[str, SplitOutcome]:
            out = {}
            for op, generation in ((CENTER, best_generation), (BASE, 0)):
                if op in ops:
                    self.to(state, generation)
                    out[op] = evaluate_base()
            return out

        return evaluate


def original_weights(model: tuple[str, str | None], layout: AdapterLayout) -> Tensors:
    return read_weights(model[0], [matrix_name(slot.name) for slot in layout.modules], model[1])
