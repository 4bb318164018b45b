"""Layer allocation: split layers 0..n-1 over the S stages of ONE pipeline into contiguous,
non-empty, in-order ranges, minimising the 1F1B step time under per-stage memory caps.

Stage s owns [b_s, b_{s+1}) with 0 = b_0 < b_1 < ... < b_S = n. Its per-micro-batch time is
t_s = sum of time_s[s, l] over its layers + overhead_s[s]; its memory is
sum static + in_flight[s] x sum activation + transient[s] <= capacity[s]. The objective is the
linear surrogate of the 1F1B step time (exact for identical stages, Eq. 9):

    minimise  sum_s t_s + (M - 1) x max_s t_s.

Three solvers of the same problem, one result type (`SolveResult`):
- `solve_layers_exact` ("dp"): branch and bound over the bottleneck B (the largest stage time),
  each node a vectorised O(S n^2) DP for the least sum of stage times with every t_s <= B. Exact,
  fast (a few dozen DPs), and the warm start, the fallback and the test oracle of the models.
- `solve_layers_milp` ("highs" / "cbc"): PuLP model over cumulative binaries
  z[s, l] = 1 iff layer l sits on a stage <= s. Its monotonicity rows are difference constraints
  (totally unimodular), so without memory rows and the max term the LP relaxation is integral.
- `solve_layers_cpsat` ("cpsat"): the same formulation with integer-scaled coefficients.
`solve_layers` is the dispatcher: DP warm start, then the chosen model, falling back to the DP.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import highspy
import numpy as np
import pulp
from ortools.sat.python import cp_model

from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.solve.backends import cpsat_solver
from chameleon_opt.solve.result import SolveResult, Status

Boundaries = tuple[int, ...]

MIP_REL_GAP = 1e-9
"""HiGHS and CBC stop at 1e-4 relative gap by default; 'optimal' here means within 1e-9."""
MIP_ABS_GAP = 1e-12
MEMORY_RTOL = 1e-9
"""Float memory checks accept sums within this relative margin of the cap (prefix-sum rounding)."""
CPSAT_OBJECTIVE_UNITS = 2 ** 32
"""CP-SAT works in integers: seconds are scaled so that an upper bound on the objective is about
this many units (each coefficient rounds by <= 0.5 unit; the chosen split is re-evaluated in
floats). Not more: on random instances scaled to 2^38-2^44 units CP-SAT 9.15 reported OPTIMAL for
splits 0.5-37% worse than the DP's (precision loss in its LP); 2^32-2^36 gave no such case in 266."""
CPSAT_MEMORY_UNITS = 2 ** 32
"""Bytes are counted in units of 2^k bytes with the largest capacity <= this many units (1 byte up
to 4 GiB, 32 bytes for 80 GiB: magnitudes kept as small as the objective's); per-layer bytes
round up, capacities down, so a split CP-SAT accepts always fits."""
WARM_START_FRACTION = 0.25
"""Share of the dispatcher's time limit the exact DP may take before the model starts."""
FALLBACK_LIMIT_S = 1.0
"""Budget of the DP run as a fallback after a model found nothing (its first DP already gives a
feasible split; the rest only improves it)."""


# -- the problem ----------------------------------------------------------------------------------
_ARRAYS = ("time_s", "static_bytes", "activation_bytes", "in_flight", "overhead_s", "transient_bytes",
           "capacity_bytes")


@dataclass(frozen=True, eq=False)  # eq=False: numpy fields make == ambiguous
class LayerProblem:
    """Per-stage, per-layer coefficients of one pipeline's layer split (rows = stages: stages may
    run on different device types, so a layer's time and bytes depend on where it goes)."""

    time_s: np.ndarray            # [S, n] forward + backward of layer l on stage s, one micro-batch
    static_bytes: np.ndarray      # [S, n] parameters, gradients, optimizer state
    activation_bytes: np.ndarray  # [S, n] per in-flight micro-batch
    in_flight: np.ndarray         # [S]    micro-batches in flight under 1F1B: min(S - s, M)
    overhead_s: np.ndarray        # [S]    per-micro-batch constant (blocking p2p sends)
    transient_bytes: np.ndarray   # [S]
    capacity_bytes: np.ndarray    # [S]
    micro_batches: int            # M

    def __post_init__(self) -> None:
        for name in _ARRAYS:
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=float))
            if not np.isfinite(getattr(self, name)).all():
                raise ValueError(f"{name} has a NaN or infinite entry")
        if self.time_s.ndim != 2 or min(self.time_s.shape) < 1 or self.micro_batches < 1:
            raise ValueError("need time_s of shape [S, n] with S, n >= 1, and micro_batches >= 1")
        for name in _ARRAYS:
            per_layer = name in ("time_s", "static_bytes", "activation_bytes")
            expected = self.time_s.shape if per_layer else self.time_s.shape[:1]
            if getattr(self, name).shape != expected:
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected {expected}")

    @property
    def stages(self) -> int:
        return int(self.time_s.shape[0])

    @property
    def layers(self) -> int:
        return int(self.time_s.shape[1])

    def stage_time(self, s: int, first: int, end: int) -> float:
        return float(self.time_s[s, first:end].sum() + self.overhead_s[s])

    def stage_memory(self, s: int, first: int, end: int) -> float:
        return float(self.static_bytes[s, first:end].sum()
                     + self.in_flight[s] * self.activation_bytes[s, first:end].sum() + self.transient_bytes[s])

    def stage_times(self, boundaries: Sequence[int]) -> list[float]:
        return [self.stage_time(s, boundaries[s], boundaries[s + 1]) for s in range(self.stages)]

    def objective(self, boundaries: Sequence[int]) -> float:
        """sum_s t_s + (M - 1) max_s t_s, in floating point: every backend reports this value."""
        times = self.stage_times(boundaries)
        return float(sum(times) + (self.micro_batches - 1) * max(times))

    def is_split(self, boundaries: Sequence[int]) -> bool:
        b = list(boundaries)
        return len(b) == self.stages + 1 and b[0] == 0 and b[-1] == self.layers and all(
            x < y for x, y in zip(b, b[1:]))

    def fits(self, boundaries: Sequence[int], rtol: float = MEMORY_RTOL) -> bool:
        """A valid split whose every stage is within its memory cap."""
        return self.is_split(boundaries) and all(
            self.stage_memory(s, boundaries[s], boundaries[s + 1]) <= self.capacity_bytes[s] * (1 + rtol)
            for s in range(self.stages))

    @classmethod
    def from_model(cls, model: PerfModel, stage_devices: list[tuple[int, ...]], micro_batches: int,
                   replicas: int = 1) -> LayerProblem:
        """Coefficients from the performance model. The p2p overhead of a stage is its blocking
        sends per micro-batch (forward to s+1, backward to s-1), sized as a transformer block's
        output (layer n-2): every inner boundary carries that tensor, whatever the split."""
        costs = [model.layer_costs(devices, replicas) for devices in stage_devices]
        stages = len(stage_devices)
        layers = len(costs[0].time_s)
        representative = max(layers - 2, 0)
        overhead = []
        for s, devices in enumerate(stage_devices):
            send = 0.0
            if s + 1 < stages:
                send += model.boundary_send_time(devices, stage_devices[s + 1], representative)
            if s > 0:
                send += model.boundary_send_time(devices, stage_devices[s - 1], representative)
            overhead.append(send)
        return cls(
            time_s=np.array([c.time_s for c in costs]),
            static_bytes=np.array([c.static_bytes for c in costs]),
            activation_bytes=np.array([c.activation_bytes for c in costs]),
            in_flight=np.array([min(stages - s, micro_batches) for s in range(stages)]),
            overhead_s=np.array(overhead),
            transient_bytes=np.array([c.transient_bytes for c in costs]),
            capacity_bytes=np.array([c.capacity_bytes for c in costs]),
            micro_batches=micro_batches,
        )


def boundaries_to_ranges(boundaries: Sequence[int]) -> list[tuple[int, int]]:
    """(first, end) of every stage: stage s owns [b_s, b_{s+1})."""
    return [(int(a), int(b)) for a, b in zip(boundaries, boundaries[1:])]


def balanced_boundaries(layers: int, stages: int) -> Boundaries:
    """Layer counts as even as possible, the extra layers on the last stages (fewest in flight)."""
    base, extra = divmod(layers, stages)
    bounds = [0]
    for s in range(stages):
        bounds.append(bounds[-1] + base + (1 if s >= stages - extra else 0))
    return tuple(bounds)


def infeasibility_reason(problem: LayerProblem) -> str | None:
    """Why no split exists (None when one does): too many stages, a stage that cannot hold even
    its smallest possible range, or caps that together cannot hold every layer."""
    S, n = problem.stages, problem.layers
    if S > n:
        return f"{S} stages for {n} layers: every stage needs at least one layer"
    caps = problem.capacity_bytes
    for s in range(S):
        # Stage s can own only layers s..n-S+s; its cheapest range is one of them alone.
        options = [(problem.stage_memory(s, i, i + 1), i) for i in range(s, n - S + s + 1)]
        need, layer = min(options)
        if need > caps[s] * (1 + MEMORY_RTOL):
            return (f"stage {s} needs at least {need / GIB:.3f} GiB for its smallest feasible range "
                    f"(layer {layer} alone) > {caps[s] / GIB:.3f} GiB capacity")
    if _dp(_range_table(problem), math.inf) is not None:
        return None
    # Furthest layer the stages can cover in order within their caps (ignoring the end).
    fits = _range_memory(problem) <= caps[:, None, None] * (1 + MEMORY_RTOL)
    reach = np.zeros(n + 1, dtype=bool)
    reach[0] = True
    for s in range(S):
        nxt = np.zeros(n + 1, dtype=bool)
        for i in np.flatnonzero(reach):
            nxt[i + 1:] |= fits[s, i, i + 1:]
        reach = nxt
    covered = int(np.flatnonzero(reach).max()) if reach.any() else 0
    state = float(problem.static_bytes.min(axis=0).sum())
    return (f"no split of {n} layers over {S} stages fits in memory: within their caps "
            f"({', '.join(f'{c / GIB:.2f}' for c in caps)} GiB) the stages hold at most the first {covered} "
            f"layers in order (model state alone >= {state / GIB:.2f} GiB of {caps.sum() / GIB:.2f} GiB in all)")


# -- exact algorithm ------------------------------------------------------------------------------
def _range_memory(problem: LayerProblem) -> np.ndarray:
    """[S, n+1, n+1]: bytes stage s needs to own [i, j) (prefix sums; meaningful for i < j)."""
    zero = np.zeros((problem.stages, 1))
    static = np.hstack([zero, np.cumsum(problem.static_bytes, axis=1)])
    act = np.hstack([zero, np.cumsum(problem.activation_bytes, axis=1)])
    return (static[:, None, :] - static[:, :, None]
            + problem.in_flight[:, None, None] * (act[:, None, :] - act[:, :, None])
            + problem.transient_bytes[:, None, None])


def _range_table(problem: LayerProblem) -> np.ndarray:
    """[S, n+1, n+1]: time of stage s owning [i, j), inf where it may not (empty or reversed
    range, too close to either end for the other stages to get a layer each, over memory)."""
    S, n = problem.stages, problem.layers
    prefix = np.hstack([np.zeros((S, 1)), np.cumsum(problem.time_s, axis=1)])
    times = prefix[:, None, :] - prefix[:, :, None] + problem.overhead_s[:, None, None]
    first = np.arange(n + 1)[None, :, None]
    end = np.arange(n + 1)[None, None, :]
    stage = np.arange(S)[:, None, None]
    allowed = ((end > first) & (first >= stage) & (end <= n - (S - 1 - stage))
               & (_range_memory(problem) <= problem.capacity_bytes[:, None, None] * (1 + MEMORY_RTOL)))
    return np.where(allowed, times, np.inf)


def _dp(table: np.ndarray, bottleneck: float) -> tuple[float, float, Boundaries] | None:
    """Least sum of stage times with every stage time <= bottleneck: (sum, max, boundaries)."""
    S, size = table.shape[0], table.shape[1]
    cost = table if math.isinf(bottleneck) else np.where(table <= bottleneck, table, np.inf)
    best = np.full(size, np.inf)
    best[0] = 0.0
    choice = np.empty((S, size), dtype=np.intp)
    columns = np.arange(size)
    for s in range(S):
        total = best[:, None] + cost[s]
        choice[s] = total.argmin(axis=0)
        best = total[choice[s], columns]
    if not math.isfinite(best[-1]):
        return None
    bounds = [size - 1]
    for s in range(S - 1, -1, -1):
        bounds.append(int(choice[s, bounds[-1]]))
    bounds.reverse()
    top = max(float(table[s, bounds[s], bounds[s + 1]]) for s in range(S))
    return float(best[-1]), top, tuple(bounds)


def solve_layers_exact(problem: LayerProblem, time_limit_s: float | None = None) -> SolveResult[Boundaries]:
    """Branch and bound over the bottleneck B, exact for sum_s t_s + (M-1) max_s t_s.

    f(B) = least sum of stage times with all t_s <= B (a DP) is non-increasing in B, so over the
    sorted achievable stage times B_a < ... < B_b the objective is >= f(B_b) + (M-1) B_a: an open
    interval whose bound cannot beat the incumbent is dropped, others are bisected. A DP at B whose
    split peaks at B' <= B settles every candidate in [B', B] at once (f is constant there).
    Candidates above the unconstrained optimum's peak cannot help. Stops early at `time_limit_s`
    with the incumbent and the least interval bound (FEASIBLE)."""
    start = time.perf_counter()
    table = _range_table(problem)
    unconstrained = _dp(table, math.inf)
    if unconstrained is None:
        return SolveResult(Status.INFEASIBLE, None, None, None, time.perf_counter() - start, "dp",
                           reason=infeasibility_reason(problem) or "no split fits in memory")
    slope = problem.micro_batches - 1
    total, top, incumbent = unconstrained
    best = total + slope * top
    candidates = np.unique(table[np.isfinite(table)])
    candidates = candidates[candidates <= top]
    open_intervals = [(-1, len(candidates) - 1, total)]  # (a, b, f(B_b)): candidates strictly between
    deadline = math.inf if time_limit_s is None else start + time_limit_s
    dps = 1
    while open_intervals and slope > 0 and time.perf_counter() < deadline:
        a, b, f_b = open_intervals.pop()
        if b - a <= 1 or f_b + slope * candidates[a + 1] >= best * (1 - 1e-12):
            continue
        mid = (a + b) // 2
        found = _dp(table, float(candidates[mid]))
        dps += 1
        open_intervals.append((mid, b, f_b))
        if found is None:  # nothing fits under candidates[mid], nor under anything smaller
            continue
        f_mid, peak, split = found
        if f_mid + slope * peak < best:
            best, incumbent = f_mid + slope * peak, split
        open_intervals.append((a, int(np.searchsorted(candidates, peak)), f_mid))
    wall = time.perf_counter() - start
    objective = problem.objective(incumbent)
    remaining = [f_b + slope * candidates[a + 1] for a, b, f_b in open_intervals if b - a > 1]
    bound = min([best, *remaining])
    if bound >= best * (1 - 1e-12):
        return SolveResult(Status.OPTIMAL, incumbent, objective, objective, wall, "dp")
    return SolveResult(Status.FEASIBLE, incumbent, objective, min(float(bound), objective), wall, "dp",
                       reason=f"time limit after {dps} bottleneck DPs")


def _fallback(problem: LayerProblem, heuristic: SolveResult[Boundaries] | None, backend: str, wall: float,
              build_s: float, seed: int | None, why: str) -> SolveResult[Boundaries]:
    """The model found nothing: return the DP's split, labelled HEURISTIC, never disguised."""
    start = time.perf_counter()
    heuristic = heuristic or solve_layers_exact(problem, FALLBACK_LIMIT_S)
    wall += time.perf_counter() - start
    if heuristic.status == Status.INFEASIBLE:
        return replace(heuristic, backend=backend, wall_s=wall, build_s=build_s, seed=seed)
    if not heuristic.status.has_solution:
        return SolveResult(Status.NO_SOLUTION, None, None, None, wall, backend, build_s, seed, why)
    return SolveResult(Status.HEURISTIC, heuristic.solution, heuristic.objective, heuristic.bound, wall, backend,
                       build_s, seed, f"{why}; split from the exact DP ({heuristic.status.value})")


def _trivially_infeasible(problem: LayerProblem, backend: str, seed: int | None) -> SolveResult[Boundaries] | None:
    if problem.stages > problem.layers:
        return SolveResult(Status.INFEASIBLE, None, None, None, 0.0, backend, seed=seed,
                           reason=infeasibility_reason(problem) or "")
    return None


# -- MILP (PuLP: HiGHS or CBC) --------------------------------------------------------------------
def _cumulative_fixings(problem: LayerProblem) -> list[list[int | None]]:
    """z[s][l] forced by position: 1 when l <= s (earlier stages hold >= 1 layer each, so layer l
    sits on stage <= l), 0 when l >= n - (S-1-s) (later stages need a layer each); else free."""
    S, n = problem.stages, problem.layers
    return [[1 if (l <= s or s == S - 1) else 0 if l >= n - (S - 1 - s) else None for l in range(n)]
            for s in range(S)]


def build_layers_milp(problem: LayerProblem) -> tuple[pulp.LpProblem, list[list[Any]], pulp.LpVariable]:
    """z[s][l] = 1 iff layer l is on a stage <= s (b_{s+1} = sum_l z[s][l]).

        z[s][l] <= z[s][l-1]              a stage's layers come in order
        z[s-1][l-1] <= z[s][l]            every stage is non-empty (and z grows with s)
        x[s][l] = z[s][l] - z[s-1][l]     layer l is on stage s
        t_s = overhead_s + sum_l time[s,l] x[s][l] <= T
        sum_l (static + in_flight x activation)[s,l] x[s][l] / cap_s <= 1 - transient_s / cap_s
        minimise sum_s t_s + (M-1) T
    Memory rows are normalised by the capacity so HiGHS's tolerances are relative to it."""
    S, n = problem.stages, problem.layers
    prob = pulp.LpProblem("layer_allocation", pulp.LpMinimize)
    z: list[list[Any]] = [[fixed if fixed is not None else prob.add_variable(f"z_{s}_{l}", 0, 1, pulp.LpBinary)
                           for l, fixed in enumerate(row)] for s, row in enumerate(_cumulative_fixings(problem))]
    peak = prob.add_variable("T", 0)
    for s in range(S):
        for l in range(1, n):
            if not isinstance(z[s][l], int) or not isinstance(z[s][l - 1], int):
                prob += z[s][l] <= z[s][l - 1], f"order_{s}_{l}"
            if s > 0 and (not isinstance(z[s - 1][l - 1], int) or not isinstance(z[s][l], int)):
                prob += z[s - 1][l - 1] <= z[s][l], f"nonempty_{s}_{l}"
    stage_times = []
    for s in range(S):
        x = [z[s][l] - (z[s - 1][l] if s > 0 else 0) for l in range(n)]
        t = pulp.lpSum(float(problem.time_s[s, l]) * x[l] for l in range(n)) + float(problem.overhead_s[s])
        stage_times.append(t)
        prob += t <= peak, f"peak_{s}"
        cap = max(float(problem.capacity_bytes[s]), 1.0)
        per_layer = (problem.static_bytes[s] + problem.in_flight[s] * problem.activation_bytes[s]) / cap
        prob += (pulp.lpSum(float(per_layer[l]) * x[l] for l in range(n))
                 <= float(problem.capacity_bytes[s] - problem.transient_bytes[s]) / cap), f"memory_{s}"
    prob += pulp.lpSum(stage_times) + (problem.micro_batches - 1) * peak
    return prob, z, peak


def _milp_boundaries(problem: LayerProblem, z: list[list[Any]], value: Any) -> Boundaries | None:
    """Boundaries read from z values (`value(var)`), None when they do not form a split."""
    bounds = [0]
    for s in range(problem.stages - 1):
        bounds.append(sum(int(round(value(v))) if not isinstance(v, int) else v for v in z[s]))
    bounds.append(problem.layers)
    return tuple(bounds) if problem.is_split(bounds) else None


def _milp_warm_values(problem: LayerProblem, z: list[list[Any]], peak: pulp.LpVariable,
                      warm_start: Sequence[int]) -> dict[str, float]:
    values = {peak.name: max(problem.stage_times(warm_start))}
    for s, row in enumerate(z):
        for l, var in enumerate(row):
            if not isinstance(var, int):
                values[var.name] = 1.0 if l < warm_start[s + 1] else 0.0
    return values


def solve_layers_milp(problem: LayerProblem, time_limit_s: float = 10.0, backend: str = "highs", threads: int = 1,
                      warm_start: Sequence[int] | None = None, seed: int = 0,
                      heuristic: SolveResult[Boundaries] | None = None) -> SolveResult[Boundaries]:
    """Solve `build_layers_milp` with HiGHS (via highspy, reading its own status and dual bound:
    PuLP maps a time limit to 'Optimal') or CBC (parsing its log for the result and lower bound).
    `heuristic` is returned, labelled HEURISTIC, when the solver finds nothing in time (the DP is
    run for it if not given)."""
    if backend not in ("highs", "cbc"):
        raise ValueError(f"unknown MILP backend {backend!r}: use 'highs' or 'cbc'")
    trivial = _trivially_infeasible(problem, backend, seed)
    if trivial:
        return trivial
    build_start = time.perf_counter()
    prob, z, peak = build_layers_milp(problem)
    warm = _milp_warm_values(problem, z, peak, warm_start) if warm_start and problem.is_split(warm_start) else None
    if backend == "highs":
        return _solve_highs(problem, prob, z, warm, time_limit_s, threads, seed, build_start, heuristic)
    return _solve_cbc(problem, prob, z, warm, time_limit_s, threads, seed, build_start, heuristic)


def _solve_highs(problem: LayerProblem, prob: pulp.LpProblem, z: list[list[Any]], warm: dict[str, float] | None,
                 time_limit_s: float, threads: int, seed: int, build_start: float,
                 heuristic: SolveResult[Boundaries] | None) -> SolveResult[Boundaries]:
    solver = pulp.HiGHS(msg=False, timeLimit=time_limit_s, threads=threads, gapRel=MIP_REL_GAP, gapAbs=MIP_ABS_GAP,
                        random_seed=seed)
    # PuLP's own solve() cannot pass a start to HiGHS: build through it, then drive highspy.
    solver.createAndConfigureSolver(prob)
    solver.buildSolverModel(prob)
    highs = prob.solverModel
    variables = prob.variables()
    if warm is not None:
        start_solution = highspy.HighsSolution()
        start_solution.col_value = [warm.get(v.name, 0.0) for v in variables]
        start_solution.value_valid = True
        highs.setSolution(start_solution)
    build_s = time.perf_counter() - build_start
    start = time.perf_counter()
    highs.run()
    wall = time.perf_counter() - start
    model_status = highs.getModelStatus()
    info = highs.getInfo()
    if model_status in (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible):
        return SolveResult(Status.INFEASIBLE, None, None, None, wall, "highs", build_s, seed,
                           infeasibility_reason(problem) or "HiGHS: infeasible (memory rows within tolerance)")
    split = None
    if info.primal_solution_status == 2:  # 2 = a feasible primal solution exists
        values = highs.getSolution().col_value
        index = {v.name: i for i, v in enumerate(variables)}
        split = _milp_boundaries(problem, z, lambda var: values[index[var.name]])
    status_text = highs.modelStatusToString(model_status)
    if split is None:
        return _fallback(problem, heuristic, "highs", wall, build_s, seed, f"HiGHS found no split ({status_text})")
    objective = problem.objective(split)
    # PuLP hands HiGHS the objective without its constant (fixed layers' times, overheads).
    dual = info.mip_dual_bound if prob.isMIP() else info.objective_function_value  # every z fixed: an LP
    bound = min(float(dual) + float(prob.objective.constant), objective)
    if model_status == highspy.HighsModelStatus.kOptimal:
        return SolveResult(Status.OPTIMAL, split, objective, bound, wall, "highs", build_s, seed)
    return SolveResult(Status.FEASIBLE, split, objective, bound, wall, "highs", build_s, seed,
                       f"HiGHS stopped: {status_text} (mip_gap {info.mip_gap:.3g})")


_CBC_RESULT = re.compile(r"^(?:Result - (.+)|(\w+(?: \w+)?) - objective value .*)$", re.MULTILINE)
_CBC_BOUND = re.compile(r"^Lower bound:\s+(\S+)", re.MULTILINE)
_CBC_INFEASIBLE = re.compile(r"proven infeasible|says infeasible|Problem is infeasible|^(?:Integer )?infeasible -",
                             re.MULTILINE | re.IGNORECASE)


def _solve_cbc(problem: LayerProblem, prob: pulp.LpProblem, z: list[list[Any]], warm: dict[str, float] | None,
               time_limit_s: float, threads: int, seed: int, build_start: float,
               heuristic: SolveResult[Boundaries] | None) -> SolveResult[Boundaries]:
    """Status from CBC's own words: the solution file's first word (PuLP's sol_status) and the log
    (result line, infeasibility proofs, 'Lower bound:'); never PuLP's summary status."""
    if warm is not None:
        for var in prob.variables():
            var.setInitialValue(warm.get(var.name, 0.0))
    with tempfile.TemporaryDirectory() as folder:
        log_path = os.path.join(folder, "cbc.log")
        # "preprocess off": CBC 2.10.3's integer preprocessing proved a split 12% worse than the
        # optimum "Optimal" on a random 8-stage instance (the DP's split was feasible in the model).
        # Without it CBC can crash (SIGSEGV) after proving infeasibility: the log still says so.
        with warnings.catch_warnings():  # the bundled CBC is deprecated for PuLP 4.0; it is what we have
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, threads=threads, gapRel=MIP_REL_GAP,
                                       gapAbs=MIP_ABS_GAP, warmStart=warm is not None, logPath=log_path,
                                       timeMode="elapsed", options=[f"randomCbcSeed {seed + 1}", "preprocess off"])
        solver.tmpDir = folder  # PuLP's model and solution files go (and are removed) with the log
        build_s = time.perf_counter() - build_start
        start = time.perf_counter()
        crashed = False
        try:
            prob.solve(solver)
        except pulp.PulpSolverError:
            crashed = True
        wall = time.perf_counter() - start
        with open(log_path) as handle:
            log = handle.read()
    result = _CBC_RESULT.search(log)
    result_text = next(g for g in result.groups() if g).strip() if result else "no result line"
    split = None
    if not crashed and prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        split = _milp_boundaries(problem, z, lambda var: var.value() or 0.0)
    if split is None and (_CBC_INFEASIBLE.search(log) or (not crashed and prob.status == pulp.LpStatusInfeasible)):
        return SolveResult(Status.INFEASIBLE, None, None, None, wall, "cbc", build_s, seed,
                           infeasibility_reason(problem) or f"CBC: {result_text}")
    if split is None:
        why = "CBC exited abnormally" if crashed else f"CBC found no split ({result_text})"
        return _fallback(problem, heuristic, "cbc", wall, build_s, seed, why)
    objective = problem.objective(split)
    if prob.sol_status == pulp.LpSolutionOptimal:  # the solution file says "Optimal": proven
        return SolveResult(Status.OPTIMAL, split, objective, objective, wall, "cbc", build_s, seed)
    found = _CBC_BOUND.search(log)
    bound = None
    if found:  # CBC's best possible objective when it stopped (without the objective's constant)
        try:
            bound = min(float(found.group(1)) + float(prob.objective.constant), objective)
        except ValueError:
            bound = None
    return SolveResult(Status.FEASIBLE, split, objective, bound, wall, "cbc", build_s, seed,
                       f"CBC: {result_text}" + ("" if bound is not None else "; no bound reported"))


# -- CP-SAT ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CpsatScale:
    """Integer units of the CP-SAT model: seconds x per_second, bytes / bytes_per_unit."""

    per_second: float
    bytes_per_unit: float
    rounding_units: float  # most the scaled objective of any split can differ from objective x per_second


def cpsat_scale(problem: LayerProblem) -> CpsatScale:
    """Times: per_second = 2^k, the largest with (S + M - 1) x (largest stage time possible) <=
    CPSAT_OBJECTIVE_UNITS (see there why not more). Times round to the nearest unit; from the
    actual rounding errors e, any split's scaled objective is within
    sum_l max_s e[s,l] + sum_s e_o[s] + (M-1) max_s (sum_l e[s,l] + e_o[s]) units of the true one
    (about 1e-6 of the objective at worst), which is taken off CP-SAT's bound.
    Bytes: 2^k per unit with the largest capacity <= CPSAT_MEMORY_UNITS units."""
    largest = float((problem.time_s.sum(axis=1) + problem.overhead_s).max())
    upper = max((problem.stages + problem.micro_batches - 1) * largest, 1e-30)
    per_second = 2.0 ** math.floor(math.log2(CPSAT_OBJECTIVE_UNITS / upper))
    biggest = max(float(problem.capacity_bytes.max()), 1.0)
    bytes_per_unit = 2.0 ** max(math.ceil(math.log2(biggest / CPSAT_MEMORY_UNITS)), 0)
    scaled, scaled_overhead = problem.time_s * per_second, problem.overhead_s * per_second
    error = np.abs(np.rint(scaled) - scaled)
    error_overhead = np.abs(np.rint(scaled_overhead) - scaled_overhead)
    rounding = (error.max(axis=0).sum() + error_overhead.sum()
                + (problem.micro_batches - 1) * (error.sum(axis=1) + error_overhead).max())
    return CpsatScale(per_second, bytes_per_unit, float(rounding) * (1 + 1e-9) + 1e-9)


def build_layers_cpsat(problem: LayerProblem, scale: CpsatScale) -> tuple[cp_model.CpModel, list[list[Any]],
                                                                          cp_model.IntVar]:
    """The MILP's formulation (see `build_layers_milp`) in integers: times rounded to the nearest
    unit, memory coefficients rounded up and capacities down (a split it accepts always fits)."""
    S, n = problem.stages, problem.layers
    model = cp_model.CpModel()
    z: list[list[Any]] = [[fixed if fixed is not None else model.NewBoolVar(f"z_{s}_{l}")
                           for l, fixed in enumerate(row)] for s, row in enumerate(_cumulative_fixings(problem))]
    times = np.rint(problem.time_s * scale.per_second).astype(np.int64)
    overhead = np.rint(problem.overhead_s * scale.per_second).astype(np.int64)
    # Capacities fit in CPSAT_MEMORY_UNITS; a negative room (transient over the cap) is -1; a layer
    # bigger than the room can never sit there, and clipping it to room + 1 keeps that meaning
    # while keeping every row far from int64 overflow.
    room = np.maximum(np.floor(problem.capacity_bytes / scale.bytes_per_unit)
                      - np.ceil(problem.transient_bytes / scale.bytes_per_unit), -1.0)
    memory = np.ceil((problem.static_bytes + problem.in_flight[:, None] * problem.activation_bytes)
                     / scale.bytes_per_unit)
    memory = np.minimum(memory, np.maximum(room, 0.0)[:, None] + 1).astype(np.int64)
    room = room.astype(np.int64)
    peak = model.NewIntVar(0, int((times.sum(axis=1) + overhead).max()), "T")
    for s in range(S):
        for l in range(1, n):
            if not isinstance(z[s][l], int) or not isinstance(z[s][l - 1], int):
                model.Add(z[s][l] <= z[s][l - 1])
            if s > 0 and (not isinstance(z[s - 1][l - 1], int) or not isinstance(z[s][l], int)):
                model.Add(z[s - 1][l - 1] <= z[s][l])
    stage_times = []
    for s in range(S):
        x = [z[s][l] - (z[s - 1][l] if s > 0 else 0) for l in range(n)]
        t = sum(int(times[s, l]) * x[l] for l in range(n)) + int(overhead[s])
        stage_times.append(t)
        model.Add(t <= peak)
        model.Add(sum(int(memory[s, l]) * x[l] for l in range(n)) <= int(room[s]))
    model.Minimize(sum(stage_times) + (problem.micro_batches - 1) * peak)
    return model, z, peak


def solve_layers_cpsat(problem: LayerProblem, time_limit_s: float = 10.0, threads: int = 1, seed: int = 0,
                       warm_start: Sequence[int] | None = None,
                       heuristic: SolveResult[Boundaries] | None = None) -> SolveResult[Boundaries]:
    """CP-SAT on `build_layers_cpsat`; objective re-evaluated in floats, bound unscaled (less the
    rounding slack, so it stays a valid bound on the true optimum)."""
    trivial = _trivially_infeasible(problem, "cpsat", seed)
    if trivial:
        return trivial
    build_start = time.perf_counter()
    scale = cpsat_scale(problem)
    model, z, peak = build_layers_cpsat(problem, scale)
    if warm_start and problem.is_split(warm_start):
        for s, row in enumerate(z):
            for l, var in enumerate(row):
                if not isinstance(var, int):
                    model.AddHint(var, l < warm_start[s + 1])
        model.AddHint(peak, int(round(max(problem.stage_times(warm_start)) * scale.per_second)))
    solver = cpsat_solver(time_limit_s, threads, seed)
    build_s = time.perf_counter() - build_start
    start = time.perf_counter()
    code = solver.Solve(model)
    wall = time.perf_counter() - start
    if code == cp_model.INFEASIBLE:
        return SolveResult(Status.INFEASIBLE, None, None, None, wall, "cpsat", build_s, seed,
                           infeasibility_reason(problem)
                           or f"no split fits once memory is rounded up to {scale.bytes_per_unit:.0f}-byte units "
                           f"(a stage is within rounding of its cap of {problem.capacity_bytes.min() / GIB:.3f}+ GiB)")
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the layer model: {model.Validate()}")
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):  # read nothing: values would be 0
        return _fallback(problem, heuristic, "cpsat", wall, build_s, seed,
                         f"CP-SAT found no split ({solver.StatusName(code)})")
    split = _milp_boundaries(problem, z, solver.Value)
    if split is None:
        raise RuntimeError("CP-SAT returned a solution that is not a split")
    objective = problem.objective(split)
    bound = min(max(solver.BestObjectiveBound() - scale.rounding_units, 0.0) / scale.per_second, objective)
    if code == cp_model.OPTIMAL:
        return SolveResult(Status.OPTIMAL, split, objective, bound, wall, "cpsat", build_s, seed)
    return SolveResult(Status.FEASIBLE, split, objective, bound, wall, "cpsat", build_s, seed,
                       "CP-SAT stopped at the time limit")


# -- dispatcher -----------------------------------------------------------------------------------
def solve_layers(problem: LayerProblem, backend: str = "cpsat", time_limit_s: float = 10.0, threads: int = 1,
                 seed: int = 0) -> SolveResult[Boundaries]:
    """Exact DP first (a share of the limit); its split warm-starts the model (else a balanced
    split that fits), and it is the answer when the model finds nothing. If the DP's incumbent
    beats the model's, or the DP proved what the model did not, the better facts are reported."""
    if backend == "dp":
        return solve_layers_exact(problem, time_limit_s)
    if backend not in ("cpsat", "highs", "cbc"):
        raise ValueError(f"unknown backend {backend!r}: use 'cpsat', 'highs', 'cbc' or 'dp'")
    start = time.perf_counter()
    warm = solve_layers_exact(problem, WARM_START_FRACTION * time_limit_s)
    if warm.status == Status.INFEASIBLE:
        return warm
    hint = warm.solution
    if hint is None:
        balanced = balanced_boundaries(problem.layers, problem.stages)
        hint = balanced if problem.fits(balanced) else None
    remaining = max(time_limit_s - (time.perf_counter() - start), 0.05 * time_limit_s)
    if backend == "cpsat":
        result = solve_layers_cpsat(problem, remaining, threads, seed, hint, heuristic=warm)
    else:
        result = solve_layers_milp(problem, remaining, backend, threads, hint, seed, heuristic=warm)
    result = replace(result, build_s=result.build_s + warm.wall_s)
    if result.status != Status.FEASIBLE or not warm.status.has_solution:
        return result
    # Both bounds are valid, and the DP's split may beat the model's incumbent.
    if warm.status == Status.OPTIMAL:
        return replace(result, status=Status.OPTIMAL, solution=warm.solution, objective=warm.objective,
                       bound=warm.objective, reason=f"{result.reason}; optimality proven by the exact DP warm start")
    bound = max(result.bound if result.bound is not None else -math.inf, warm.bound)
    if warm.objective < result.objective:
        result = replace(result, solution=warm.solution, objective=warm.objective,
                         reason=f"{result.reason}; incumbent from the exact DP warm start")
    return replace(result, bound=min(bound, result.objective))
