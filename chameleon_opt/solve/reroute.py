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
    as many micro-batches as it has stages (the normal regime) and conservative otherwise. Where the
    trainer supports several memory reliefs, Q is taken under the lightest and each peer's relief is
    then chosen exactly for the shares found (perf/relief.py).
"""

from __future__ import annotations

import dataclasses
import math
import time

from chameleon_opt.check import assert_sound, check_plan
from chameleon_opt.errors import InfeasibleError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.relief import choose_reliefs
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.plan import Pipeline, Plan, Reroute
from chameleon_opt.solve.backends import DEFAULT, SolverOptions, heuristic, solve_pulp
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.result import SolveResult, Status

MIN_SOLVE_S = 0.02
"""Below this much time left after building, HiGHS is not started (its start-up alone is longer)."""
AFTER_SOLVE_EVALUATIONS = 1.5
"""What the MILP's answer costs after the solve, in evaluations of the even split (its exact
evaluation and the checker: 0.15-0.3 s at 16,384 devices), kept back from HiGHS's time limit."""


def _peer_capacity(model: PerfModel, plan: Plan, k: int, s: int, replicas: int, cap: int) -> int:
    """Q: micro-batches in flight whose activations fit on stage s of pipeline k beside its static
    state (optimizer sharded over `replicas` live holders when the distributed optimizer is on).

    Capped at `cap`, a value at which the memory rows can no longer bind: an uncapped Q of 1e15
    (a device with 1e12 GiB) makes the MILP so ill-scaled that HiGHS returns a solution pulp
    cannot read back."""
    stage = plan.pipelines[k].stages[s]
    costs = model.relief_layer_costs(stage.devices, replicas)  # memory under the lightest relief
    static = float(costs.static_bytes[stage.first:stage.end].sum()) + costs.transient_bytes
    per_micro_batch = float(costs.activation_bytes[stage.first:stage.end].sum())
    if per_micro_batch <= 0:
        return cap
    return min(max(int(math.floor((costs.capacity_bytes - static) / per_micro_batch)), 0), cap)


def _time_signature(model: PerfModel, pipe: Pipeline) -> tuple:
    """What a pipeline's per-micro-batch stage times depend on (`PerfModel.stage_costs`): per stage
    its device type, TP size, layers, relief and whether its TP group spans nodes, and the link to
    the next stage. At 16,384 devices 128 pipelines share one signature."""
    node = model.instance.node_of
    stages = pipe.stages
    return tuple((id(model.stage_device(st.devices)), len(st.devices), st.first, st.end, st.relief,
                  len({node(d) for d in st.devices}) > 1,
                  s + 1 < len(stages) and model.link_between(st.devices[0], stages[s + 1].devices[0]) is model.intra)
                 for s, st in enumerate(stages))


def reroute_plan(instance: Instance, failed: frozenset[int], deadline: Deadline, options: SolverOptions = DEFAULT,
                 model: PerfModel | None = None) -> SolveResult[Plan]:
    """The best rerouting of the instance's plan after `failed`, checked; INFEASIBLE with the
    reason when some failed stage has no live peer holding its layers, or memory forbids.

    `objective` and `bound` are the MILP's (the surrogate makespan above). When the even split is
    returned instead (HiGHS found nothing by the deadline, or the even split runs faster when
    evaluated exactly) the result is HEURISTIC with the even split's exact step and no bound.
    `deadline` bounds building and solving."""
    start = time.perf_counter()
    seed = options.seed
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

    evaluating = deadline.now()  # the fallback and the yardstick are priced first, and timed (on the
    model.evaluate(even, failed)  # deadline's clock: a deterministic one's stands still)
    evaluation_s = deadline.now() - evaluating

    def even_split(why: str, wall: float = 0.0) -> SolveResult[Plan]:
        estimate = model.evaluate(even, failed)
        build_s = time.perf_counter() - start - wall
        if not estimate.memory_ok:
            return SolveResult(Status.NO_SOLUTION, None, None, None, wall, "highs", build_s, seed,
                               f"{why}; the even split overflows memory", stopped_early=deadline.expired())
        checked = assert_sound(instance, even, failed, require_tp_in_node=False, model=model)
        result = heuristic(checked, estimate.iteration_time_s, "even-split", f"{why}: the even split (Eq. 12/13)",
                           wall, build_s, seed)
        return dataclasses.replace(result, stopped_early=deadline.expired())

    pipes = plan.pipelines
    cost = {}  # (k, s) -> per micro-batch seconds (blocking sends included)
    shape = []  # (fill, bottleneck) per pipeline
    priced: dict[tuple, list[float]] = {}  # pipelines alike in what their times depend on are priced once
    for k in range(len(pipes)):
        if deadline.expired():
            return even_split("the deadline passed while pricing the peers for the rerouting MILP")
        key = _time_signature(model, pipes[k])
        if key not in priced:
            priced[key] = [c.op_forward_s + c.op_backward_s
                           for c in model.stage_costs(plan, k, [0.0] * len(pipes[k].stages))]
        times = priced[key]
        shape.append((sum(times), max(times)))
        for s, t in enumerate(times):
            cost[(k, s)] = t
    peers = {(j, s): [k for k in range(len(pipes)) if (k, s) not in dead and s < len(pipes[k].stages)
                      and (pipes[k].stages[s].first, pipes[k].stages[s].end)
                      == (pipes[j].stages[s].first, pipes[j].stages[s].end)] for j, s in dead}

    holders = model.layer_holders(plan, frozenset(dead))
    # (S - s)(m_k + r) <= S * 2N whatever the shares, and Q >= S - s keeps m_k free: no row binds
    cap = 2 * total * max(len(p.stages) for p in pipes)
    quotas: dict[tuple[int, int, int, int, int], int] = {}

    def quota(k: int, s: int) -> int:
        """_peer_capacity, once per (device type, TP, replicas, layers): 2,000 slots at 16,384
        devices share a handful."""
        stage = pipes[k].stages[s]
        replicas = len(holders[stage.first])
        key = (id(model.stage_device(stage.devices)), len(stage.devices), replicas, stage.first, stage.end)
        if key not in quotas:
            quotas[key] = _peer_capacity(model, plan, k, s, replicas, cap)
        return quotas[key]

    import pulp  # here, not at the top: a rerouting the even split settles never builds the MILP

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
        if deadline.expired():
            return even_split("the deadline passed while building the rerouting MILP")
        extra = pulp.lpSum(cost[(k, s)] * r for s, r in load[k])
        problem += makespan >= fill + bottleneck * (own[k] - 1) + extra
        for s, r in load[k]:
            problem += (len(pipes[k].stages) - s) * (own[k] + r) <= quota(k, s) * own[k]
        for s in range(len(pipes[k].stages)):  # more of its own micro-batches raise min(S - s, m) in flight
            if (k, s) in dead:
                continue
            if quota(k, s) < len(pipes[k].stages) - s:
                problem += own[k] <= quota(k, s)
    problem += makespan
    solve_s = deadline.left() - AFTER_SOLVE_EVALUATIONS * evaluation_s  # the answer is priced in time too
    if solve_s < MIN_SOLVE_S:
        return even_split(f"no time left for the rerouting MILP after building it ({deadline.left():.2f} s)")
    outcome = solve_pulp(problem, solve_s, options, "highs", mip_rel_gap=1e-6)
    wall = outcome.wall_s
    build_s = time.perf_counter() - start - wall
    if outcome.status is Status.INFEASIBLE:
        return SolveResult(Status.INFEASIBLE, None, None, None, wall, "highs", build_s, seed,
                           "no share of the failed stages' work fits the peers' memory")
    if not outcome.has_solution:
        return even_split(f"HiGHS found nothing in time ({outcome.detail})", wall)
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
    if len(model.relief_options) > 1:  # the peers' memory rows assumed the lightest relief: choose each
        relieved = choose_reliefs(model, result, failed)
        result = relieved[0] if relieved is not None else result
    report = check_plan(instance, result, failed, require_tp_in_node=False, model=model)
    mine = model.evaluate(result, failed).iteration_time_s if report.ok else math.inf
    even_estimate = model.evaluate(even, failed)
    if even_estimate.memory_ok and even_estimate.iteration_time_s < mine:
        return even_split("the MILP's shares are slower when evaluated exactly" if report.ok else
                          f"the model's plan was rejected ({report.violations[0]})", wall)
    if not report.ok:
        return SolveResult(Status.NO_SOLUTION, None, None, None, wall, "highs", build_s, seed,
                           f"the model's plan was rejected ({report.violations[0]}) and the even split "
                           "overflows memory")
    result = assert_sound(instance, result, failed, require_tp_in_node=False, model=model)
    objective = float(pulp.value(makespan))
    bound = None if outcome.bound is None else min(outcome.bound, objective)
    return SolveResult(outcome.status, result, objective, bound, wall,
                       "highs", build_s, seed, f"{len(result.rerouted)} peer shares for {len(dead)} failed stage slots",
                       stopped_early=outcome.status is Status.FEASIBLE and deadline.expired())
