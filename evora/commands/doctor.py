"""`evora doctor`: what a run would use, checked before Ray."""

from __future__ import annotations

from evora.commands.exits import die
from evora.errors import EvoraError


def main(argv: list[str]) -> None:
    """evora doctor [overrides]: the model, engines, layout and memory of a run, before Ray."""
    from evora.doctor import doctor

    try:
        code = doctor(argv)
    except EvoraError as error:
        die(error)
    raise SystemExit(code)
