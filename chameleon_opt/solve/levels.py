"""The template-level model: which templates run, at which micro-batch level, how many pipelines.

Data (`LevelModel`): templates k (device type, S_k stages, a layer split; t_k(m) the 1F1B time of
one pipeline running m micro-batches, sync_k its gradient sync and optimizer step), the TP groups
G_d of each device type d, the N micro-batches of a step, each template's candidate levels
(`windows`: the levels whose time can beat the incumbent and reach the bound) and the most
pipelines it can form, most_k = min(G_d // S_k, N). Pipelines of one template all run the same
level m: with the covering row sum >= N this loses nothing (raising a pipeline to its template's
highest level costs no time; the N micro-batches are spread exactly afterwards).

Variables:
    y[k,m] in {0,1}        template k runs at level m                         (CP-SAT `y{k}_{m}`)
    z[k,m] integer >= 0    pipelines of template k at level m                  (`z{k}_{m}`)
    u[k]   in {0,1}        template k is used                                  (`u{k}`)
    T >= 0                 makespan: the slowest pipeline's 1F1B time          (`T`)
    Y >= 0                 the slowest used template's sync and optimizer step (`Y`)

Constraints (the MILP's row names):
    pipelines_only_at_chosen_level   z[k,m] <= most_k y[k,m]
    chosen_level_has_a_pipeline      z[k,m] >= y[k,m]
    makespan                         T >= t_k(m) y[k,m]
    one_level                        sum_m y[k,m] = u[k]
    sync                             Y >= sync_k u[k]
    cover_micro_batches              sum_{k,m} m z[k,m] >= N
    a_micro_batch_per_pipeline       sum_{k,m} z[k,m] <= N   (every pipeline runs at least one)
    tp_groups_type                   sum_{k of type d} S_k sum_m z[k,m] <= G_d, per device type d
    min_pipelines                    sum_{k,m} z[k,m] >= min_pipelines_k u[k]   (distributed-optimizer memory)
    relaxation_bound                 T + Y >= the relaxation's lower bound (`lp_lower_bound`)

Objective: minimise T + Y, ties (to the microsecond) to fewer pipelines (a smaller gradient ring,
fewer sends): (T + Y) x W + sum z with W above any pipeline count. CP-SAT takes integers only, so
there every time is in microseconds (TIME_SCALE), rounded up; the MILP (HiGHS, CBC, MPS/LP export)
keeps seconds and divides the tie term instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from chameleon_opt.solve.backends import DEFAULT, OutOfRange, SolverOptions, cpsat_int, solve_cpsat, solve_pulp
from chameleon_opt.solve.constructive import Mix, modelled_time
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.microbatch import allocate_greedy
from chameleon_opt.solve.result import Status
from chameleon_opt.solve.templates import Template

if TYPE_CHECKING:  # imported where a level model is built: ortools (with pandas) and pulp take
    import pulp   # 0.3 s to import, inside the decision's deadline, and most decisions never build one
    from ortools.sat.python import cp_model

TIME_SCALE = 1e6  # seconds -> integer microseconds
LINEARIZATION = 2  # CP-SAT's linearization level for the level model
HIGHS_RESERVE_S = 0.4  # HiGHS's start-up overrun, kept back from its time limit
RELATIVE_GAP = 1e-4  # stop once the incumbent is proven within 0.01% of the optimum


def _ceil(seconds: float) -> int:
    return int(math.ceil(seconds * TIME_SCALE))


def lp_lower_bound(templates: list[Template], budget: dict[str, int], total: int,
                   deadline: Deadline = Deadline.never()) -> float:
    """A valid lower bound on T + Y from a relaxation that keeps micro-batches integral.

    For a sync level y only templates with sync <= y may run. A pipeline of template k that
    finishes by T runs at most cap_k(T) = floor((T - fill_k) / per_k) + 1 micro-batches on S_k
    groups; relaxing only the number of pipelines to a fraction, each device type's groups are
    best spent on its template with the highest cap_k(T) / S_k, and T_LB(y) is the least T at
    which that covers all N micro-batches. It is found exactly among the breakpoints
    fill_k + (m - 1) per_k (coverage only grows with T). Any plan has some sync level, so
    LB = min over levels of T_LB(y) + y. Past `deadline` it returns 0 (a minimum over only some
    levels would not be a bound)."""
    best = math.inf
    for level in sorted({t.sync_s for t in templates}):
        if deadline.expired():
            return 0.0
        allowed = [t for t in templates if t.sync_s <= level]
        covered = _coverage(allowed, budget)
        high = max(t.fill_s + total * t.per_micro_batch_s for t in allowed)
        if covered(high) < total or min(t.fill_s for t in allowed) + level >= best:
            continue
        low = min(t.fill_s for t in allowed)
        for _ in range(100):  # bisection to a breakpoint (until it stands still), then snap down onto it
            middle = (low + high) / 2
            bracket = (low, middle) if covered(middle) >= total else (middle, high)
            if bracket == (low, high):
                break
            low, high = bracket
        snapped = max((t.fill_s + (math.floor((high - t.fill_s) / t.per_micro_batch_s + 1e-12)) * t.per_micro_batch_s
                       for t in allowed if high >= t.fill_s), default=high)
        best = min(best, min(snapped, high) + level)
    return best


def _coverage(allowed: list[Template], budget: dict[str, int]) -> Callable[[float], float]:
    """Micro-batches the relaxation covers by a makespan: per device type, its groups times the
    best micro-batch cap (`micro_batch_cap`) per stage among `allowed`, in one array pass per
    probe (a Python loop over the templates made the bound 2.1 s of CPU at 16,384 devices). The sum runs
    over the types in the order their first template with a cap appears, as the loop added them."""
    fill = np.array([t.fill_s for t in allowed])
    per = np.array([t.per_micro_batch_s for t in allowed])
    most = np.array([float(t.max_level or 10 ** 9) for t in allowed])
    stages = np.array([float(t.stages) for t in allowed])
    names = list(dict.fromkeys(t.device_type for t in allowed))
    members = [np.array([t.device_type == name for t in allowed]) for name in names]

    def covered(makespan: float) -> float:
        caps = np.where(makespan < fill, 0.0, np.minimum(np.floor((makespan - fill) / per + 1e-12) + 1, most))
        if len(names) == 1:
            rate = float((caps / stages).max())
            return budget[names[0]] * rate if rate > 0 else 0
        rates = [(int(np.argmax(member & (caps > 0))), budget[name] * float((caps[member] / stages[member]).max()))
                 for name, member in zip(names, members) if (caps[member] > 0).any()]
        return sum(amount for _, amount in sorted(rates))

    return covered


@dataclass(frozen=True)
class LevelModel:
    """The template-level model's data, shared by the CP-SAT and the MILP builders.

    Pipelines of one template all run the same number m of micro-batches (their `level`): with the
    covering constraint sum >= N this loses nothing, since raising a pipeline to its template's
    highest level costs no time and N micro-batches are spread exactly afterwards. Levels whose
    time would exceed the incumbent's objective cannot be optimal and are left out; and as the
    optimum's makespan T* is at least lower_bound - max sync, each template can sit at its highest
    level under T*, which is at least the level reached at that makespan. Both cuts keep every
    optimal solution, and the model (the module docstring) small and free of products."""

    templates: list[Template]
    budget: dict[str, int]
    total: int
    windows: list[range]      # candidate levels per template
    incumbent: Mix
    lower_bound: float

    @property
    def most(self) -> list[int]:
        return [min(self.budget[t.device_type] // t.stages, self.total) for t in self.templates]


def level_model(templates: list[Template], budget: dict[str, int], total: int, incumbent: Mix,
                lower_bound: float) -> LevelModel:
    best = modelled_time(templates, incumbent)
    floor_makespan = lower_bound - max(t.sync_s for t in templates)
    windows = []
    for t in templates:
        top = min(total, t.max_level or total,
                  int(math.floor((best - t.sync_s - t.fill_s) / t.per_micro_batch_s + 1e-9)) + 1)
        bottom = max(1, min(top, int(math.floor((floor_makespan - t.fill_s) / t.per_micro_batch_s - 1e-9)) + 1))
        windows.append(range(bottom, top + 1))
    return LevelModel(templates, budget, total, windows, incumbent, lower_bound)


def _mix_from_levels(lm: LevelModel, pipelines: list[tuple[int, int]]) -> Mix:
    """Exact micro-batch counts (summing to N) for the chosen (template, level) pipelines."""
    t = lm.templates
    allocation = allocate_greedy([t[k].fill_s for k, _ in pipelines], [t[k].per_micro_batch_s for k, _ in pipelines],
                                 lm.total, [t[k].max_level for k, _ in pipelines])
    if allocation.solution is None:  # the model's rows admit only spreadable solutions: a bug if reached
        raise AssertionError(f"level model chose pipelines no spread fits: {allocation.reason}")
    spread = allocation.solution
    shares: list[list[int]] = [[] for _ in t]
    for (k, _), m in zip(pipelines, spread):
        shares[k].append(m)
    return Mix(tuple(len(x) for x in shares), tuple(tuple(x) for x in shares))


def _tie_weight(lm: LevelModel) -> int:
    """Weight of a microsecond against one pipeline in the tie-break: more than any pipeline count."""
    return sum(lm.most) + 1


def build_level_cpsat(lm: LevelModel) -> tuple[cp_model.CpModel, dict[tuple[int, int], tuple]]:
    """The level model for CP-SAT, times in integer microseconds rounded up."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    cells: dict[tuple[int, int], tuple] = {}
    # The objective's largest value, in scaled integers, must stay inside CP-SAT's range.
    cpsat_int(float(_ceil(modelled_time(lm.templates, lm.incumbent)) + 1) * _tie_weight(lm) * 2,
              "the level model's objective in microseconds x tie weight")
    makespan = model.new_int_var(0, _ceil(modelled_time(lm.templates, lm.incumbent)) + 1, "T")  # T
    sync = model.new_int_var(0, _ceil(max(t.sync_s for t in lm.templates)), "Y")  # Y
    used_by: list[cp_model.IntVar | None] = []
    for k, (t, most) in enumerate(zip(lm.templates, lm.most)):
        for m in lm.windows[k]:
            chosen = model.new_bool_var(f"y{k}_{m}")  # y[k,m]
            pipes = model.new_int_var(0, most, f"z{k}_{m}")  # z[k,m]
            model.add(pipes <= most * chosen)  # pipelines_only_at_chosen_level
            model.add(pipes >= chosen)  # chosen_level_has_a_pipeline
            # makespan: T >= t_k(m) y[k,m], as an enforced row
            model.add(makespan >= _ceil(t.pipeline_time(m))).only_enforce_if(chosen)
            cells[(k, m)] = (chosen, pipes)
        if not lm.windows[k]:
            used_by.append(None)
            continue
        used = model.new_bool_var(f"u{k}")  # u[k]
        model.add(sum(cells[(k, m)][0] for m in lm.windows[k]) == used)  # one_level
        model.add(sync >= _ceil(t.sync_s)).only_enforce_if(used)  # sync: Y >= sync_k u[k]
        used_by.append(used)
    pipelines = sum(pipes for _, pipes in cells.values())
    model.add(sum(m * pipes for (_, m), (_, pipes) in cells.items()) >= lm.total)  # cover_micro_batches
    model.add(pipelines <= lm.total)  # a_micro_batch_per_pipeline
    for name, groups in lm.budget.items():  # tp_groups_type, one row per device type
        model.add(sum(lm.templates[k].stages * pipes for (k, _), (_, pipes) in cells.items()
                      if lm.templates[k].device_type == name) <= groups)
    for k, used in enumerate(used_by):  # min_pipelines
        if used is not None and lm.templates[k].min_pipelines > 1:
            model.add(pipelines >= lm.templates[k].min_pipelines).only_enforce_if(used)
    # relaxation_bound, 2 us below it: T and Y were each rounded up by less than 1 us
    model.add(makespan + sync >= max(int(math.floor(lm.lower_bound * TIME_SCALE)) - 2, 0))
    # Objective: T + Y, ties (to the microsecond) to fewer pipelines: a smaller gradient ring, fewer sends.
    model.minimize((makespan + sync) * _tie_weight(lm) + pipelines)
    # Hint: the incumbent, each used template at its level (clamped into its window).
    for k, shares in enumerate(lm.incumbent.micro_batches):
        if not lm.windows[k]:
            continue
        level = min(max(max(shares, default=0), lm.windows[k].start), lm.windows[k].stop - 1)
        for m in lm.windows[k]:
            chosen, pipes = cells[(k, m)]
            model.add_hint(chosen, bool(shares) and m == level)
            model.add_hint(pipes, len(shares) if shares and m == level else 0)
    return model, cells


def build_level_milp(lm: LevelModel) -> tuple[pulp.LpProblem, dict[tuple[int, int], tuple]]:
    """The level model as a MILP (continuous seconds), for HiGHS or CBC and for MPS/LP export.
    Every row is named after what it states (template k, level m, device type), so an exported
    MPS file reads like the model above."""
    import pulp

    problem = pulp.LpProblem("template_levels", pulp.LpMinimize)
    makespan = problem.add_variable("T", 0)
    sync = problem.add_variable("Y", 0)
    cells: dict[tuple[int, int], tuple] = {}
    used_by: list[pulp.LpVariable | None] = []
    for k, (t, most) in enumerate(zip(lm.templates, lm.most)):
        for m in lm.windows[k]:
            chosen = problem.add_variable(f"y_{k}_{m}", 0, 1, pulp.LpBinary)
            pipes = problem.add_variable(f"z_{k}_{m}", 0, most, pulp.LpInteger)
            problem += (pipes <= most * chosen, f"pipelines_only_at_chosen_level_{k}_{m}")
            problem += (pipes >= chosen, f"chosen_level_has_a_pipeline_{k}_{m}")
            problem += (makespan >= t.pipeline_time(m) * chosen, f"makespan_{k}_{m}")
            cells[(k, m)] = (chosen, pipes)
        if not lm.windows[k]:
            used_by.append(None)
            continue
        used = problem.add_variable(f"u_{k}", 0, 1, pulp.LpBinary)
        problem += (pulp.lpSum(cells[(k, m)][0] for m in lm.windows[k]) == used, f"one_level_{k}")
        problem += (sync >= t.sync_s * used, f"sync_{k}")
        used_by.append(used)
    pipelines = pulp.lpSum(pipes for _, pipes in cells.values())
    problem += (pulp.lpSum(m * pipes for (_, m), (_, pipes) in cells.items()) >= lm.total, "cover_micro_batches")
    problem += (pipelines <= lm.total, "a_micro_batch_per_pipeline")
    for i, (name, groups) in enumerate(lm.budget.items()):
        problem += (pulp.lpSum(lm.templates[k].stages * pipes for (k, _), (_, pipes) in cells.items()
                               if lm.templates[k].device_type == name) <= groups, f"tp_groups_type{i}")
    for k, used in enumerate(used_by):
        if used is not None and lm.templates[k].min_pipelines > 1:
            problem += (pipelines >= lm.templates[k].min_pipelines * used, f"min_pipelines_{k}")
    problem += (makespan + sync >= lm.lower_bound, "relaxation_bound")
    problem += makespan + sync + pipelines / (TIME_SCALE * _tie_weight(lm))  # ties go to fewer pipelines
    return problem, cells


def solve_level_model(lm: LevelModel, deadline: Deadline, options: SolverOptions = DEFAULT
                      ) -> tuple[Status | None, Mix | None, float | None, float, float]:
    """Solve with `options.backend` ('cpsat', 'highs' or 'cbc'). Returns (status or None when
    nothing was found, mix, proven bound in seconds, build_s, wall_s). Statuses come from the
    solver layer (`backends.py`), never from PuLP's summary (which can say Optimal after a time
    limit). The solver is given what is left of `deadline` on entry (building the model
    is not charged to it)."""
    backend, time_limit_s = options.backend, deadline.left()
    build_start = time.perf_counter()
    pipelines: list[tuple[int, int]] = []
    if backend == "cpsat":
        try:
            model, cells = build_level_cpsat(lm)
        except OutOfRange:  # times beyond CP-SAT's integers: the caller keeps its incumbent
            return None, None, None, time.perf_counter() - build_start, 0.0
        build_s = time.perf_counter() - build_start
        solver, outcome = solve_cpsat(model, time_limit_s, options, linearization_level=LINEARIZATION,
                                      relative_gap_limit=RELATIVE_GAP)
        if outcome.status is Status.INFEASIBLE:
            return Status.INFEASIBLE, None, None, build_s, outcome.wall_s
        if not outcome.has_solution or outcome.bound is None:
            return None, None, None, build_s, outcome.wall_s
        for (k, m), (_, pipes) in cells.items():
            pipelines += [(k, m)] * int(solver.value(pipes))
        # Each of the two terms was rounded up by < 1 us.
        bound = max(outcome.bound // _tie_weight(lm) - 2, 0) / TIME_SCALE
        return outcome.status, _mix_from_levels(lm, pipelines), bound, build_s, outcome.wall_s
    if backend not in ("highs", "cbc"):
        raise ValueError(f"unknown backend {backend!r}: use 'cpsat', 'highs' or 'cbc'")
    problem, cells = build_level_milp(lm)
    incumbent = modelled_time(lm.templates, lm.incumbent)
    tie_slack = sum(lm.most) / (TIME_SCALE * _tie_weight(lm))
    if backend == "highs":
        # HiGHS reads its clock between branch-and-bound nodes and cannot stop during its start-up
        # (presolve, root LP): measured overruns were ~0.4 s plus up to 10%, so it gets a reserve.
        # The cutoff: only solutions better than the incumbent are of interest.
        cutoff = incumbent * (1 + 1e-9) + tie_slack
        outcome = solve_pulp(problem, max(time_limit_s * 0.9 - HIGHS_RESERVE_S, 0.05), options, "highs",
                             mip_rel_gap=RELATIVE_GAP, objective_bound=cutoff)
    else:
        outcome = solve_pulp(problem, time_limit_s, options, "cbc", ratioGap=RELATIVE_GAP)
    wall = outcome.wall_s
    build_s = max(time.perf_counter() - build_start - wall, 0.0)
    if outcome.status is Status.INFEASIBLE:
        if backend == "highs":  # nothing beats the cutoff: the incumbent is optimal
            return Status.OPTIMAL, lm.incumbent, incumbent, build_s, wall
        return Status.INFEASIBLE, None, None, build_s, wall
    if not outcome.has_solution:
        return None, None, None, build_s, wall
    for (k, m), (_, pipes) in cells.items():
        pipelines += [(k, m)] * int(round(pipes.varValue or 0))
    bound = None if outcome.bound is None else outcome.bound - tie_slack
    return outcome.status, _mix_from_levels(lm, pipelines), bound, build_s, wall
