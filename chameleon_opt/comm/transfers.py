"""The record of a state migration: its transfers (one point-to-point copy each, in a round) and the
schedule they form. Apart from how it is computed (migration.py) and cut into rounds (rounds.py),
which both speak of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from chameleon_opt.plan import Plan
from chameleon_opt.solve.result import SolveResult


class Transfer(NamedTuple):
    """One point-to-point copy of (part of) one tensor in one round. A named tuple, not a frozen
    dataclass: a migration at 1,024 devices builds ~28,000 of them inside the deadline, and a
    frozen dataclass's field-by-field __init__ costs five times as much."""

    tensor: str
    layer: int
    tp_rank: int
    src: int
    dst: int
    nbytes: int
    round: int = -1

    def to_json(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "src": self.src, "dst": self.dst, "bytes": self.nbytes, "round": self.round}


@dataclass(frozen=True)
class Migration:
    """The migration schedule from the old plan's state to `plan`'s.

    `makespan_s` is the executable, round-based time (sum over rounds of the slowest transfer:
    rounds separated by barriers); `async_makespan_s` the same rounds without barriers (each device
    runs its transfers in round order and waits only for its peer); `fluid_makespan_s` the LP's
    (each device streams its transfers back to back). `lower_bound_s` holds for all three and does
    not depend on any solver."""

    plan: Plan
    transfers: tuple[Transfer, ...]
    rounds: int
    makespan_s: float
    fluid_makespan_s: float
    lower_bound_s: float
    max_degree: int
    round_times_s: tuple[float, ...]
    release_after_round: dict[int, int]
    solve: SolveResult[tuple[Transfer, ...]]
    async_makespan_s: float = 0.0
    tensor_sizes: dict[tuple[int, int], int] = field(default_factory=dict)  # (dst, layer) -> bytes needed

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)

    def to_json(self) -> dict[str, Any]:
        """The `migration` object of the CLI contract."""
        return {"transfers": [t.to_json() for t in self.transfers], "rounds": self.rounds,
                "makespan_s": self.makespan_s, "lower_bound_s": self.lower_bound_s}
