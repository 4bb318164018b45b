"""One deadline for a whole decision, passed down through every stage that may run long.

An operator in a failure has a budget for the decision, not per solver call: `--time-limit T`
becomes one `Deadline`, and each stage (rerouting, plan search, communication) takes a share of
what is left when it starts (`share`), so time one stage does not use passes on to the next.
Every stage reports what it was given and whether it stopped early (`StageTime`), so the JSON
says which answer is a time-limited one.

A deterministic deadline (`Deadline.after(..., deterministic=True)`, for `simulate --deterministic`)
reads a work clock instead of the wall clock: it starts at the deadline's start and advances
WORK_S_PER_CHECK with every `expired()` check, the call each stage's loop makes per unit of work
(a combination enumerated, 512 branch-and-bound nodes, a polish move). Wall-time windows (the
branch and bound's first share, the polish budgets, the enumeration's share) made a busy run
stop elsewhere than a quiet one; on the work clock two runs stop at the same point however
loaded the machine is. Shares stay fractions of the nominal time; a solver given `left()` takes
it as a work budget (CP-SAT's deterministic time, `backends.SolverOptions.deterministic`). Only
past a wall-clock safety net, DETERMINISTIC_WALL_FACTOR x the limit, does it expire as a timed
deadline would (the run is then no longer reproducible, and the stages say they stopped early).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace


DETERMINISTIC_WALL_FACTOR = 10.0
"""A deterministic deadline expires only once this many times its limit has passed on the wall
clock: load 8 makes a 2-core machine 4-5x slower, and a run that never ends is no answer either."""
WORK_S_PER_CHECK = 1e-4
"""Nominal seconds one `expired()` check stands for on a deterministic deadline: the loops that
check most often (the paper's enumeration per combination, the relaxation bound's grid) check
every 0.1-0.25 ms on a quiet 2-core machine (26,000 checks in 3.6 s of paper-32's simulation)."""


class WorkClock:
    """The checks made so far against a deterministic deadline and its shares (one counter for
    the whole decision, as one wall clock was)."""

    def __init__(self, start: float) -> None:
        self.start, self.checks = start, 0

    def read(self) -> float:
        return self.start + self.checks * WORK_S_PER_CHECK


@dataclass(frozen=True)
class Deadline:
    """An absolute end on the `time.perf_counter` clock; with `work` set (a deterministic deadline,
    see the module docstring) on that work clock, until the wall clock passes `wall_end`, after
    which it reads past every end."""

    end: float
    work: WorkClock | None = field(default=None, compare=False)
    wall_end: float = math.inf

    @classmethod
    def after(cls, seconds: float, start: float | None = None, deterministic: bool = False) -> Deadline:
        begin = time.perf_counter() if start is None else start
        if deterministic:
            return cls(begin + seconds, WorkClock(begin), begin + seconds * DETERMINISTIC_WALL_FACTOR)
        return cls(begin + seconds)

    @classmethod
    def never(cls) -> Deadline:
        return cls(float("inf"))

    @property
    def deterministic(self) -> bool:
        return self.work is not None

    def now(self) -> float:
        """This deadline's clock: `time.perf_counter`, or the work clock (inf past the safety net).
        Stages that weigh their own elapsed time against `left()` measure it on this clock."""
        if self.work is None:
            return time.perf_counter()
        return self.work.read() if time.perf_counter() < self.wall_end else math.inf

    def used_since(self, started: float) -> float:
        """Seconds a stage begun at `started` (on `time.perf_counter`) has used as this deadline
        counts them: the wall time, or none on a deterministic deadline (its caller charges a fixed
        search time instead: `simulate --deterministic`)."""
        return 0.0 if self.work is not None else time.perf_counter() - started

    def left(self) -> float:
        """Seconds left (0 once passed)."""
        return max(self.end - self.now(), 0.0)

    def expired(self) -> bool:
        """Whether the end has passed; on a deterministic deadline each call is one unit of work."""
        if self.work is not None:
            self.work.checks += 1
        return self.now() >= self.end

    def until(self, end: float) -> Deadline:
        """The same clock with an earlier end (never past this deadline's)."""
        return replace(self, end=min(end, self.end))

    def within(self, seconds: float) -> Deadline:
        """At most `seconds` from now on this deadline's clock, never past it."""
        return self.until(self.now() + seconds)

    def share(self, fraction: float, at_least: float = 0.0) -> Deadline:
        """A stage's deadline: `fraction` of what is left now (at least `at_least` seconds, never
        past this deadline)."""
        now = self.now()
        left = max(self.end - now, 0.0)
        return self.until(now + max(left * fraction, min(at_least, left)))


def process_started() -> float:
    """When this process started, on `time.perf_counter`'s clock: the CLI's deadline is anchored
    here (`cli.STARTUP_ALLOWANCE_S`), so a loaded machine's slow start-up comes out of the
    decision's time instead of adding to what the operator waits for. Linux gives the start in
    clock ticks since boot (/proc/self/stat, field 22); elsewhere, or if that cannot be read, now."""
    now = time.perf_counter()
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):  # no /proc, no CLOCK_BOOTTIME
        return now
    return now - max(age, 0.0)


class DeadlinePassed(Exception):
    """A stage's deadline passed before it had any valid answer to return, and the caller asked
    to be told rather than wait for one (e.g. a migration of 90,000 transfers at 16,384 devices:
    its candidate is then unusable, said so, instead of a second past the deadline). `needed_s`
    estimates the time the stage would have needed, `given_s` what it had: the operator's hint
    for a limit that would suffice."""

    def __init__(self, message: str, needed_s: float | None = None, given_s: float | None = None) -> None:
        super().__init__(message)
        self.needed_s, self.given_s = needed_s, given_s


@dataclass(frozen=True)
class StageTime:
    """What one stage of a decision was given and used; `stopped_early` when it returned a
    time-limited answer (an incumbent without proof, a fallback, or nothing)."""

    stage: str
    limit_s: float
    wall_s: float
    stopped_early: bool
    note: str = ""
    needed_s: float | None = None  # when it stopped early: an estimate of the time it needed

    def to_json(self) -> dict[str, object]:
        return {"stage": self.stage, "limit_s": round(self.limit_s, 6), "wall_s": round(self.wall_s, 6),
                "stopped_early": self.stopped_early, "note": self.note,
                "needed_s": None if self.needed_s is None else round(self.needed_s, 6)}
