"""SIGTERM and Ctrl-C as exceptions that stop a run at once, also where a signal lands inside one
of Ray's Cython calls and is swallowed there (reported as unraisable): the handler records each
interrupt, and the CLI's event handler and the wait on the driver's events raise it again."""

from __future__ import annotations

import signal
from typing import Any


class Terminated(BaseException):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so the run stops the same way."""


PENDING: list[BaseException] = []  # interrupts the handlers raised, in order


def raise_interrupt(signum: int, frame: Any) -> None:
    interrupt = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    PENDING.append(interrupt)
    raise interrupt


def install_handlers() -> None:
    signal.signal(signal.SIGTERM, raise_interrupt)  # kept by init_ray over Ray's own handler
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where the shell ignores it (background)
        signal.signal(signal.SIGINT, raise_interrupt)


def raise_pending() -> None:
    """Raise the last interrupt recorded, if any (one a call swallowed)."""
    if PENDING:
        raise PENDING[-1]
