"""One CPU core per worker process, for measurements that the performance model can be held against.

The model prices one dedicated device per worker. Workers that share cores are slowed by the
sharing, not by the plan (on a 2-core machine a killed worker of four frees a core, so a recovered
job can measure faster than the failure-free one), so the benches pin each worker to a core of its
own and refuse to report a prediction error when there are not enough cores for that.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any


def available_cores() -> list[int]:
    """The cores this process may run on (its affinity, which a container or taskset narrows)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform: every core counts
        return list(range(os.cpu_count() or 1))


def dedicated_cores(workers: int) -> list[int] | None:
    """A core for each of `workers` processes, keeping the first available core for the
    controller (it polls replies and heartbeats while the workers step), or None when there are
    too few: then the workers would share cores."""
    cores = available_cores()
    if len(cores) < workers + 1:
        return None
    return cores[1:workers + 1]


def pin(pid: int, core: int) -> None:
    """Run process `pid` on `core` only. Set by the parent right after the start, before the
    spawned child imports torch, so every thread it creates later inherits the one core."""
    os.sched_setaffinity(pid, {core})


def start_worker(target: Callable[..., None], args: tuple[Any, ...], heartbeat_slots: Any, core: int | None
                 ) -> tuple[BaseProcess, Connection]:
    """A spawned worker process running `target(*args, conn, heartbeat_slots)`, on `core` alone
    when given (shared cores when None), and the controller's end of its pipe."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child, heartbeat_slots), daemon=True)
    proc.start()
    if core is not None:
        pin(proc.pid, core)
    child.close()
    return proc, parent
