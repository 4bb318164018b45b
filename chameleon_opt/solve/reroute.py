"""Rerouting with decided shares: the layout stays, a MILP decides who computes what.

Beyond the paper's even split (Eq. 12/13): when failures hit different stages, peers differ in
load, so each peer's share is a decision; micro-batches may also move between pipelines (a
damaged pipeline can run fewer of its own). Pipeline k with m_k own micro-batches and r_{k,s}
rerouted ones at stage s takes (1F1B surrogate, exact for uniform stages)

    T_k = fill_k + (m_k - 1) b_k + sum_s r_{k,s} c_{k,s}

where c_{k,s} is stage s's per-micro-batch time. Shares are continuous, as in Eq. 12/13 (a
micro-batch can be cut into sample groups: with many peers the even split's fractions beat any
whole-micro-batch split), own counts integral; a MILP with few integers, which HiGHS solves well:
    sum_k m_k = N;  for each failed slot (j, s): sum_k r_{k,s} = m_j over live peers k holding
    the same layers at stage s;  memory of a peer: its in-flight count grows with its load in
    proportion, (S - s)(m_k + r_{k,s}) <= Q_{k,s} m_k, with Q_{k,s} the micro-batches whose
    activations fit beside the stage's static state (so idle pipelines take no rerouted work);
    minimise max_k T_k over the busy pipelines. The memory row is exact when a pipeline runs at least
    as many micro-batches as it has stages (the normal regime) and conservative otherwise.
"""

from __future__ import annotations

import math
import time

import pulp

from chameleon_opt.check import assert_sound, check_plan
from chameleon_opt.errors import InfeasibleError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.plan import Pipeline, Plan, Reroute
from chameleon_opt.solve.result import SolveResult, Status

def _peer_capacity(model: PerfModel, plan: Plan, k: int, s: int, replicas: int, cap: int) -> int:
    """Q: micro-batches in flight whose activations fit on stage s of pipeline k beside its static
    state (optimizer sharded over `replicas` live holders when the distributed optimizer is on).

    Capped at `cap`, a value at which the memory rows can no longer bind: an uncapped Q of 1e15
    (a device with 1e12 GiB) makes the MILP so ill-scaled that HiGHS returns a solution pulp
    cannot read back."""
    stage = plan.pipelines[k].stages[s]
    costs = model.layer_costs(stage.devices, replicas)
    static = float(costs.static_bytes[stage.first:stage.end].sum()) + costs.transient_bytes
    per_micro_batch = float(costs.activation_bytes[stage.first:stage.end].sum())
    if per_micro_batch <= 0:
        return cap
    return min(max(int(math.floor((costs.capacity_bytes - static) / per_micro_batch)), 0), cap)


def reroute_plan(instance: Instance, failed: frozenset[int], time_limit_s: float = 5.0, threads: int = 1,
                 seed: int = 0, model: PerfModel | None = None) -> SolveResult[Plan]:
    """The best rerouting of the instance's plan after `failed`, checked; INFEASIBLE with the
    reason when some failed stage has no live peer holding its layers, or memory forbids."""
    start = time.perf_counter()
    model = model or PerfModel(instance)
    plan = instance.plan
    total = instance.global_micro_batches
    dead = sorted((j, s) for j, p in enumerate(plan.pipelines) for s, st in enumerate(p.stages)
                  if failed.intersection(st.devices))
    try:
        even = even_reroute(plan, failed)
    except InfeasibleError as err:
        return SolveResult(Status.INFEASIBLE, None, None, None, 0.0, "highs", time.perf_counter() - start, seed,
                           err.reason)
    pipes = plan.pipelines
    cost = {}  # (k, s) -> per micro-batch seconds (blocking sends included)
    shape = []  # (fill, bottleneck) per pipeline
    for k in range(len(pipes)):
        costs = model.stage_costs(plan, k, [0.0] * len(pipes[k].stages))
        times = [c.op_forward_s + c.op_backward_s for c in costs]
        shape.append((sum(times), max(times)))
        for s, t in enumerate(times):
            cost[(k, s)] = t
    peers = {(j, s): [k for k in range(len(pipes)) if (k, s) not in dead and s < len(pipes[k].stages)
                      and (pipes[k].stages[s].first, pipes[k].stages[s].end)
                      == (pipes[j].stages[s].first, pipes[j].stages[s].end)] for j, s in dead}

    holders = model.layer_holders(plan, frozenset(dead))
    # (S - s)(m_k + r) <= S * 2N whatever the shares, and Q >= S - s keeps m_k free: no row binds
    cap = 2 * total * max(len(p.stages) for p in pipes)
    problem = pulp.LpProblem("reroute", pulp.LpMinimize)
    makespan = problem.add_variable("T", 0)
    damaged = {j for j, _ in dead}
    # Intact pipelines keep at least one micro-batch; a damaged one may hand all of its own over
    # (then its bound below is slack and, holding no micro-batch, it can take no rerouted work).
    own = [problem.add_variable(f"m{k}", 0 if k in damaged else 1, total, pulp.LpInteger) for k in range(len(pipes))]
    problem += pulp.lpSum(own) == total
    shares: dict[tuple[int, int, int], pulp.LpVariable] = {}
    load: dict[int, list] = {k: [] for k in range(len(pipes))}
    for (j, s), helpers in peers.items():
        for k in helpers:
            shares[(j, s, k)] = problem.add_variable(f"r{j}_{s}_{k}", 0, total)
            load[k].append((s, shares[(j, s, k)]))
        problem += pulp.lpSum(shares[(j, s, k)] for k in helpers) == own[j]
    for k, (fill, bottleneck) in enumerate(shape):
        extra = pulp.lpSum(cost[(k, s)] * r for s, r in load[k])
        problem += makespan >= fill + bottleneck * (own[k] - 1) + extra
        for s, r in load[k]:
            quota = _peer_capacity(model, plan, k, s, len(holders[pipes[k].stages[s].first]), cap)
            problem += (len(pipes[k].stages) - s) * (own[k] + r) <= quota * own[k]
        for s in range(len(pipes[k].stages)):  # more of its own micro-batches raise min(S - s, m) in flight
            if (k, s) in dead:
                continue
            quota = _peer_capacity(model, plan, k, s, len(holders[pipes[k].stages[s].first]), cap)
            if quota < len(pipes[k].stages) - s:
                problem += own[k] <= quota
    problem += makespan
    solver = pulp.HiGHS(msg=False, timeLimit=max(time_limit_s - (time.perf_counter() - start), 0.05),
                        threads=threads, random_seed=seed, mip_rel_gap=1e-6)
    problem.solve(solver)
    highs = problem.solverModel
    wall = highs.getRunTime()
    build_s = time.perf_counter() - start - wall
    model_status = highs.modelStatusToString(highs.getModelStatus())
    info = highs.getInfo()
    if model_status == "Infeasible":
        return SolveResult(Status.INFEASIBLE, None, None, None, wall, "highs", build_s, seed,
                           "no share of the failed stages' work fits the peers' memory")
    if info.primal_solution_status != 2:
        fallback = even if model.evaluate(even, failed).memory_ok else None
        status = Status.HEURISTIC if fallback else Status.NO_SOLUTION
        return SolveResult(status, fallback and assert_sound(instance, fallback, failed, require_tp_in_node=False,
                                                              model=model),
                           None, None, wall, "highs", build_s, seed,
                           f"HiGHS found nothing in time ({model_status}); "
                           + ("the even split (Eq. 12/13)" if fallback else "the even split overflows memory"))
    counts = [int(round(v.varValue or 0)) for v in own]
    reroutes = tuple(Reroute(j, s, k, float(r.varValue)) for (j, s, k), r in shares.items() if (r.varValue or 0) > 1e-9)
    kept = tuple(Pipeline(p.stages, m) for p, m in zip(pipes, counts))
    # Pipelines left with no micro-batch of their own are dropped (their live devices idle).
    live = [k for k, m in enumerate(counts) if m > 0]
    index = {k: i for i, k in enumerate(live)}
    result = Plan(plan.tensor_parallel, tuple(kept[k] for k in live),
                  tuple(Reroute(index[r.from_pipeline], r.stage, index[r.to_pipeline], r.micro_batches)
                        for r in reroutes))
    # The model is linear and time-limited: keep the even split when it is faster or when the
    # model's plan fails the checker (its memory rows are conservative, but say so if not).
    fallback_why = ""
    report = check_plan(instance, result, failed, require_tp_in_node=False, model=model)
    mine = model.evaluate(result, failed).iteration_time_s if report.ok else math.inf
    even_estimate = model.evaluate(even, failed)
    if even_estimate.memory_ok and even_estimate.iteration_time_s < mine:
        result = even
        fallback_why = ("; the even split is faster when evaluated exactly" if report.ok else
                        f"; the model's plan was rejected ({report.violations[0]}), the even split is used")
    elif not report.ok:
        return SolveResult(Status.NO_SOLUTION, None, None, None, wall, "highs", build_s, seed,
                           f"the model's plan was rejected ({report.violations[0]}) and the even split "
                           "overflows memory")
    result = assert_sound(instance, result, failed, require_tp_in_node=False, model=model)
    objective = float(pulp.value(makespan))
    bound = float(info.mip_dual_bound)
    status = Status.OPTIMAL if model_status == "Optimal" else Status.FEASIBLE
    return SolveResult(status, result, objective, min(bound, objective), wall, "highs", build_s, seed,
                       f"{len(result.rerouted)} peer shares for {len(dead)} failed stage slots{fallback_why}")
