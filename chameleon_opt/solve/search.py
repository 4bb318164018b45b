"""Plan search (reconfiguration) over the survivors, as a CP-SAT model over pipeline templates.

Decisions: how many pipelines of each template (device type x stage count, each with its best
layer split), how many micro-batches each pipeline runs, hence the DP degree, every pipeline's
length and the layer range of every stage. The space contains the paper's Algorithm 1 space
(uneven pipeline lengths, any micro-batch shares, balanced splits are one candidate split) and
goes beyond it: unevenly split layers, heterogeneous device types, survivors left idle when that
is faster, TP groups kept inside nodes.

Model (times in integer microseconds, rounded up; CP-SAT takes integers only):
    n_k  pipelines of template k,  m_k  micro-batches of each,  e_k of them run one more
    sum_k n_k m_k + e_k = N                    every micro-batch assigned once
    sum_{k of type d} S_k n_k <= G_d           TP groups available per device type
    n_k >= 1  =>  T >= fill_k + (m_k - 1) b_k,  e_k >= 1 => T >= fill_k + m_k b_k
    n_k >= 1  =>  Y >= sync_k,  sum_k n_k >= min_pipelines_k   (distributed-optimizer memory)
    minimise T + Y   (the modelled step time: 1F1B surrogate + gradient sync + optimizer)
The chosen plan is then lowered, evaluated exactly by the performance model (Eq. 10/11), and
checked by the independent checker.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chameleon_opt.check import assert_sound
from chameleon_opt.errors import InfeasibleError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.enumerator import enumerate_plans
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.microbatch import allocate_greedy
from chameleon_opt.solve.mixed import mixed_plans
from chameleon_opt.solve.polish import polish_splits, rebalance_exact, relieved
from chameleon_opt.solve.backends import OutOfRange, SolverOptions, cpsat_int, cpsat_start_s, solve_cpsat, solve_pulp
from chameleon_opt.solve.bounds import memory_floor, relaxation_bound
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.exact import exact_search
from chameleon_opt.solve.result import SolveResult, Status
from chameleon_opt.solve.templates import Template, build_templates

if TYPE_CHECKING:  # imported where a level model is built: ortools (with pandas) and pulp take
    import pulp   # 0.3 s to import, inside the decision's deadline, and most decisions never build one
    from ortools.sat.python import cp_model

TIME_SCALE = 1e6  # seconds -> integer microseconds
LINEARIZATION = 2
HIGHS_RESERVE_S = 0.4
TEMPLATE_SHARE = 0.5  # of the search's time, for the template path (the rest: exact search, bound)
MIXED_SHARE = 0.3  # of what is left after it, for pipelines of mixed device types
MIN_SEARCH_S = 0.02  # less time left than this: the search does not start (NO_SOLUTION, stopped early)
POLISH_CANDIDATES = 24  # neighbouring mixes evaluated exactly after the solve
ENUMERATION_SHARE = 0.25  # of the time limit, for the paper's enumeration as an extra incumbent
ENUMERATION_GROUPS = 64  # beyond this many TP groups it cannot finish in seconds (bench/solver_scaling.py)
OPTIMALITY_TOLERANCE = 1e-6  # OPTIMAL: the exact step is within this relative gap of a valid bound
SPACE = ("pipelines of TP groups formed inside nodes from any survivors (idle allowed), stages of any "
         "device types in any order, contiguous layer splits, any micro-batch split; 1F1B; step time, "
         "gradient all-reduce, optimizer step and memory of the performance model")
RELATIVE_GAP = 1e-4  # stop once the incumbent is proven within 0.01% of the optimum


@dataclass(frozen=True)
class Mix:
    """Pipelines per template and their micro-batches: the search's decision, before lowering."""

    counts: tuple[int, ...]
    micro_batches: tuple[tuple[int, ...], ...]  # per template, one entry per pipeline


def modelled_time(templates: list[Template], mix: Mix) -> float:
    """The objective the CP-SAT model minimises, in seconds."""
    used = [k for k, c in enumerate(mix.counts) if c]
    slowest = max(templates[k].pipeline_time(m) for k in used for m in mix.micro_batches[k])
    return slowest + max(templates[k].sync_s for k in used)


def lower(templates: list[Template], mix: Mix, groups_by_type: dict[str, list[tuple[int, ...]]], tp: int) -> Plan:
    """Pipelines with devices: longest pipelines first, each on consecutive TP groups (so its
    neighbouring stages share nodes where they can)."""
    pipelines: list[Pipeline] = []
    cursor = {name: 0 for name in groups_by_type}
    order = sorted(range(len(templates)), key=lambda k: -templates[k].stages)
    for k in order:
        template = templates[k]
        for share in mix.micro_batches[k]:
            pool = groups_by_type[template.device_type]
            start = cursor[template.device_type]
            cursor[template.device_type] += template.stages
            stages = tuple(Stage(pool[start + s], template.boundaries[s], template.boundaries[s + 1])
                           for s in range(template.stages))
            pipelines.append(Pipeline(stages, share))
    return Plan(tp, tuple(pipelines))


def heuristic_mix(templates: list[Template], budget: dict[str, int], total: int) -> Mix | None:
    """Fast constructive plan: the best single template used as many times as groups allow, with
    micro-batches balanced exactly (greedy). The warm start and the fallback."""
    best: tuple[float, Mix] | None = None
    for k, template in enumerate(templates):
        count = min(budget[template.device_type] // template.stages, total)
        if count < max(template.min_pipelines, 1):
            continue
        shares = allocate_greedy([template.fill_s] * count, [template.per_micro_batch_s] * count, total,
                                 [template.max_level] * count).solution
        if shares is None:
            continue
        counts = tuple(count if i == k else 0 for i in range(len(templates)))
        mix = Mix(counts, tuple(tuple(shares) if i == k else () for i in range(len(templates))))
        value = modelled_time(templates, mix)
        if best is None or value < best[0]:
            best = (value, mix)
    return None if best is None else best[1]


def restricted_mix(plan: Plan, failed: frozenset[int], templates: list[Template], budget: dict[str, int],
                   total: int, model: PerfModel) -> Mix | None:
    """The previous plan restricted to the survivors, as a warm start: its untouched pipelines,
    each mapped to the template of its device type and length (whose split is at least as good),
    with the micro-batches spread over them exactly. None when no pipeline survived intact."""
    index = {(t.device_type, t.stages): k for k, t in enumerate(templates) if t.max_level is None}
    chosen = []
    for pipe in plan.pipelines:
        if failed.intersection(pipe.devices):
            continue
        types = {model.stage_device(stage.devices).name for stage in pipe.stages}
        key = (types.pop(), len(pipe.stages))
        if types or key not in index:  # a pipeline of mixed device types has no template
            return None
        chosen.append(index[key])
    used: dict[str, int] = {}
    for k in chosen:
        used[templates[k].device_type] = used.get(templates[k].device_type, 0) + templates[k].stages
    if not chosen or len(chosen) > total or any(n > budget.get(name, 0) for name, n in used.items()):
        return None
    spread = allocate_greedy([templates[k].fill_s for k in chosen], [templates[k].per_micro_batch_s for k in chosen],
                             total).solution or ()
    shares: list[list[int]] = [[] for _ in templates]
    for k, m in zip(chosen, spread):
        shares[k].append(m)
    mix = Mix(tuple(len(x) for x in shares), tuple(tuple(x) for x in shares))
    return None if any(c and sum(mix.counts) < templates[k].min_pipelines for k, c in enumerate(mix.counts)) else mix


def _cap(template: Template, makespan: float) -> int:
    """Most micro-batches one pipeline of `template` runs within `makespan` (0 if not even one)."""
    if makespan < template.fill_s:
        return 0
    return min(math.floor((makespan - template.fill_s) / template.per_micro_batch_s + 1e-12) + 1,
               template.max_level or 10 ** 9)


KNAPSACK_CELLS = 200_000
"""Above this many (groups x templates) DP cells the cover falls back to the greedy by rate."""


def _best_counts(items: list[tuple[int, int, int]], groups: int) -> dict[int, int]:
    """Pipelines per template maximising micro-batches covered with at most `groups` TP groups.

    items: (template, stages, micro-batches per pipeline). Exact unbounded-knapsack DP when small,
    else greedy by micro-batches per group (near-exact when groups are many)."""
    counts: dict[int, int] = {}
    if not items:
        return counts
    if groups * len(items) > KNAPSACK_CELLS:
        left = groups
        for k, stages, cap in sorted(items, key=lambda item: -item[2] / item[1]):
            counts[k] = left // stages
            left -= counts[k] * stages
        return counts
    best = [0] * (groups + 1)
    choice = [-1] * (groups + 1)
    for g in range(1, groups + 1):
        best[g], choice[g] = best[g - 1], -1
        for i, (_, stages, cap) in enumerate(items):
            if stages <= g and best[g - stages] + cap > best[g]:
                best[g], choice[g] = best[g - stages] + cap, i
    g = groups
    while g > 0:
        if choice[g] < 0:
            g -= 1
            continue
        k, stages, _ = items[choice[g]]
        counts[k] = counts.get(k, 0) + 1
        g -= stages
    return counts


def cover_mix(templates: list[Template], allowed: list[int], budget: dict[str, int], total: int,
              makespan: float) -> Mix | None:
    """Pipelines that finish within `makespan` and cover every micro-batch, using each device
    type's groups as productively as possible; None when no such set exists (or it violates a
    template's minimum pipeline count)."""
    chosen: list[tuple[int, int]] = []  # (template, cap) per pipeline
    for name, groups in budget.items():
        items = [(k, templates[k].stages, _cap(templates[k], makespan)) for k in allowed
                 if templates[k].device_type == name and _cap(templates[k], makespan) > 0]
        for k, n in _best_counts(items, groups).items():
            chosen += [(k, _cap(templates[k], makespan))] * n
    chosen.sort(key=lambda item: -item[1])
    kept, covered = [], 0
    for k, cap in chosen:  # fewest pipelines that still cover everything
        if covered >= total:
            break
        kept.append(k)
        covered += cap
    if covered < total or any(len(kept) < templates[k].min_pipelines for k in set(kept)):
        return None
    spread = allocate_greedy([templates[k].fill_s for k in kept], [templates[k].per_micro_batch_s for k in kept],
                             total, [templates[k].max_level for k in kept]).solution or ()
    shares: list[list[int]] = [[] for _ in templates]
    for k, m in zip(kept, spread):
        shares[k].append(m)
    return Mix(tuple(len(x) for x in shares), tuple(tuple(x) for x in shares))


def bound_guided_mix(templates: list[Template], budget: dict[str, int], total: int, incumbent: Mix,
                     deadline: float = math.inf) -> Mix:
    """For every sync level, the least makespan (bisection) at which the greedy cover succeeds;
    the best such mix, or `incumbent` when none beats it. Near-optimal when groups are many.
    Past `deadline` the best mix so far is returned."""
    best, best_value = incumbent, modelled_time(templates, incumbent)
    for level in sorted({t.sync_s for t in templates}):
        if time.perf_counter() > deadline:
            break
        allowed = [k for k, t in enumerate(templates) if t.sync_s <= level]
        low = min(templates[k].fill_s for k in allowed)
        if low + level > best_value:
            break
        high = best_value - level
        if cover_mix(templates, allowed, budget, total, high) is None:
            continue
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (low, middle) if cover_mix(templates, allowed, budget, total, middle) else (middle, high)
        mix = cover_mix(templates, allowed, budget, total, high)
        if mix is not None and _rank(templates, mix) < _rank(templates, best):
            best, best_value = mix, modelled_time(templates, mix)
    return best


def _rank(templates: list[Template], mix: Mix) -> tuple[float, int]:
    """Order of mixes: modelled time (to the nanosecond), then fewer pipelines (smaller gradient
    rings, fewer sends): the same tie-break as the solvers' objective."""
    return round(modelled_time(templates, mix), 9), sum(mix.counts)


def _ceil(seconds: float) -> int:
    return int(math.ceil(seconds * TIME_SCALE))


def neighbour_mixes(templates: list[Template], budget: dict[str, int], total: int, mix: Mix) -> list[Mix]:
    """Mixes near `mix`: the groups of one used template re-cut into pipelines of any other length
    (all of its pipelines), or one of its pipelines moved to an adjacent length; any template of
    that length and device type (level-capped ones included); micro-batches re-spread exactly
    within the caps. Ordered by the model's rank, so the likeliest come first."""
    by_length: dict[tuple[str, int], list[int]] = {}
    for k, t in enumerate(templates):
        by_length.setdefault((t.device_type, t.stages), []).append(k)
    found = []
    for k, count in enumerate(mix.counts):
        if not count:
            continue
        t = templates[k]
        lengths = {length for (name, length) in by_length if name == t.device_type and length != t.stages}
        for stages in sorted(lengths, key=lambda length: abs(length - t.stages)):
            adjacent = abs(stages - t.stages) == 1  # one pipeline moved: only to adjacent lengths
            for other, whole in ((o, w) for o in by_length[(t.device_type, stages)] for w in (True, False)
                                 if w or adjacent):
                counts = list(mix.counts)
                counts[k] = 0 if whole else counts[k] - 1  # re-cut all its pipelines, or just one
                used = sum(templates[i].stages * c for i, c in enumerate(counts)
                           if templates[i].device_type == t.device_type)
                room = (budget[t.device_type] - used) // stages
                if whole:
                    counts[other] += max(room - counts[other], 0)
                elif room >= 1:
                    counts[other] += 1
                else:
                    continue
                chosen = [i for i, c in enumerate(counts) for _ in range(c)]
                if not chosen or len(chosen) > total:
                    continue
                spread = allocate_greedy([templates[i].fill_s for i in chosen],
                                         [templates[i].per_micro_batch_s for i in chosen], total,
                                         [templates[i].max_level for i in chosen]).solution
                if spread is None:
                    continue
                shares: list[list[int]] = [[] for _ in templates]
                for i, m in zip(chosen, spread):
                    shares[i].append(m)
                candidate = Mix(tuple(len(x) for x in shares), tuple(tuple(x) for x in shares))
                if all(not c or len(chosen) >= templates[i].min_pipelines for i, c in enumerate(candidate.counts)):
                    found.append(candidate)
    return sorted(found, key=lambda candidate: _rank(templates, candidate))


def lp_lower_bound(templates: list[Template], budget: dict[str, int], total: int,
                   deadline: float = math.inf) -> float:
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
        if time.perf_counter() > deadline:
            return 0.0
        allowed = [t for t in templates if t.sync_s <= level]

        def covered(makespan: float) -> float:
            rate: dict[str, float] = {}
            for t in allowed:
                cap = _cap(t, makespan)
                if cap:
                    rate[t.device_type] = max(rate.get(t.device_type, 0.0), cap / t.stages)
            return sum(budget[name] * r for name, r in rate.items())

        high = max(t.fill_s + total * t.per_micro_batch_s for t in allowed)
        if covered(high) < total or min(t.fill_s for t in allowed) + level >= best:
            continue
        low = min(t.fill_s for t in allowed)
        for _ in range(100):  # bisection to a breakpoint, then snap down onto it
            middle = (low + high) / 2
            low, high = (low, middle) if covered(middle) >= total else (middle, high)
        snapped = max((t.fill_s + (math.floor((high - t.fill_s) / t.per_micro_batch_s + 1e-12)) * t.per_micro_batch_s
                       for t in allowed if high >= t.fill_s), default=high)
        best = min(best, min(snapped, high) + level)
    return best


@dataclass(frozen=True)
class LevelModel:
    """The template-level model's data, shared by the CP-SAT and the MILP builders.

    Pipelines of one template all run the same number m of micro-batches (their `level`): with the
    covering constraint sum >= N this loses nothing, since raising a pipeline to its template's
    highest level costs no time and N micro-batches are spread exactly afterwards. Levels whose
    time would exceed the incumbent's objective cannot be optimal and are left out; and as the
    optimum's makespan T* is at least lower_bound - max sync, each template can sit at its highest
    level under T*, which is at least the level reached at that makespan. Both cuts keep every
    optimal solution, and the model small and free of products:

        y[k,m] in {0,1}: template k runs at level m;  z[k,m] >= 0 integer: its pipelines
        sum_m y[k,m] = u[k] <= 1;  y[k,m] <= z[k,m] <= most_k y[k,m]
        sum m z[k,m] >= N;  sum_k S_k sum_m z[k,m] <= G_type
        T >= t_k(m) y[k,m];  Y >= sync_k u[k];  sum z >= min_pipelines_k u[k];  T + Y >= lower bound
        minimise T + Y
    """

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
    spread = allocate_greedy([t[k].fill_s for k, _ in pipelines], [t[k].per_micro_batch_s for k, _ in pipelines],
                             lm.total, [t[k].max_level for k, _ in pipelines]).solution or ()
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
    makespan = model.new_int_var(0, _ceil(modelled_time(lm.templates, lm.incumbent)) + 1, "T")
    sync = model.new_int_var(0, _ceil(max(t.sync_s for t in lm.templates)), "Y")
    used_by: list[cp_model.IntVar | None] = []
    for k, (t, most) in enumerate(zip(lm.templates, lm.most)):
        for m in lm.windows[k]:
            chosen = model.new_bool_var(f"y{k}_{m}")
            pipes = model.new_int_var(0, most, f"z{k}_{m}")
            model.add(pipes <= most * chosen)
            model.add(pipes >= chosen)
            model.add(makespan >= _ceil(t.pipeline_time(m))).only_enforce_if(chosen)
            cells[(k, m)] = (chosen, pipes)
        if not lm.windows[k]:
            used_by.append(None)
            continue
        used = model.new_bool_var(f"u{k}")
        model.add(sum(cells[(k, m)][0] for m in lm.windows[k]) == used)
        model.add(sync >= _ceil(t.sync_s)).only_enforce_if(used)
        used_by.append(used)
    pipelines = sum(pipes for _, pipes in cells.values())
    model.add(sum(m * pipes for (_, m), (_, pipes) in cells.items()) >= lm.total)
    for name, groups in lm.budget.items():
        model.add(sum(lm.templates[k].stages * pipes for (k, _), (_, pipes) in cells.items()
                      if lm.templates[k].device_type == name) <= groups)
    for k, used in enumerate(used_by):
        if used is not None and lm.templates[k].min_pipelines > 1:
            model.add(pipelines >= lm.templates[k].min_pipelines).only_enforce_if(used)
    model.add(makespan + sync >= max(int(math.floor(lm.lower_bound * TIME_SCALE)) - 2, 0))
    # Ties (to the microsecond) go to fewer pipelines: a smaller gradient ring, fewer sends.
    model.minimize((makespan + sync) * _tie_weight(lm) + pipelines)
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
    for i, (name, groups) in enumerate(lm.budget.items()):
        problem += (pulp.lpSum(lm.templates[k].stages * pipes for (k, _), (_, pipes) in cells.items()
                               if lm.templates[k].device_type == name) <= groups, f"tp_groups_type{i}")
    for k, used in enumerate(used_by):
        if used is not None and lm.templates[k].min_pipelines > 1:
            problem += (pipelines >= lm.templates[k].min_pipelines * used, f"min_pipelines_{k}")
    problem += (makespan + sync >= lm.lower_bound, "relaxation_bound")
    problem += makespan + sync + pipelines / (TIME_SCALE * _tie_weight(lm))  # ties go to fewer pipelines
    return problem, cells


def solve_level_model(lm: LevelModel, backend: str, time_limit_s: float, threads: int = 1, seed: int = 0,
                      options: SolverOptions | None = None
                      ) -> tuple[Status | None, Mix | None, float | None, float, float]:
    """Solve with 'cpsat', 'highs' or 'cbc'. Returns (status or None when nothing was found, mix,
    proven bound in seconds, build_s, wall_s). Statuses come from the solver layer
    (`backends.py`), never from PuLP's summary (which can say Optimal after a time limit)."""
    options = options or SolverOptions(backend, threads, seed)
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


def infeasibility_reason(instance: Instance, model: PerfModel, groups: list[tuple[int, ...]]) -> str:
    """Why no template fits: total model state against total survivor memory."""
    if not groups:
        return "no surviving TP group: every node lost too many devices for one TP group"
    state = float(model.workload.params.sum()) * (model.param_bytes + model.grad_bytes + model.optimizer_bytes)
    capacity = sum(model.layer_costs(g).capacity_bytes * len(g) for g in groups)
    return (f"no pipeline of up to {min(len(groups), instance.workload.num_layers)} stages fits in memory: "
            f"survivors hold {capacity / GIB:,.1f} GiB, model state alone needs {state / GIB:,.1f} GiB "
            f"(plus activations)")


@dataclass(frozen=True)
class SearchSpace:
    """Everything the search needs about the survivors, built once (also for `export`)."""

    groups: list[tuple[int, ...]]
    groups_by_type: dict[str, list[tuple[int, ...]]]
    budget: dict[str, int]
    total: int
    templates: list[Template]


def search_space(instance: Instance, failed: frozenset[int], model: PerfModel,
                 deadline: float = math.inf) -> SearchSpace:
    groups = survivor_groups(instance, failed, instance.plan.tensor_parallel)
    groups_by_type: dict[str, list[tuple[int, ...]]] = {}
    for group in groups:
        groups_by_type.setdefault(model.stage_device(group).name, []).append(group)
    return SearchSpace(groups, groups_by_type, {name: len(g) for name, g in groups_by_type.items()},
                       instance.global_micro_batches, build_templates(model, groups, deadline))


def level_model_for(instance: Instance, failed: frozenset[int], model: PerfModel | None = None) -> LevelModel:
    """The level model the search would solve for these failures (for export and benchmarks).

    Raises InfeasibleError when no template fits."""
    model = model or PerfModel(instance)
    space = search_space(instance, failed, model)
    hint = heuristic_mix(space.templates, space.budget, space.total) if space.templates else None
    if hint is None:
        raise InfeasibleError(infeasibility_reason(instance, model, space.groups))
    bound = lp_lower_bound(space.templates, space.budget, space.total)
    hint = bound_guided_mix(space.templates, space.budget, space.total, hint)
    return level_model(space.templates, space.budget, space.total, hint, bound if math.isfinite(bound) else 0.0)


def _template_plan(instance: Instance, failed: frozenset[int], deadline: Deadline, options: SolverOptions,
                   model: PerfModel) -> SolveResult[Plan]:
    """The scale path's incumbent: single-type pipeline templates chosen by the level model, then
    polished on the exact model. Its status and bound speak of the template model only;
    `search_plan` replaces them with ones that hold for the exact model.

    Order of work: templates; warm starts (the best single template, the previous plan restricted
    to the survivors); the relaxation bound; the knapsack-guided incumbent; when the
    incumbent meets the bound it is returned as proven (backend 'bound'), otherwise the level
    model is solved by `options.backend` within what is left before `deadline`. Each step past
    the deadline is skipped (a skipped bound is 0), and the answer is then HEURISTIC."""
    start = time.perf_counter()
    backend, seed = options.backend, options.seed
    space = search_space(instance, failed, model, deadline.end)
    templates, budget, total = space.templates, space.budget, space.total
    everything = max((t.pipeline_time(total) for t in templates), default=0.0) + 1.0
    starts = [heuristic_mix(templates, budget, total),
              restricted_mix(instance.plan, failed, templates, budget, total, model),
              cover_mix(templates, list(range(len(templates))), budget, total, everything)]
    starts = [mix for mix in starts if mix is not None] if templates else []
    if not starts and deadline.expired():
        return SolveResult(Status.NO_SOLUTION, None, None, None, 0.0, backend, time.perf_counter() - start, seed,
                           "the deadline passed while the templates were built", stopped_early=True)
    if not starts:
        reason = infeasibility_reason(instance, model, space.groups)
        if templates:
            most = sum(_cap(templates[k], everything) * n for name, groups in budget.items()
                       for k, n in _best_counts([(k, t.stages, _cap(t, everything)) for k, t in enumerate(templates)
                                                 if t.device_type == name], groups).items())
            reason = (f"the pipelines that fit in memory can run at most {most} of the {total} micro-batches "
                      "(fewer micro-batches in flight is what lets them fit)")
        return SolveResult(Status.INFEASIBLE, None, None, None, 0.0, backend, time.perf_counter() - start, seed, reason)
    hint = min(starts, key=lambda mix: _rank(templates, mix))
    relaxation = lp_lower_bound(templates, budget, total, deadline.end)
    relaxation = relaxation if math.isfinite(relaxation) else 0.0
    hint = bound_guided_mix(templates, budget, total, hint, deadline.end)
    warm = modelled_time(templates, hint)

    def finish(mix: Mix, status: Status, bound: float, wall: float, used: str, build: float, why: str):
        tp = instance.plan.tensor_parallel
        plan = lower(templates, mix, space.groups_by_type, tp)
        # Exact polish: the model's 1F1B and sync terms are surrogates, so its neighbours are
        # evaluated exactly and the faster plan kept (ties in the surrogate hide real differences).
        evaluating = time.perf_counter()
        plan, best_time = relieved(model, plan, failed)
        # The polish is optional: each of its exact evaluations (0.1-0.5 s at 16,384-131,072 devices)
        # starts only while one more and the final check still fit before the deadline.
        evaluation_s = time.perf_counter() - evaluating
        polish = Deadline(deadline.end - 2 * evaluation_s)
        if not math.isfinite(best_time) and mix is not hint:  # the exact memory model refuses the solver's mix
            plan, best_time = relieved(model, lower(templates, hint, space.groups_by_type, tp), failed)
            mix, why = hint, why + "; the solver's mix overflows the exact memory model, the incumbent kept"
        objective = modelled_time(templates, mix)  # the model's answer; the polish below may beat it
        balanced = rebalance_exact(model, plan, polish.end)
        if balanced != plan and not polish.expired():
            balanced, value = relieved(model, balanced, failed)
            if value < best_time * (1 - 1e-12):
                plan, best_time = balanced, value
                why += "; micro-batches rebalanced on exact 1F1B times"
        neighbours = [] if polish.expired() else neighbour_mixes(templates, budget, total, mix)  # 0.05 s at 16k
        for other in neighbours[:POLISH_CANDIDATES]:
            if polish.left() < evaluation_s:
                break
            candidate, value = relieved(model, rebalance_exact(
                model, lower(templates, other, space.groups_by_type, tp), polish.end), failed)
            if value < best_time * (1 - 1e-12):
                plan, best_time, mix = candidate, value, other
                why += "; a neighbouring mix is faster when evaluated exactly"
        polished = rebalance_exact(model, polish_splits(model, plan, polish.end), polish.end) \
            if polish.left() >= evaluation_s else plan
        if polished != plan:
            polished, value = relieved(model, polished, failed)
            if value < best_time * (1 - 1e-12):
                plan = polished
                why += "; layer splits polished on the exact 1F1B time"
        if not math.isfinite(best_time):  # no plan the exact model accepts: none leaves this path
            return SolveResult(Status.NO_SOLUTION, None, None, None, wall, used, build, seed,
                               f"the template plans overflow the exact memory model ({why})")
        plan = assert_sound(instance, plan, failed, model=model, stage="search (template path)")
        bound = min(bound, objective)
        if status is not Status.HEURISTIC and objective - bound <= 1e-9 * objective:
            status = Status.OPTIMAL
        return SolveResult(status, plan, objective, bound, wall, used, build, seed,
                           f"{sum(mix.counts)} pipelines from {len(templates)} templates; {why}")

    if warm - relaxation <= 1e-9 * warm:
        return finish(hint, Status.OPTIMAL, relaxation, 0.0, "bound", time.perf_counter() - start,
                      "the constructive plan meets the relaxation bound")
    remaining = deadline.left()
    if remaining < 0.05 + (cpsat_start_s() if backend == "cpsat" else 0.0):
        return finish(hint, Status.HEURISTIC, relaxation, 0.0, "knapsack", time.perf_counter() - start,
                      "no time left for the level model: the knapsack-guided incumbent")
    lm = level_model(templates, budget, total, hint, relaxation)
    status, mix, bound, build_s, wall = solve_level_model(lm, backend, deadline.left(), options=options)
    build_s = time.perf_counter() - start - wall  # templates, bounds, incumbent and model building
    bound = max(bound if bound is not None else 0.0, relaxation)
    if status is None or mix is None:
        return finish(hint, Status.HEURISTIC, bound, wall, backend, build_s,
                      f"{backend} found no solution in {remaining:.2f} s: the knapsack-guided incumbent")
    if modelled_time(templates, mix) > warm:
        return finish(hint, Status.FEASIBLE, bound, wall, backend, build_s,
                      f"the incumbent beats {backend}'s best within {remaining:.2f} s")
    return finish(mix, status, bound, wall, backend, build_s, f"solved by {backend}")


def _exact_value(model: PerfModel, plan: Plan | None, failed: frozenset[int]) -> tuple[Plan | None, float]:
    """A plan with its best reliefs and its exact step (inf when none or it fits no relief)."""
    return (None, math.inf) if plan is None else relieved(model, plan, failed)


def search_plan(instance: Instance, failed: frozenset[int] = frozenset(), time_limit_s: float = 10.0,
                threads: int = 1, seed: int = 0, model: PerfModel | None = None,
                backend: str = "cpsat", *, deadline: Deadline | None = None,
                options: SolverOptions | None = None) -> SolveResult[Plan]:
    """The fastest reconfigured plan over the survivors, exact for the performance model.

    Incumbents: the template path (scale, TEMPLATE_SHARE of the time), the paper's enumeration
    (within a share of the time limit). Proof: branch and bound over the whole space (`exact.py`)
    when it is small enough, else the relaxation bound (`bounds.py`). `objective` is the returned
    plan's exact step, `bound` a lower bound on the exact step of every plan in SPACE, OPTIMAL
    only when they meet within OPTIMALITY_TOLERANCE; every plan passes the checker. `deadline`
    (else `time_limit_s` from now) bounds the whole search; `stopped_early` says it ran out
    before proving its answer."""
    start = time.perf_counter()
    deadline = deadline or Deadline.after(time_limit_s, start)
    options = options or SolverOptions(backend, threads, seed)
    seed = options.seed
    budget_s = max(deadline.end - start, 0.0)
    model = model or PerfModel(instance)
    if deadline.left() < MIN_SEARCH_S:
        return SolveResult(Status.NO_SOLUTION, None, None, None, 0.0, options.backend, 0.0, seed,
                           f"not started: {deadline.left():.3f} s left of the decision's time limit",
                           stopped_early=True)
    tp = instance.plan.tensor_parallel
    live = [d for d in range(instance.num_devices) if d not in failed]
    floor = memory_floor(model, survivor_groups(instance, failed, tp), instance.global_micro_batches, live)
    if floor.stages is None:  # proven before any enumeration: nothing in the space fits in memory
        return SolveResult(Status.INFEASIBLE, None, None, None, time.perf_counter() - start, "bound", 0.0, seed,
                           f"{floor.reason}; space: {SPACE}")
    template = _template_plan(instance, failed, deadline.share(TEMPLATE_SHARE), options, model)
    # The template path's own label 'bound' (its incumbent met its surrogate bound) says nothing about
    # the exact model: name the path instead.
    plan, used = template.solution, ("templates" if template.backend == "bound" else template.backend)
    plan, value = _exact_value(model, plan, failed)
    if len(model.relief_options) > 1 and not deadline.expired():
        # Relieved templates look fast to the level model's surrogate (fastest time, lightest
        # memory) and can mislead it: the templates without relief compete on the exact model.
        plain = _template_plan(instance, failed, deadline.share(TEMPLATE_SHARE / 2), options,
                               model.restricted_to((model.fastest_relief,)))
        plain_plan, plain_value = _exact_value(model, plain.solution, failed)
        if plain_value < value * (1 - 1e-12):
            template, plan, value, used = plain, plain_plan, plain_value, plain.backend
    notes = [f"template path ({template.backend}): {template.reason}" if plan is not None
             else f"template path: {template.reason}"]
    if not deadline.expired():  # pipelines of mixed device types, largest memory in front (solve/mixed.py)
        mixed = mixed_plans(instance, failed, model, deadline.share(MIXED_SHARE), floor.stages)
        if mixed and mixed[0][1] < value * (1 - 1e-12):
            plan, value, used = mixed[0][0], mixed[0][1], "mixed"
            notes.append(f"a pipeline set of mixed device types is faster ({len(mixed[0][0].pipelines)} pipelines)")
    exact = None
    if not deadline.expired():
        exact = exact_search(instance, model, failed, value, deadline.end)
    if exact is None and len(survivor_groups(instance, failed, tp)) <= ENUMERATION_GROUPS and not deadline.expired():
        share = min(budget_s * ENUMERATION_SHARE, deadline.left())
        paper = enumerate_plans(instance, failed, time_limit_s=max(share, 0.01), model=model)
        paper_plan, paper_value = _exact_value(model, paper.solution, failed)
        if paper_value < value * (1 - 1e-12):
            plan, value, used = paper_plan, paper_value, "enumeration"
            notes.append(f"the paper's enumeration ({paper.status.value}) found a faster plan")
    if exact is not None:
        notes.append(exact.reason)
        if exact.plan is not None and exact.objective < value * (1 - 1e-12):
            plan, value, used = exact.plan, exact.objective, "branch-and-bound"
    groups = survivor_groups(instance, failed, tp)
    if exact is not None and exact.complete:
        bound: float | None = value
    elif deadline.expired():  # no time for the relaxation (seconds at 16,384 devices): the gap is unknown,
        bound = None          # and with no plan, infeasibility unproven (NO_SOLUTION): both said so
        notes.append("no time left for the relaxation bound")
    else:
        bound = relaxation_bound(model, groups, instance.global_micro_batches, live, deadline.end)
    wall = time.perf_counter() - start
    space = f"space: {SPACE}"
    if plan is None or not math.isfinite(value):
        if (exact is not None and exact.complete) or (bound is not None and not math.isfinite(bound)):
            reason = template.reason if template.status is Status.INFEASIBLE else \
                infeasibility_reason(instance, model, groups)
            return SolveResult(Status.INFEASIBLE, None, None, None, wall, used, 0.0, seed, f"{reason}; {space}")
        return SolveResult(Status.NO_SOLUTION, None, None, bound, wall, used, 0.0, seed,
                           "no plan found in time; " + "; ".join(notes) + f"; {space}", stopped_early=True)
    plan = assert_sound(instance, plan, failed, model=model, stage="search")
    bound = None if bound is None else min(bound, value)
    status = Status.OPTIMAL if bound is not None and value - bound <= OPTIMALITY_TOLERANCE * value else Status.FEASIBLE
    if status is Status.OPTIMAL and exact is not None and exact.complete:
        notes.append("proven: the branch and bound exhausted the space")
    elif status is Status.OPTIMAL:
        notes.append("proven: the plan meets the relaxation bound")
    elif bound is not None:
        notes.append("not proven optimal: the bound is the relaxation's (a lower bound of the exact model)")
    stopped = status is not Status.OPTIMAL and deadline.expired()
    if stopped:
        notes.append(f"stopped at the deadline ({budget_s:.2f} s)")
    return SolveResult(status, plan, value, bound, wall, used, 0.0, seed, "; ".join(notes) + f"; {space}",
                       stopped_early=stopped)
