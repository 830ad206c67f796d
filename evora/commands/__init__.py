"""`evora`'s subcommands, one module each with its `main(argv)`; `evora/cli.py` dispatches to
them through `SUBCOMMANDS` (imported on use, so that `evora --help` imports none of them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Subcommand:
    module: str  # evora.commands.<module>, whose main(argv) runs it
    summary: str  # its line in `evora --help`


SUBCOMMANDS: dict[str, Subcommand] = {
    "eval": Subcommand(
        "evaluate", "evaluate an adapter (or the base model) on a split, optionally against the base model"
    ),
    "analyze": Subcommand("analyze", "plots/ and report.md of a run folder, or sweep.png of a sweep folder"),
    "compare": Subcommand(
        "compare", "base/final/best held-out reward, compute and wall-clock of several runs, side by side"
    ),
    "runs": Subcommand("runs", "list, show or clean the run folders under runs/"),
    "doctor": Subcommand(
        "doctor", "the model, engines, layout and memory of a run, before Ray; --run: checks that execute here"
    ),
    "serve": Subcommand("serve", "vLLM's OpenAI-compatible server with a run's base model and adapters by name"),
    "data": Subcommand("data", "write a task's data file in the format it reads: evora data countdown"),
}
