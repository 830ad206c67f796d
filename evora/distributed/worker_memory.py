"""A worker's memory as it reports it: its process tree's RSS, read at most once a second,
each read after the heap's freed pages are handed back to the system."""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from typing import Callable

import psutil

# Finding a process's children reads every process on the node (/proc), milliseconds a read:
# read per work unit, it cost more than the unit (bench/scale.py).
READ_EVERY_S = 1.0


def process_tree_rss_mb(pid: int | None = None) -> float:
    """RSS of a process (this one by default) and its children, MiB."""
    me = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]) / 2**20


def heap_trimmer() -> Callable[[int], int] | None:
    """glibc's malloc_trim, where the C library has one (not macOS's, not musl's)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


# vLLM's CPU engine frees much of what a generate call allocates into glibc's arenas, which keep
# it: untrimmed, a worker's RSS grew ~3 MiB a generation for 80 generations (bench/soak.py), all
# of it handed back by malloc_trim.
TRIM_HEAP = heap_trimmer()


class MemoryGauge:
    def __init__(self) -> None:
        self.read_at, self.mib = float("-inf"), 0.0

    def rss_mb(self) -> float:
        now = time.monotonic()
        if now - self.read_at >= READ_EVERY_S:
            if TRIM_HEAP is not None:
                TRIM_HEAP(0)
            self.read_at, self.mib = now, process_tree_rss_mb()
        return self.mib
