"""`evora serve`: a run's adapters behind vLLM's OpenAI-compatible server."""

from __future__ import annotations

from evora.commands.exits import die
from evora.errors import EvoraError


def main(argv: list[str]) -> None:
    """`evora serve <run folder> [--host H] [--port N] [--print] [-- vLLM flags]` (evora/serve.py)."""
    from evora.serve import serve

    try:
        serve(argv)
    except EvoraError as error:
        die(error)
