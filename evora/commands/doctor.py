"""`evora doctor`: what a run would use, checked before Ray; `evora doctor --run`: checks that
execute on this node (evora/selfcheck) and the report to paste into an issue."""

from __future__ import annotations

from evora.commands.exits import die
from evora.errors import EvoraError


def main(argv: list[str]) -> None:
    """evora doctor [--run] [overrides]: the model, engines, layout and memory of a run, before Ray;
    with --run, the checks that execute here, and doctor-report.md / .json in the current folder."""
    try:
        if "--run" in argv:
            from evora.selfcheck.runner import self_check

            code = self_check([a for a in argv if a != "--run"])
        else:
            from evora.doctor import doctor

            code = doctor(argv)
    except EvoraError as error:
        die(error)
    raise SystemExit(code)
