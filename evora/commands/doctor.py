"""`evora doctor`: what a run would use, checked before Ray; `evora doctor --run`: checks that
execute on this node (evora/selfcheck) and the report to paste into an issue."""

from __future__ import annotations

import os
from pathlib import Path

from evora.commands.exits import die
from evora.errors import EvoraError


def main(argv: list[str]) -> None:
    """evora doctor [--run] [overrides]: the model, engines, layout and memory of a run, before Ray;
    with --run, the checks that execute here, and doctor-report.md / .json in the current folder."""
    try:
        if "--run" in argv:
            code = run_here([a for a in argv if a != "--run"])
        else:
            from evora.doctor import doctor

            code = doctor(argv)
    except EvoraError as error:
        die(error)
    raise SystemExit(code)


def run_here(overrides: list[str]) -> int:
    """The checks on this node, in this process: its environment first, as an engine worker's."""
    from evora.engines.environment import engine_environment
    from evora.selfcheck.runner import node_for, run_checks

    node = node_for(overrides)
    os.environ.update(engine_environment(node.engine, node.spec))
    return run_checks(node, overrides, Path("."))
