"""Micro-batch allocation across uneven pipelines: integers summing to the global count that
minimise the slowest pipeline, where pipeline j with m micro-batches takes fill_j + (m-1) x per_mb_j
(the 1F1B surrogate, exact for uniform stages: Eq. 9).

Two solvers: an exact greedy (water-filling: min-max of nondecreasing separable costs under a sum
constraint is solved optimally by always giving the next micro-batch to the pipeline whose time
after taking it is smallest), and a CP-SAT model of the same problem (integer-scaled).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence

from chameleon_opt.solve.backends import SolverOptions, solve_cpsat
from chameleon_opt.solve.result import SolveResult, Status

TIME_SCALE = 1e6
"""CP-SAT takes integers: times are scaled to microseconds and rounded up (a safe over-estimate)."""


def pipeline_time(fill_s: float, per_mb_s: float, micro_batches: int) -> float:
    return fill_s + (micro_batches - 1) * per_mb_s if micro_batches > 0 else 0.0


def allocate_greedy(fill_s: Sequence[float], per_mb_s: Sequence[float], total: int,
                    caps: Sequence[int | None] | None = None) -> SolveResult[tuple[int, ...]]:
    """Exact water-filling: every pipeline gets one micro-batch, then each next one goes to the
    pipeline that would finish earliest after taking it (ties to the lower index), never beyond its
    cap (if any)."""
    start = time.perf_counter()
    count = len(fill_s)
    limits = [c if c is not None else total for c in (caps or [None] * count)]
    if count == 0 or total < count or sum(limits) < total:
        return SolveResult(Status.INFEASIBLE, None, None, None, time.perf_counter() - start, "greedy",
                           reason=f"{total} micro-batches cannot give each of {count} pipelines at least one "
                                  "within their caps")
    # Identical pipelines (same fill, step and cap) form a class and take micro-batches a round at a
    # time, members in index order: one heap entry per class and level instead of one per
    # micro-batch (16,384 micro-batches over 1,023 identical pipelines: 16 rounds, not 16,384 pops).
    classes: dict[tuple[float, float, int], list[int]] = {}
    for j in range(count):
        classes.setdefault((fill_s[j], per_mb_s[j], limits[j]), []).append(j)
    shares = [1] * count
    heap = [(pipeline_time(fill, per, 2), members[0], 1, members) for (fill, per, cap), members in classes.items()
            if cap > 1]
    heapq.heapify(heap)
    left = total - count
    while left > 0:
        _, first, level, members = heapq.heappop(heap)
        take = min(len(members), left)
        for j in members[:take]:
            shares[j] += 1
        left -= take
        if level + 1 < limits[first]:
            heapq.heappush(heap, (pipeline_time(fill_s[first], per_mb_s[first], level + 2), first, level + 1, members))
    value = max(pipeline_time(f, p, m) for f, p, m in zip(fill_s, per_mb_s, shares))
    return SolveResult(Status.OPTIMAL, tuple(shares), value, value, time.perf_counter() - start, "greedy")


def allocate_cpsat(fill_s: Sequence[float], per_mb_s: Sequence[float], total: int, time_limit_s: float = 5.0,
                   threads: int = 1, seed: int = 0) -> SolveResult[tuple[int, ...]]:
    """CP-SAT: minimise T subject to T >= fill_j + (m_j - 1) per_mb_j, sum m_j = total, m_j >= 1."""
    build_start = time.perf_counter()
    from ortools.sat.python import cp_model  # here: 0.3 s to import, and the greedy path needs none

    model = cp_model.CpModel()
    count = len(fill_s)
    if count == 0 or total < count:
        return SolveResult(Status.INFEASIBLE, None, None, None, 0.0, "cpsat",
                           reason=f"{total} micro-batches cannot give each of {count} pipelines at least one")
    fill = [int(-(-f * TIME_SCALE // 1)) for f in fill_s]
    per = [int(-(-p * TIME_SCALE // 1)) for p in per_mb_s]
    shares = [model.new_int_var(1, total, f"m{j}") for j in range(count)]
    horizon = max(f + (total - 1) * p for f, p in zip(fill, per))
    makespan = model.new_int_var(0, horizon, "T")
    for j in range(count):
        model.add(makespan >= fill[j] + per[j] * (shares[j] - 1))
    model.add(sum(shares) == total)
    model.minimize(makespan)
    warm = allocate_greedy(fill_s, per_mb_s, total).solution
    for var, value in zip(shares, warm or ()):
        model.add_hint(var, value)
    build_s = time.perf_counter() - build_start
    solver, outcome = solve_cpsat(model, time_limit_s, SolverOptions("cpsat", threads, seed))
    if not outcome.has_solution or outcome.bound is None:
        return SolveResult(Status.NO_SOLUTION, None, None, None, outcome.wall_s, "cpsat", build_s, seed,
                           reason=f"CP-SAT returned {outcome.detail}")
    solution = tuple(int(solver.value(v)) for v in shares)
    value = max(pipeline_time(f, p, m) for f, p, m in zip(fill_s, per_mb_s, solution))
    # Rounding each coefficient up adds at most `total` microseconds to any pipeline's time, so the
    # scaled bound minus that slack is a valid lower bound on the true optimum.
    bound = max(outcome.bound - total, 0) / TIME_SCALE
    return SolveResult(outcome.status, solution, value, min(bound, value), outcome.wall_s, "cpsat", build_s, seed)
