"""One result type for every solver, whatever its backend (CP-SAT, HiGHS, CBC, DP, enumeration).

Like python-mip's and cvxpy's single status enum: callers never read a backend's own codes. A
time-limited solve returns its best incumbent with the proven bound; when the backend finds
nothing, the caller's heuristic solution comes back labelled HEURISTIC, never disguised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

T = TypeVar("T")


class Status(str, Enum):
    OPTIMAL = "OPTIMAL"          # proven optimal (gap within the solver's tolerance)
    FEASIBLE = "FEASIBLE"        # an incumbent with a bound; optimality not proven in time
    INFEASIBLE = "INFEASIBLE"    # proven: no solution exists (see `reason`)
    NO_SOLUTION = "NO_SOLUTION"  # nothing found in time and no fallback applied
    HEURISTIC = "HEURISTIC"      # the solver found nothing; this is the fallback heuristic's answer

    @property
    def has_solution(self) -> bool:
        return self in (Status.OPTIMAL, Status.FEASIBLE, Status.HEURISTIC)


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """|objective - bound| / |objective| for a minimisation; 0 when both are 0."""
    if objective is None or bound is None or math.isinf(objective) or math.isinf(bound):
        return None
    if objective == 0:
        return 0.0 if bound == 0 else math.inf
    return max(objective - bound, 0.0) / abs(objective)


@dataclass(frozen=True)
class SolveResult(Generic[T]):
    """Outcome of one solve: the solution (if any) and how much is proven about it."""

    status: Status
    solution: T | None
    objective: float | None
    bound: float | None
    wall_s: float                 # time in the solver proper
    backend: str
    build_s: float = 0.0          # time to build the model, reported apart from the solve
    seed: int | None = None
    reason: str = ""              # why infeasible, or which fallback was used
    stopped_early: bool = False   # the deadline cut it before it could prove (or find) an answer

    def __post_init__(self) -> None:
        """Plain floats: floors computed with numpy come back as numpy scalars, whose comparisons
        give numpy bools and whose sums numpy ints, which no JSON writer takes."""
        for name in ("objective", "bound"):
            value = getattr(self, name)
            if value is not None and type(value) is not float:
                object.__setattr__(self, name, float(value))

    @property
    def gap(self) -> float | None:
        return relative_gap(self.objective, self.bound)

    def to_json(self) -> dict[str, object]:
        """The `solve` object of the CLI contract."""
        return {"status": self.status.value, "objective": self.objective, "bound": self.bound,
                "gap": self.gap, "wall_s": self.wall_s, "build_s": self.build_s, "backend": self.backend,
                "seed": self.seed, "reason": self.reason, "stopped_early": self.stopped_early}
