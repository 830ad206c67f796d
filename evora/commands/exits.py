"""How a command ends on bad input or a failure: one line on stderr, exit 2 or 1."""

from __future__ import annotations

import sys
from typing import NoReturn

from evora.errors import EvoraError

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1


def die(error: EvoraError) -> NoReturn:
    print(f"evora: error: {error}", file=sys.stderr)
    raise SystemExit(error.exit_code)
