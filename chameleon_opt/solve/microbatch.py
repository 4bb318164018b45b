"""Micro-batch allocation across uneven pipelines: integers summing to the global count that
minimise the slowest pipeline, where pipeline j with m micro-batches takes fill_j + (m-1) x per_mb_j
(the 1F1B surrogate, exact for uniform stages: Eq. 9).

Solved exactly by water-filling: min-max of nondecreasing separable costs under a sum constraint
is solved optimally by always giving the next micro-batch to the pipeline whose time after taking
it is smallest (tests/test_search.py checks it against a brute force).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence

from chameleon_opt.solve.result import SolveResult, Status


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
