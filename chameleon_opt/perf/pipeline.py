"""Pipeline schedule times: the paper's Eq. 9 (uniform 1F1B), Eq. 11 (longest path of the 1F1B
operation graph for non-uniform stages) and Eq. 12/13 (rerouting, closed form)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


def uniform_1f1b_time(stages: int, micro_batches: float, forward_s: float, backward_s: float) -> float:
    """Eq. 9: T = (N_pp + N_m - 1)(t_f + t_b) for identical stages and free communication."""
    return (stages + micro_batches - 1) * (forward_s + backward_s)


def one_f_one_b_order(stage: int, stages: int, micro_batches: int) -> list[tuple[bool, int]]:
    """Operation order of one stage under non-interleaved 1F1B: (is_forward, micro_batch).

    Stage s runs N_pp - s - 1 warm-up forwards, then alternates one forward and one backward, then
    drains the remaining backwards; it thus keeps at most N_pp - s forwards in flight."""
    warmup = min(stages - stage - 1, micro_batches)
    order = [(True, m) for m in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [(True, warmup + i), (False, i)]
    order += [(False, m) for m in range(micro_batches - warmup, micro_batches)]
    return order


@dataclass(frozen=True)
class OneFOneBSchedule:
    """Start and end time of every operation of one pipeline, indexed [stage, micro_batch]."""

    forward_start: np.ndarray
    forward_end: np.ndarray
    backward_start: np.ndarray
    backward_end: np.ndarray

    @property
    def makespan_s(self) -> float:
        """When the first stage's last backward ends (Eq. 11's longest path)."""
        return float(np.max(self.backward_end[0])) if self.backward_end.size else 0.0


def _one_f_one_b_ends(forward_s: Sequence[float], backward_s: Sequence[float],
                      micro_batches: int) -> tuple[list[list[float]], list[list[float]]]:
    """End times of every forward and backward, [stage][micro_batch], on Eq. 11's longest paths.

    An operation starts when the previous operation of its stage (in 1F1B order) has ended, and
    - a forward, when the forward of the same micro-batch on the previous stage has ended;
    - a backward, when the backward of the same micro-batch on the next stage has ended.
    Each stage runs its order until it waits on a neighbour, round after round. Python lists with
    -1 for "not yet ended" (times are never negative) and each stage's state in locals: numpy's
    per-element access was 4x slower, and the model prices pipelines of 16 stages x 2,000
    micro-batches (64,000 operations) inside the search."""
    stages = len(forward_s)
    if min(forward_s, default=0.0) < 0 or min(backward_s, default=0.0) < 0:
        raise ValueError("stage times must be non-negative")
    f_end = [[-1.0] * micro_batches for _ in range(stages)]
    b_end = [[-1.0] * micro_batches for _ in range(stages)]
    orders = [one_f_one_b_order(s, stages, micro_batches) for s in range(stages)]
    position = [0] * stages
    clock = [0.0] * stages
    remaining = 2 * stages * micro_batches
    last = stages - 1
    while remaining:
        progressed = False
        for s in range(stages):
            order, at, now = orders[s], position[s], clock[s]
            own_forward, own_backward = f_end[s], b_end[s]
            upstream = f_end[s - 1] if s else own_forward       # read only when s > 0
            downstream = b_end[s + 1] if s < last else own_forward  # the last stage waits on its own forward
            while at < len(order):
                forward, m = order[at]
                if forward:
                    ready = upstream[m] if s else 0.0
                    if ready < 0:
                        break
                    now = (now if now > ready else ready) + forward_s[s]
                    own_forward[m] = now
                else:
                    ready = downstream[m]
                    if ready < 0:
                        break
                    now = (now if now > ready else ready) + backward_s[s]
                    own_backward[m] = now
                at += 1
            if at != position[s]:
                remaining -= at - position[s]
                position[s], clock[s] = at, now
                progressed = True
        if not progressed:  # impossible for a valid 1F1B order; guards against an infinite loop
            raise RuntimeError("1F1B dependency cycle")
    return f_end, b_end


def one_f_one_b_schedule(forward_s: Sequence[float], backward_s: Sequence[float],
                         micro_batches: int) -> OneFOneBSchedule:
    """Eq. 11: every operation's start and end on the longest paths of the 1F1B operation graph
    (`_one_f_one_b_ends`; a start is its end less its duration, within one rounding). Durations may
    include blocking sends (the performance model adds them). Exact for any stage times; equals
    Eq. 9 when stages are identical."""
    stages, micro_batches = len(forward_s), max(micro_batches, 0)
    f_end, b_end = (np.array(t, dtype=float).reshape(stages, micro_batches)
                    for t in _one_f_one_b_ends(forward_s, backward_s, micro_batches))
    f_start = f_end - np.asarray(forward_s, dtype=float).reshape(stages, 1)
    b_start = b_end - np.asarray(backward_s, dtype=float).reshape(stages, 1)
    return OneFOneBSchedule(f_start, f_end, b_start, b_end)


def one_f_one_b_time(forward_s: Sequence[float], backward_s: Sequence[float], micro_batches: int) -> float:
    """Eq. 11: the makespan, when the first stage's last backward ends (0 without micro-batches).
    Memoised on the stage times (`_makespan`): the search prices the same pipelines again and again
    (32-64 seed 9180 at 2 s: 3,198 calls, 513 distinct)."""
    if micro_batches <= 0 or len(forward_s) == 0:
        return 0.0
    return _makespan(tuple(map(float, forward_s)), tuple(map(float, backward_s)), micro_batches)


@lru_cache(maxsize=1 << 16)
def _makespan(forward_s: tuple[float, ...], backward_s: tuple[float, ...], micro_batches: int) -> float:
    """`one_f_one_b_time` on Python floats (the same IEEE doubles as numpy's: values are unchanged)."""
    return max(_one_f_one_b_ends(forward_s, backward_s, micro_batches)[1][0])


@lru_cache(maxsize=256)
def _dependency_order(p: int, m: int) -> tuple[tuple[bool, int, int], ...]:
    """The 1F1B operations of p stages and m micro-batches in an order that respects every dependency."""
    orders = [one_f_one_b_order(s, p, m) for s in range(p)]
    done: set[tuple[bool, int, int]] = set()
    at, seq = [0] * p, []
    while any(at[s] < len(orders[s]) for s in range(p)):
        for s in range(p):
            while at[s] < len(orders[s]):
                forward, i = orders[s][at[s]]
                need = ((True, s - 1, i) if s else None) if forward else \
                    ((False, s + 1, i) if s < p - 1 else (True, s, i))
                if need is not None and need not in done:
                    break
                seq.append((forward, s, i))
                done.add((forward, s, i))
                at[s] += 1
    return tuple(seq)


def makespans(f: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """The 1F1B makespan (`one_f_one_b_time`'s recurrence, no sends) of every row of stage operation times
    (N, p) at once: the search over layer counts (solve/blocks.py) and its independent enumeration
    (bench/blocks_optimum.py) price thousands of count vectors per call."""
    n, p = f.shape
    fe, be, clock = np.zeros((p, m, n)), np.zeros((p, m, n)), np.zeros((p, n))
    for forward, s, i in _dependency_order(p, m):
        if forward:
            clock[s] = (np.maximum(clock[s], fe[s - 1, i]) if s else clock[s]) + f[:, s]
            fe[s, i] = clock[s]
        else:
            clock[s] = np.maximum(clock[s], be[s + 1, i] if s < p - 1 else fe[s, i]) + b[:, s]
            be[s, i] = clock[s]
    return be[0].max(axis=0)


def one_f_one_b_floors(forward_s: np.ndarray, backward_s: np.ndarray, micro_batches: np.ndarray) -> np.ndarray:
    """floors[c, i]: a lower bound on `one_f_one_b_time(forward_s[c], backward_s[c], micro_batches[i])`
    for many candidates at once (rows of per-stage operation times, sends included). Per stage s,
    with k_s = S - s - 1 warm-up forwards, W = the sum of every f + b, E_s = the sum of f + b over the
    stages before s and R_s over those after, the largest over s of three lengths of 1F1B paths:
    - micro-batch 0 down to the last stage and back up to s, then s's m - 1 later backwards and the
      forwards it runs after B_0, then B_{m-1} up to stage 0: W + (m - 1) b_s + max(m - 1 - k_s, 0) f_s;
    - s busy: micro-batch 0 reaches s after the forwards before it, s runs all its m forwards and m
      backwards one after another, then B_{m-1} goes up through the stages before it: E_s + m (f_s + b_s)
      (it beats the first when the k_s warm-up forwards outlast the work after s: a slow first stage);
    - the round trip (c_s = m - 1 - k_s >= 1): micro-batch 0 down and back up to s, s's c_s steady pairs
      B_0, F_{k_s + 1}, ..., F_{m-1}, then F_{m-1} down and B_{m-1} all the way up: W + R_s + c_s (f_s + b_s).
    Each is a chain of operations that follow each other on a stage or hand data on, so the makespan
    is at least its length (solve/bounds.py proves the first and the third per stage). The factors that
    depend only on the counts and the stage count are built once per pair (`_floor_factors`): the exact
    branch and bound calls this thousands of times on a few candidates each."""
    forward_s, backward_s = np.asarray(forward_s, dtype=float), np.asarray(backward_s, dtype=float)
    m, later, lead, steady, trips = _floor_factors(forward_s.shape[1], tuple(np.asarray(micro_batches).tolist()))
    work = forward_s + backward_s  # (candidates, stages)
    whole = work.sum(axis=1)[:, None, None]
    before = (np.cumsum(work, axis=1) - work)[:, None, :]
    after = whole - before - work[:, None, :]
    work = work[:, None, :]
    path = whole + later * backward_s[:, None, :] + lead * forward_s[:, None, :]
    busy = before + m * work
    trip = np.where(trips, whole + after + steady * work, 0.0)
    return np.maximum(np.maximum(path, busy), trip).max(axis=2)


@lru_cache(maxsize=256)
def _floor_factors(stages: int, counts: tuple[float, ...]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`one_f_one_b_floors`' factors, each (1, counts, stages) or broadcastable: m, m - 1, max(c_s, 0),
    c_s = m - 1 - k_s and whether c_s >= 1 (read-only: shared between calls)."""
    m = np.asarray(counts, dtype=float)[None, :, None]
    warmup = np.arange(stages - 1, -1, -1)[None, None, :]
    steady = m - 1 - warmup
    factors = (m, m - 1, np.maximum(steady, 0), steady, steady >= 1)
    for factor in factors:
        factor.flags.writeable = False
    return factors


def reroute_eq12_time(stages: int, micro_batches: float, failed_per_stage: Sequence[int], data_parallel: int,
                      forward_s: float, backward_s: float) -> float:
    """Eq. 12/13: T = (N_pp + N_m - 1 + sum_i N_m F_i / (N_dp - F_i)) (t_f + t_b).

    Each healthy peer of stage i takes an even share of the F_i failed replicas' micro-batches.
    Infinite when some stage lost every replica (F_i = N_dp): rerouting is then infeasible."""
    extra = 0.0
    for failed in failed_per_stage:
        if failed >= data_parallel:
            return float("inf")
        extra += micro_batches * failed / (data_parallel - failed)
    return (stages + micro_batches - 1 + extra) * (forward_s + backward_s)
