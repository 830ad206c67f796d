"""Hostile user rewards (issue: reliability). Each misbehaves on the examples it picks and
scores the rest like the addition task, so a run with it still learns something."""

from __future__ import annotations

import ctypes
import os
import time

import evora


def _fair(completion: str, example) -> float:
    return 1.0 if completion.strip() == example.answer else 0.0


def sleeps_forever(completion: str, example) -> float:
    while True:
        time.sleep(3600)


def segfaults(completion: str, example) -> float:
    return float(ctypes.string_at(0))  # reads address 0: SIGSEGV


def exits(completion: str, example) -> float:
    os._exit(1)


def eats_memory(completion: str, example) -> float:
    hoard = []
    while True:  # 1 GiB at a time, touched, until the machine (or the limit) says no
        hoard.append(bytearray(2**30))


def raises(completion: str, example) -> float:
    raise ValueError("a reward bug")


BEHAVIOURS = {0: sleeps_forever, 1: segfaults, 2: exits, 3: eats_memory}


def mixed(completion: str, example) -> float:
    """Sums divisible by 23 (about 4% of problems) get one of the four hostile behaviours."""
    total = int(example.answer)
    if total % 23 == 0:
        return BEHAVIOURS[(total // 23) % 4](completion, example)
    return _fair(completion, example)


def its_pid(completion: str, example) -> float:
    """The reward process's pid (a test kills the pool's processes between calls)."""
    return float(os.getpid())


@evora.batch_reward
def batch_pids(completions: list[str], examples: list) -> list[float]:
    """Each completion's reward is the pid of the process that scored its batch."""
    return [float(os.getpid())] * len(completions)


@evora.batch_reward
def batch_raising_on_23(completions: list[str], examples: list) -> list[float]:
    """Fair, except that a batch holding a sum divisible by 23 raises (the whole batch fails)."""
    if any(int(e.answer) % 23 == 0 for e in examples):
        raise ValueError("a sum divisible by 23")
    return [_fair(c, e) for c, e in zip(completions, examples)]
