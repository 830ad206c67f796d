"""A work unit's cells: which (spec, prompt) pairs it evaluates, the engine requests they
make (every cell `samples` times, each sample with its own seed), and how the samples'
scores become one value per cell (`task.aggregate`), in [spec, prompt] matrices.

Requests run cell by cell, a cell's samples in order, so request `c * samples + s` is
sample s of cell c."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from evora.engines import AdapterRef, Sampling
from evora.strategies.protocol import prompts_of
from evora.tasks.aggregate import aggregate
from evora.tasks.decoding import Decoding

Cell = tuple[int, int]  # (row: the spec's position in the unit, column: the prompt's)


def evaluated_cells(specs: Sequence[Any], prompt_indices: Sequence[int]) -> np.ndarray:
    """[spec, prompt] bool: every cell, except where a spec names the prompts it is evaluated on."""
    mask = np.ones((len(specs), len(prompt_indices)), dtype=bool)
    for row, spec in enumerate(specs):
        routed = prompts_of(spec)
        if routed is not None:
            wanted = set(routed)
            mask[row] = [index in wanted for index in prompt_indices]
    return mask


@dataclass(frozen=True)
class Requests:
    """A unit's engine requests, cell-major: request c * samples + s is sample s of cells[c]."""

    cells: list[Cell]
    samples: int
    prompts: list[list[int]]
    adapters: list[AdapterRef | None]
    sampling: list[Sampling] | None  # None: greedy

    def rows(self) -> list[int]:
        """The spec row of each request."""
        return [row for row, _ in self.cells for _ in range(self.samples)]


def requests_of(
    mask: np.ndarray,
    prompts: list[list[int]],
    refs: list[AdapterRef | None],
    decoding: Decoding,
    seed: Callable[[int, int, int], int],
) -> Requests:
    """Every evaluated cell's requests; `seed(row, column, sample)` seeds a sampled one."""
    cells = [(int(row), int(col)) for row, col in np.argwhere(mask)]  # row-major, evaluated cells only
    n = decoding.samples
    sampling = None
    if not decoding.greedy:
        sampling = [
            Sampling(decoding.temperature, decoding.top_p, seed(row, col, s)) for row, col in cells for s in range(n)
        ]
    return Requests(
        cells,
        n,
        [prompts[col] for _, col in cells for _ in range(n)],
        [refs[row] for row, _ in cells for _ in range(n)],
        sampling,
    )


@dataclass(frozen=True)
class CellValues:
    """One value per evaluated cell (cell order): the aggregate of its samples."""

    rewards: list[float]
    correct: list[Any]  # bool with one sample a cell; else the aggregate's correctness in [0, 1]
    tokens: list[Any]  # generated tokens: int with one sample; else the mean over the samples
    correct_counts: list[int] | None  # with several samples: how many were correct (pass@k)
    failed: list[bool]  # a reward of the cell failed: the cell is left out (task.reward_penalty null)


def cell_values(
    decoding: Decoding,
    rewards: Sequence[float],
    correct: Sequence[bool],
    tokens: Sequence[int],
    answers: Sequence[str | None] | None,
    failed: Sequence[bool],
) -> CellValues:
    """The per-sample scores of a unit's requests, aggregated per cell. A cell any of whose
    samples' rewards failed is failed: its aggregate would count a score nobody gave."""
    n = decoding.samples
    if n == 1:
        return CellValues(list(rewards), list(correct), list(tokens), None, list(failed))
    spans = [slice(start, start + n) for start in range(0, len(rewards), n)]
    outcomes = [
        aggregate(decoding.aggregate, rewards[s], correct[s], None if answers is None else answers[s], decoding.k)
        for s in spans
    ]
    return CellValues(
        [o.reward for o in outcomes],
        [o.correct for o in outcomes],
        [float(np.mean(tokens[s])) for s in spans],
        [int(sum(correct[s])) for s in spans],
        [any(failed[s]) for s in spans],
    )


def per_cell_means(values: Sequence[float], samples: int) -> list[float]:
    """A per-request value (e.g. KL) as its mean over each cell's samples."""
    return [float(np.mean(values[i : i + samples])) for i in range(0, len(values), samples)]


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
