"""A strategy that ends the run (Told.stop, CMA-ES's stop() for strategy=merge): the loop keeps
the reason in its checkpointed state, so a resume runs no more generations, and the console says
why in one line after that generation's. The run itself: tests/integration/test_merge_run.py."""

from __future__ import annotations

import io

from rich.console import Console

from evora.distributed.loop_state import LoopState
from evora.tracking import checkpoint
from evora.tracking.compute import ComputeLedger
from evora.tracking.progress import ConsoleProgress

WHY = "CMA-ES's stop() says tolflatfitness=1 (strategy.on_cma_stop=restart would restart it instead)"


def test_the_reason_a_strategy_ended_the_run_survives_a_checkpoint(tmp_path):
    loop = LoopState(ComputeLedger(1000), next_generation=3, stopped=WHY)
    path = tmp_path / "latest.pt"
    checkpoint.atomic_save({"loop": loop.to_saved()}, path)
    assert LoopState.from_saved(checkpoint.load(path)["loop"]).stopped == WHY
    running = LoopState(ComputeLedger(1000), next_generation=3)
    assert LoopState.from_saved(running.to_saved()).stopped is None


def test_a_checkpoint_from_before_strategies_could_stop_a_run_goes_on():
    saved = LoopState(ComputeLedger(1000), next_generation=2).to_saved()
    del saved["stopped"]
    assert LoopState.from_saved(saved).stopped is None


def generation(number: int, **more) -> dict:
    return {"kind": "generation", "generation": number, "generations": 30, "seconds": 1.0, **more}


def test_the_console_says_once_why_the_strategy_ended_the_run():
    buffer = io.StringIO()
    with ConsoleProgress(enabled=False, console=Console(file=buffer, width=300)) as progress:
        progress.handle(generation(1, stop=None))
        progress.handle(generation(2, stop=WHY))
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].startswith("gen    1/30") and lines[1].startswith("gen    2/30"), lines
    assert lines[2] == f"the strategy ends the run after generation 2: {WHY}"
