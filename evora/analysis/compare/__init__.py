"""`evora compare <run or sweep folder> ...`: runs side by side, from their files only.

Each run becomes a `RunRow` (`collect`: its eval/summary.json headline numbers, its best adapter's
held-out KL from the base model, its held-out reward against search compute from metrics.jsonl,
and the values its strategy's compare hook adds). `write_compare` writes compare.md, compare.json
(`tables`) and, under plots/, compare.png (reward against compute), reward_kl.png (the reward-KL
plane and its front) and, when a strategy has several runs (a sweep over seeds), consistency.png
(`figures`); `print_table` prints the same tables. A compared strategy that registers a compare
table (evora.strategies.analysis_hooks.CompareTable) adds it, with every compared run beside its
own. No Ray, vLLM or W&B here: this runs on a laptop over copied run folders.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from matplotlib.figure import Figure

from evora.analysis.compare.collect import RunRow, collect, is_run, is_sweep, read_row, sweep_jobs
from evora.analysis.compare.figures import consistency_figure, figure, reward_kl_figure, strategy_styles
from evora.analysis.compare.spread import consistency, front_flags, has_spread, pareto
from evora.analysis.compare.tables import (
    COLUMNS,
    CONSISTENCY_PLOT,
    JSON,
    MARKDOWN,
    PLOT,
    REWARD_KL_PLOT,
    compare_json,
    markdown,
    print_table,
    strategy_table_lines,
)

__all__ = [
    "COLUMNS",
    "RunRow",
    "collect",
    "compare",
    "compare_json",
    "consistency",
    "consistency_figure",
    "figure",
    "front_flags",
    "markdown",
    "pareto",
    "print_table",
    "read_row",
    "reward_kl_figure",
    "strategy_styles",
    "strategy_table_lines",
    "sweep_jobs",
    "write_compare",
]


def write_compare(rows: list[RunRow], out_dir: Path) -> list[Path]:
    """Under out_dir: compare.md, compare.json, plots/compare.png, plots/reward_kl.png and, when a
    strategy has several runs, plots/consistency.png; returns their paths in that order."""
    out_dir = Path(out_dir)
    (out_dir / PLOT).parent.mkdir(parents=True, exist_ok=True)
    md, data = out_dir / MARKDOWN, out_dir / JSON
    md.write_text(markdown(rows))
    data.write_text(json.dumps(compare_json(rows), indent=2) + "\n")
    figures: list[tuple[Path, Callable[[list[RunRow]], Figure]]] = [(PLOT, figure), (REWARD_KL_PLOT, reward_kl_figure)]
    if has_spread(consistency(rows)):
        figures.append((CONSISTENCY_PLOT, consistency_figure))
    else:  # an earlier compare into this folder may have drawn one: it would contradict compare.md
        (out_dir / CONSISTENCY_PLOT).unlink(missing_ok=True)
    for relative, draw in figures:  # one figure at a time: each is drawn, saved and dropped
        draw(rows).savefig(out_dir / relative, dpi=120)
    return [md, data, *(out_dir / relative for relative, _ in figures)]


def out_folder(folders: list[Path], out: str | Path | None) -> Path:
    """--out; else a lone sweep folder itself; else ./runs/compare-<timestamp>, beside the run
    folders a plain `evora` writes (tracking.out_dir's default), not loose in the current folder."""
    if out is not None:
        return Path(out)
    if len(folders) == 1 and not is_run(folders[0]) and is_sweep(folders[0]):
        return folders[0]
    return Path.cwd() / "runs" / f"compare-{time.strftime('%Y-%m-%d_%H-%M-%S')}"


def compare(folders: list[str | Path], out: str | Path | None = None) -> tuple[list[RunRow], list[Path]]:
    paths = [Path(f) for f in folders]
    rows = collect(paths)
    return rows, write_compare(rows, out_folder(paths, out))
