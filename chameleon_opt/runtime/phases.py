"""Optional per-phase timers of a worker's step: wall time and the step thread's CPU time per phase.

Why: the performance model is held against the runtime's measured steps (bench/runtime_steps_hf.py),
and a step that measures slower than predicted can only be explained phase by phase (compute, the
pipelining schedule's own work, gradient all-reduce, optimizer) when each phase's time is known. On
a machine whose cores are shared, the thread's CPU time separates a phase's own work from waiting
(for a peer, or for the core); a phase's wall minus its CPU is that waiting. Off, every span is a
no-op, so the runtime pays nothing unless a bench asks for them (`JobSpec.phase_timers`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class PhaseTimer:
    """Wall seconds, thread CPU seconds and calls per named phase, until `take` resets them.

    Spans of different names may nest (a forward inside the schedule); a phase is then part of its
    enclosing one, which the reader subtracts (`phase_table`)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.totals: dict[str, list[float]] = {}

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - wall, time.thread_time() - cpu)

    def add(self, name: str, wall_s: float, cpu_s: float, calls: int = 1) -> None:
        entry = self.totals.setdefault(name, [0.0, 0.0, 0])
        entry[0] += wall_s
        entry[1] += cpu_s
        entry[2] += calls

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """`function` timed as phase `name` at every call (itself when the timer is off)."""
        if not self.enabled:
            return function

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.span(name):
                return function(*args, **kwargs)

        return timed

    def take(self) -> dict[str, dict[str, float]]:
        """The phases so far as {name: {wall_s, cpu_s, calls}}, and start again from none."""
        out = {name: {"wall_s": wall, "cpu_s": cpu, "calls": calls} for name, (wall, cpu, calls) in self.totals.items()}
        self.totals = {}
        return out


def runqueue_wait_s() -> float:
    """Seconds the calling thread has been runnable but waiting for its core (Linux schedstat; 0
    elsewhere): on a worker's own core only its process's other threads take it, so more than
    their CPU means another process ran on the core."""
    try:
        return int(open("/proc/thread-self/schedstat").read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return 0.0


def phase_table(phases: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """The median over steps of each phase's wall and CPU seconds and calls (one rank's replies)."""
    import statistics

    names = sorted({name for step in phases for name in step})
    return {name: {key: statistics.median(step.get(name, {}).get(key, 0.0) for step in phases)
                   for key in ("wall_s", "cpu_s", "calls")} for name in names}
