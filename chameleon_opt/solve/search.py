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

from ortools.sat.python import cp_model

from chameleon_opt.check import assert_sound
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.microbatch import allocate_greedy
from chameleon_opt.solve.result import SolveResult, Status
from chameleon_opt.solve.templates import Template, build_templates

TIME_SCALE = 1e6  # seconds -> integer microseconds


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
        shares = allocate_greedy([template.fill_s] * count, [template.per_micro_batch_s] * count, total).solution
        if shares is None:
            continue
        counts = tuple(count if i == k else 0 for i in range(len(templates)))
        mix = Mix(counts, tuple(tuple(shares) if i == k else () for i in range(len(templates))))
        value = modelled_time(templates, mix)
        if best is None or value < best[0]:
            best = (value, mix)
    return None if best is None else best[1]


def _ceil(seconds: float) -> int:
    return int(math.ceil(seconds * TIME_SCALE))


def solve_mix_cpsat(templates: list[Template], budget: dict[str, int], total: int, time_limit_s: float,
                    threads: int, seed: int, hint: Mix | None) -> tuple[int, Mix | None, float | None, float, float]:
    """Build and solve the template-mix model. Returns (cp status, mix, bound_s, build_s, wall_s)."""
    build_start = time.perf_counter()
    model = cp_model.CpModel()
    count_vars, share_vars, extra_vars, used_vars, extra_used = [], [], [], [], []
    products = []
    for k, t in enumerate(templates):
        most = min(budget[t.device_type] // t.stages, total)
        n = model.NewIntVar(0, most, f"n{k}")
        m = model.NewIntVar(1, total, f"m{k}")
        e = model.NewIntVar(0, most, f"e{k}")
        used = model.NewBoolVar(f"used{k}")
        has_extra = model.NewBoolVar(f"extra{k}")
        product = model.NewIntVar(0, most * total, f"nm{k}")
        model.AddMultiplicationEquality(product, [n, m])
        model.Add(n >= 1).OnlyEnforceIf(used)
        model.Add(n == 0).OnlyEnforceIf(used.Not())
        model.Add(e <= n)
        model.Add(e >= 1).OnlyEnforceIf(has_extra)
        model.Add(e == 0).OnlyEnforceIf(has_extra.Not())
        count_vars.append(n), share_vars.append(m), extra_vars.append(e)
        used_vars.append(used), extra_used.append(has_extra), products.append(product)
    model.Add(sum(products) + sum(extra_vars) == total)
    for name, groups in budget.items():
        model.Add(sum(t.stages * count_vars[k] for k, t in enumerate(templates) if t.device_type == name) <= groups)
    horizon = max(_ceil(t.fill_s + total * t.per_micro_batch_s) for t in templates)
    makespan = model.NewIntVar(0, horizon, "T")
    sync = model.NewIntVar(0, max(_ceil(t.sync_s) for t in templates), "Y")
    pipelines = sum(count_vars)
    for k, t in enumerate(templates):
        fill, per = _ceil(t.fill_s), _ceil(t.per_micro_batch_s)
        model.Add(makespan >= fill + per * (share_vars[k] - 1)).OnlyEnforceIf(used_vars[k])
        model.Add(makespan >= fill + per * share_vars[k]).OnlyEnforceIf(extra_used[k])
        model.Add(sync >= _ceil(t.sync_s)).OnlyEnforceIf(used_vars[k])
        if t.min_pipelines > 1:
            model.Add(pipelines >= t.min_pipelines).OnlyEnforceIf(used_vars[k])
    model.Minimize(makespan + sync)
    if hint is not None:
        for k, shares in enumerate(hint.micro_batches):
            model.AddHint(count_vars[k], hint.counts[k])
            model.AddHint(share_vars[k], min(shares) if shares else 1)
            model.AddHint(extra_vars[k], sum(1 for s in shares if s > min(shares)) if shares else 0)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s - (time.perf_counter() - build_start), 0.05)
    solver.parameters.num_workers = threads
    solver.parameters.random_seed = seed
    build_s = time.perf_counter() - build_start
    start = time.perf_counter()
    status = solver.Solve(model)
    wall = time.perf_counter() - start
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return status, None, None, build_s, wall
    counts, shares = [], []
    for k in range(len(templates)):
        n, m, e = (int(solver.Value(v[k])) for v in (count_vars, share_vars, extra_vars))
        counts.append(n)
        shares.append(tuple([m + 1] * e + [m] * (n - e)))
    # Each coefficient was rounded up by < 1 us, a pipeline's time by < (1 + m) us in all.
    slack = (1 + total) / TIME_SCALE * 2
    bound = max(solver.BestObjectiveBound() / TIME_SCALE - slack, 0.0)
    return status, Mix(tuple(counts), tuple(shares)), bound, build_s, wall


def infeasibility_reason(instance: Instance, model: PerfModel, groups: list[tuple[int, ...]]) -> str:
    """Why no template fits: total model state against total survivor memory."""
    if not groups:
        return "no surviving TP group: every node lost too many devices for one TP group"
    state = float(model.workload.params.sum()) * (model.param_bytes + model.grad_bytes + model.optimizer_bytes)
    capacity = sum(model.layer_costs(g).capacity_bytes * len(g) for g in groups)
    return (f"no pipeline of up to {min(len(groups), instance.workload.num_layers)} stages fits in memory: "
            f"survivors hold {capacity / GIB:,.1f} GiB, model state alone needs {state / GIB:,.1f} GiB "
            f"(plus activations)")


def search_plan(instance: Instance, failed: frozenset[int] = frozenset(), time_limit_s: float = 10.0,
                threads: int = 1, seed: int = 0, model: PerfModel | None = None) -> SolveResult[Plan]:
    """The best reconfigured plan over the survivors; never unchecked, never silently heuristic."""
    start = time.perf_counter()
    model = model or PerfModel(instance)
    tp = instance.plan.tensor_parallel
    groups = survivor_groups(instance, failed, tp)
    groups_by_type: dict[str, list[tuple[int, ...]]] = {}
    for group in groups:
        groups_by_type.setdefault(model.stage_device(group).name, []).append(group)
    budget = {name: len(members) for name, members in groups_by_type.items()}
    total = instance.global_micro_batches
    templates = build_templates(model, groups)
    template_s = time.perf_counter() - start
    if not templates:
        return SolveResult(Status.INFEASIBLE, None, None, None, 0.0, "cpsat", template_s, seed,
                           infeasibility_reason(instance, model, groups))
    hint = heuristic_mix(templates, budget, total)
    remaining = max(time_limit_s - template_s, 0.05)
    status, mix, bound, build_s, wall = solve_mix_cpsat(templates, budget, total, remaining, threads, seed, hint)
    if status == cp_model.INFEASIBLE:
        return SolveResult(Status.INFEASIBLE, None, None, None, wall, "cpsat", template_s + build_s, seed,
                           "no mix of pipelines fits the survivors: " + infeasibility_reason(instance, model, groups))
    if mix is None:
        if hint is None:
            return SolveResult(Status.NO_SOLUTION, None, None, None, wall, "cpsat", template_s + build_s, seed,
                               f"CP-SAT found nothing in {remaining:.2f} s and no heuristic plan exists")
        plan = assert_sound(instance, lower(templates, hint, groups_by_type, tp), failed, model=model)
        return SolveResult(Status.HEURISTIC, plan, modelled_time(templates, hint), None, wall, "cpsat",
                           template_s + build_s, seed, "CP-SAT found nothing in time: best single-template plan")
    plan = assert_sound(instance, lower(templates, mix, groups_by_type, tp), failed, model=model)
    ours = Status.OPTIMAL if status == cp_model.OPTIMAL else Status.FEASIBLE
    objective = modelled_time(templates, mix)
    return SolveResult(ours, plan, objective, min(bound if bound is not None else objective, objective), wall,
                       "cpsat", template_s + build_s, seed,
                       f"{sum(mix.counts)} pipelines from {len(templates)} templates")
