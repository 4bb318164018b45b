"""The one entry the planner calls: slot assignment, migration schedule and all-reduce rounds.

One deadline for all of it: the assignment (an exact LSA, no limit) runs first, the migration LP
gets 3/4 of what is left, and the colouring the rest (it is often proven optimal by the clique
bound without any solve; DSATUR's colouring stands when no time is left).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from chameleon_opt.comm.allreduce import AllreduceSchedule, schedule_allreduce
from chameleon_opt.comm.assignment import assign_slots
from chameleon_opt.comm.migration import schedule_migration
from chameleon_opt.comm.transfers import Migration
from chameleon_opt.comm.rounds import check_release_safety
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.solve.backends import DEFAULT, SolverOptions
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.result import SolveResult


@dataclass(frozen=True)
class CommInfo:
    """Everything around the two contract keys: the re-mapped plan, the solves, the checks."""

    plan: Plan                              # the new plan after slot assignment (print this one)
    assignment: SolveResult[Plan] | None    # None when the plan was kept as given
    migration: Migration
    allreduce: AllreduceSchedule
    wall_s: float

    @property
    def stopped_early(self) -> bool:
        return self.migration.solve.stopped_early or self.allreduce.solve.stopped_early

    def to_json(self) -> dict[str, Any]:
        m = self.migration
        return {"assignment": self.assignment.to_json() if self.assignment else None,
                "migration_solve": m.solve.to_json(),
                "migration_rounds": m.rounds, "max_degree": m.max_degree,
                "makespan_s": m.makespan_s, "async_makespan_s": m.async_makespan_s,
                "fluid_makespan_s": m.fluid_makespan_s,
                "lower_bound_s": m.lower_bound_s, "bytes": m.total_bytes,
                "release_after_round": {str(d): r for d, r in sorted(m.release_after_round.items())},
                "allreduce": self.allreduce.to_json(), "wall_s": self.wall_s, "stopped_early": self.stopped_early}


def communication_plan(instance: Instance, old_plan: Plan, new_plan: Plan, failed: frozenset[int],
                       deadline: Deadline, options: SolverOptions = DEFAULT, *, assign: bool = True,
                       model: PerfModel | None = None, assigned: tuple[Plan, SolveResult[Plan]] | None = None,
                       abandon: Deadline | None = None) -> tuple[Migration, list[list[str]], CommInfo]:
    """(migration, allreduce_rounds, info) for moving from `old_plan` to `new_plan` after `failed`.

    `migration.to_json()` is the contract's `migration`, `allreduce_rounds` its `allreduce_rounds`;
    with `assign` the new plan's TP groups are re-mapped first and `info.plan` (== migration.plan)
    is the plan to report and run; `assigned` is that re-mapping when the caller already made it
    (`assign_slots`' answer). A rerouted plan (same layout) migrates nothing. `deadline` bounds the
    solves; a large migration that cannot be cut before `abandon` raises DeadlinePassed
    (`schedule_migration`).
    Raises UnrecoverableError when some needed shard has no surviving copy."""
    start = time.perf_counter()
    model = model or PerfModel(instance)
    plan, assignment = assigned if assigned is not None else \
        assign_slots(model, old_plan, new_plan, failed) if assign else (new_plan, None)
    migration = schedule_migration(model, old_plan, plan, failed, deadline.share(0.75), options,
                                   abandon=abandon)
    problems = check_release_safety(old_plan, plan, failed, migration)
    if problems:
        raise AssertionError("unsafe migration schedule (a bug): " + "; ".join(problems[:5]))
    allreduce = schedule_allreduce(model, plan, failed, deadline, options)
    info = CommInfo(plan, assignment, migration, allreduce, time.perf_counter() - start)
    return migration, allreduce.rounds, info
