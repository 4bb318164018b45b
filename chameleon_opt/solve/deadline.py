"""One deadline for a whole decision, passed down through every stage that may run long.

An operator in a failure has a budget for the decision, not per solver call: `--time-limit T`
becomes one `Deadline`, and each stage (rerouting, plan search, communication) takes a share of
what is left when it starts (`share`), so time one stage does not use passes on to the next.
Every stage reports what it was given and whether it stopped early (`StageTime`), so the JSON
says which answer is a time-limited one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    """An absolute end on the `time.perf_counter` clock."""

    end: float

    @classmethod
    def after(cls, seconds: float, start: float | None = None) -> Deadline:
        return cls((time.perf_counter() if start is None else start) + seconds)

    @classmethod
    def never(cls) -> Deadline:
        return cls(float("inf"))

    def left(self) -> float:
        """Seconds left (0 once passed)."""
        return max(self.end - time.perf_counter(), 0.0)

    def expired(self) -> bool:
        return time.perf_counter() >= self.end

    def share(self, fraction: float, at_least: float = 0.0) -> Deadline:
        """A stage's deadline: `fraction` of what is left now (at least `at_least` seconds, never
        past this deadline)."""
        now = time.perf_counter()
        left = max(self.end - now, 0.0)
        return Deadline(min(now + max(left * fraction, min(at_least, left)), self.end))


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
