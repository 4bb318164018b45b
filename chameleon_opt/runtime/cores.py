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
    """Run process `pid` (0: this one) on `core` only."""
    os.sched_setaffinity(pid, {core})


def _context(preload: tuple[str, ...]) -> mp.context.BaseContext:
    """Where workers start: a fork server that has imported torch and the runtime's modules once,
    so that a worker (the job's first ones, and a device back whose arrival every survivor waits
    for in group formation) does not import them again (1.5 s of CPU each for torch, 4 s with
    transformers). The server is started by the first worker of this process, with the modules
    its runtime names; later workers of another runtime import what it lacks themselves. Spawn
    where there is no fork server (Windows). Both start the worker from a process that has formed
    no process group and runs no thread."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", *preload])  # read only when the server starts
    return ctx


def _pinned(target: Callable[..., None], core: int | None, *args: Any) -> None:
    """The worker's entry: on its core before it creates a thread (threads inherit the affinity)."""
    if core is not None:
        pin(0, core)
    target(*args)


def start_worker(target: Callable[..., None], args: tuple[Any, ...], heartbeat_slots: Any, core: int | None,
                 preload: tuple[str, ...] = ()) -> tuple[BaseProcess, Connection]:
    """A worker process running `target(*args, conn, heartbeat_slots)`, on `core` alone when given
    (shared cores when None), and the controller's end of its pipe. `preload`: the modules the
    target imports, for the fork server (`_context`)."""
    ctx = _context(preload)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_pinned, args=(target, core, *args, child, heartbeat_slots), daemon=True)
    proc.start()
    child.close()
    return proc, parent
