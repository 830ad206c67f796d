"""Whether a lost engine worker was killed for memory, and by what: Ray's memory monitor (its
error says so), or the kernel's OOM killer, checked on the worker's node: the kernel log names
the process and the node's count of OOM kills rose while the worker lived (where the log cannot
be read, the count alone). A worker killed for memory is not replaced: its replacement would
hold as much and die the same way."""

from __future__ import annotations

import os
from typing import Any

# Ray's memory monitor: "Task was killed due to the node running low on memory."
RAY_MONITOR_KILL = "running low on memory"
VMSTAT = "/proc/vmstat"
KERNEL_LOG = "/dev/kmsg"
CHECK_TIMEOUT_S = 30.0


def oom_kills() -> int | None:
    """This node's count of processes killed by the kernel's OOM killer since boot (None: unknown)."""
    try:
        with open(VMSTAT) as vmstat:
            for line in vmstat:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except OSError:
        pass
    return None


def kernel_log_names(pid: int) -> bool | None:
    """Whether the kernel log records the OOM killer killing `pid` (None: the log is not readable)."""
    try:
        log = os.open(KERNEL_LOG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found = False
    try:
        while True:
            try:
                record = os.read(log, 8192)
            except BlockingIOError:  # read to the end
                break
            except BrokenPipeError:  # a record overwritten while we read: go on with the next
                continue
            if not record:
                break
            found = found or f"Killed process {pid} (" in record.decode(errors="replace")
    finally:
        os.close(log)
    return found


def killed_by_the_kernel(pid: int, oom_kills_at_start: int | None) -> bool:
    """Run on the worker's node. Both pieces of evidence where both can be read: a pid the log
    names may be an older process's, reused."""
    now = oom_kills()
    rose = None if now is None or oom_kills_at_start is None else now > oom_kills_at_start
    named = kernel_log_names(pid)
    return bool(rose if named is None else named and rose is not False)


def memory_killer(error: BaseException, info: dict[str, Any]) -> str | None:
    """What killed a lost worker for memory (`info`: its `EngineWorker.info()`), or None."""
    if RAY_MONITOR_KILL in str(error):
        return "Ray's memory monitor"
    node, pid = info.get("node"), info.get("pid")
    if node is None or pid is None:
        return None
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not any(n["NodeID"] == node and n["Alive"] for n in ray.nodes()):
        return None  # the node is gone with it: not a memory death of this worker's own
    on_node = NodeAffinitySchedulingStrategy(node, soft=False)
    check = ray.remote(num_cpus=0, max_retries=0)(killed_by_the_kernel).options(scheduling_strategy=on_node)
    ref = check.remote(pid, info.get("oom_kills"))
    ready, _ = ray.wait([ref], timeout=CHECK_TIMEOUT_S)
    try:
        return "the kernel's OOM killer" if ready and ray.get(ready[0]) else None
    except Exception:  # the node went away meanwhile: no evidence
        return None
