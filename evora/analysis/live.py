"""plots/reward.png redrawn while a run goes (a metrics sink the driver adds)."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

from evora.analysis.plots import PLOTS_DIR, plot_reward
from evora.tracking.metrics import read_metrics


class RewardPlotSink:
    """plots/reward.png redrawn as the run goes (as the seed documents draw it live): at most every
    `every_s` seconds, and at the end. Written to a temporary name, then renamed, so a
    viewer never opens half a PNG."""

    def __init__(self, run_dir: str | Path, every_s: float = 10.0):
        self.run_dir, self.every_s, self.drawn_at = Path(run_dir), every_s, float("-inf")

    def log(self, record: dict[str, Any]) -> None:
        if time.monotonic() - self.drawn_at >= self.every_s:
            self.draw()

    def draw(self) -> None:
        metrics = read_metrics(self.run_dir)
        if not metrics:
            return
        path = self.run_dir / PLOTS_DIR / "reward.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(".reward.png.partial")
        plot_reward(metrics).savefig(partial, dpi=120, format="png")
        os.replace(partial, path)
        # A figure is a web of reference cycles holding Agg's native buffers, freed only by a full
        # collection, which a process of many long-lived objects runs rarely: without this the
        # driver grew ~50 MiB over its first ~50 draws (bench/soak.py). The driver freezes its
        # set-up objects (gc.freeze), so this collection sees only what the loop allocated.
        gc.collect()
        self.drawn_at = time.monotonic()

    def close(self) -> None:
        self.draw()
