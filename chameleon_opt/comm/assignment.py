"""Which live TP group takes which slot of the new plan: the paper's min-cost bipartite matching.

The search decides the new plan's shape (pipelines, stages, layer ranges) and places it on TP
groups in device order; which group runs which (pipeline, stage) slot is free among groups of the
same device type (memory and speed are identical), and it decides how much state must move. Edge
cost = bytes of the slot's layer shards the group's devices did not hold (TP rank i of the group
against TP rank i of its old stage); layers a group keeps cost nothing.

Exact at any scale: a group's cost for a slot depends only on what the group held (its *class*:
the layer range each TP rank held, at that rank) and on the slot's layer range, and a plan has
few of each (old stages x new stages), so the matching is solved as the equivalent transportation
problem between classes (group classes supply their counts, slot classes demand theirs, spare
groups flow to a sink at cost 0) by OR-tools' min-cost flow, then instantiated, each slot keeping
the search's own group when that group's class was matched to it (fewer changes, same cost). The
linear sum assignment over individual groups cannot be used at scale: its cost scaling bounds
cost x nodes^2 below 2^63, which byte costs at 4,096 GPUs exceed (POSSIBLE_OVERFLOW); it remains
the solver for raw cost matrices (`min_cost_assignment`, the paper's Figure 3 example).
"""

from __future__ import annotations

import time

import numpy as np

from chameleon_opt.check import PlanRejected, check_plan
from chameleon_opt.comm.state import live_slots, old_holdings, tensor_bytes
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.backends import require_optimal
from chameleon_opt.solve.result import SolveResult, Status

COST_LIMIT = 1 << 60
"""Largest cost x (nodes + 1)^2 handed to OR-tools' cost-scaling solvers (their price bounds grow
with cost x nodes^2 and must stay inside int64)."""


def min_cost_assignment(cost: np.ndarray | list[list[int]]) -> tuple[list[int], int]:
    """Row -> column of a square integer cost matrix at minimum total cost (exact)."""
    matrix = np.asarray(cost, dtype=np.int64)
    n = matrix.shape[0]
    if matrix.shape != (n, n):
        raise ValueError(f"a square cost matrix is needed, got {matrix.shape}")
    from ortools.graph.python import linear_sum_assignment  # here: 0.06 s to import, only a re-mapping needs it

    solver = linear_sum_assignment.SimpleLinearSumAssignment()
    rows, cols = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    solver.add_arcs_with_cost(rows.ravel(), cols.ravel(), matrix.ravel())
    require_optimal(solver, solver.solve(), "linear sum assignment on a complete cost matrix")
    return [solver.right_mate(i) for i in range(n)], int(solver.optimal_cost())


FIGURE3_COSTS = ((0, 1, 2, 3), (2, 1, 0, 3), (2, 2, 2, 0), (2, 2, 2, 3))
"""method.md's worked example: rows devices, columns new slots, entries missing-layer counts."""


def figure3_example() -> tuple[list[int], int]:
    """The paper's Figure 3 example: the optimum moves 2 layers (device 3 must fetch both)."""
    return min_cost_assignment(FIGURE3_COSTS)


def _transport(cost: np.ndarray, supply: np.ndarray, demand: np.ndarray) -> tuple[np.ndarray, bool]:
    """Flow[group class, slot class] meeting every slot class's demand from the group classes'
    supply at minimum total cost (exact), spare supply to a sink at cost 0. Returns the flow and
    whether it is exact (False only if costs had to be coarsened to stay clear of overflow)."""
    n_g, n_s = cost.shape
    nodes = n_g + n_s + 1
    unit, exact = 1, True
    while (int(cost.max(initial=0)) // unit + 1) * (nodes + 1) ** 2 > COST_LIMIT:
        unit, exact = unit * 2, False
    g_idx, s_idx = np.meshgrid(np.arange(n_g), np.arange(n_s), indexing="ij")
    g_idx, s_idx = g_idx.ravel(), s_idx.ravel()
    from ortools.graph.python import min_cost_flow  # here: 0.06 s to import, only a re-mapping needs it

    flow = min_cost_flow.SimpleMinCostFlow()
    pairs = flow.add_arcs_with_capacity_and_unit_cost(
        g_idx, n_g + s_idx, np.minimum(supply[g_idx], demand[s_idx]), -(-cost[g_idx, s_idx] // unit))
    flow.add_arcs_with_capacity_and_unit_cost(np.arange(n_g), np.full(n_g, nodes - 1), supply, np.zeros(n_g, np.int64))
    flow.set_nodes_supplies(np.arange(nodes), np.concatenate([supply, -demand, [demand.sum() - supply.sum()]]))
    require_optimal(flow, flow.solve(), "min-cost flow on a balanced transportation problem")
    return flow.flows(pairs).reshape(n_g, n_s), exact


def _overlap_bytes(prefix: np.ndarray, a: np.ndarray, b: np.ndarray, f: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Bytes of the layers of [a, b) (slot classes, columns) that lie in [f, e) (group classes, rows)."""
    lo = np.maximum(a[None, :], f[:, None])
    hi = np.minimum(b[None, :], e[:, None])
    return np.where(hi > lo, prefix[np.maximum(hi, lo)] - prefix[lo], 0)


def _slot_state(model: PerfModel, old: Plan, plan: Plan, failed: frozenset[int]) -> int:
    """Bytes every device of `plan`'s live slots lacks (the matching's objective, recomputed)."""
    prefix = np.concatenate([[0], np.cumsum(tensor_bytes(model, plan.tensor_parallel))])
    held = old_holdings(old, failed)
    total = 0
    for j, s in live_slots(plan, failed):
        stage = plan.pipelines[j].stages[s]
        for rank, d in enumerate(stage.devices):
            total += int(prefix[stage.end] - prefix[stage.first])
            h = held.get(d)
            if h is not None and h.rank == rank:
                lo, hi = max(stage.first, h.first), min(stage.end, h.end)
                total -= int(prefix[hi] - prefix[lo]) if hi > lo else 0
    return total


def assign_slots(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int]) -> tuple[Plan, SolveResult[Plan]]:
    """Re-map the new plan's live TP groups (and idle live groups) onto its slots so that the
    state to migrate is minimal; every slot keeps its layers and micro-batches, rerouted work
    keeps its positions, dead slots and groups spanning nodes stay where they are.

    Groups are only exchanged between slots whose group has the same device type (so the plan's
    memory and speed are unchanged); TP rank order inside a group is kept."""
    start = time.perf_counter()
    instance = model.instance
    tp = new.tensor_parallel
    slots = [(j, s) for j, s in live_slots(new, failed)
             if len({instance.node_of(d) for d in new.pipelines[j].stages[s].devices}) == 1]
    used = set(new.devices)
    groups = [new.pipelines[j].stages[s].devices for j, s in slots]
    groups += [g for g in survivor_groups(instance, failed, tp) if used.isdisjoint(g)]
    prefix = np.concatenate([[0], np.cumsum(tensor_bytes(model, tp))]).astype(np.int64)
    held = old_holdings(old, failed)
    kind = [model.stage_device(g).name for g in groups]
    choice: dict[tuple[int, int], tuple[int, ...]] = {}
    exact, objective = True, 0
    for name in sorted(set(kind)):
        g_of = [i for i, k in enumerate(kind) if k == name]
        s_of = [i for i in range(len(slots)) if kind[i] == name]  # slot i's own group is groups[i]
        if not s_of:
            continue
        g_key = [tuple((h.first, h.end) if (h := held.get(d)) is not None and h.rank == rank else (0, 0)
                       for rank, d in enumerate(groups[i])) for i in g_of]
        row = {gi: r for r, gi in enumerate(g_of)}  # slot i's own group groups[i] has this type too
        g_classes = sorted(set(g_key))
        g_class = {key: c for c, key in enumerate(g_classes)}
        # a slot class: its layer range and the class of the group the search put there
        s_key = [(new.pipelines[slots[i][0]].stages[slots[i][1]].first,
                  new.pipelines[slots[i][0]].stages[slots[i][1]].end, g_class[g_key[row[i]]]) for i in s_of]
        s_classes = sorted(set(s_key))
        s_class = {key: c for c, key in enumerate(s_classes)}
        a = np.array([key[0] for key in s_classes], dtype=np.int64)
        b = np.array([key[1] for key in s_classes], dtype=np.int64)
        cost = np.zeros((len(g_classes), len(s_classes)), dtype=np.int64)
        for rank in range(tp):
            f = np.array([key[rank][0] for key in g_classes], dtype=np.int64)
            e = np.array([key[rank][1] for key in g_classes], dtype=np.int64)
            cost += (prefix[b] - prefix[a])[None, :] - _overlap_bytes(prefix, a, b, f, e)
        supply = np.bincount([g_class[k] for k in g_key], minlength=len(g_classes)).astype(np.int64)
        demand = np.bincount([s_class[k] for k in s_key], minlength=len(s_classes)).astype(np.int64)
        # ties (equal bytes, e.g. layers without state) go to the search's own placement: +1 per
        # slot given another class, bytes scaled by slots + 1 so the tie never outweighs a byte;
        # skipped where the scaled costs would approach overflow
        moved = (np.arange(len(g_classes))[:, None] != np.array([key[2] for key in s_classes])[None, :])
        nodes = len(g_classes) + len(s_classes) + 2
        scale = len(s_of) + 1
        if (int(cost.max(initial=0)) + 1) * scale * nodes ** 2 > COST_LIMIT:
            scale, moved = 1, np.zeros_like(moved)
        flow, ok = _transport(cost * scale + moved, supply, demand)
        exact = exact and ok
        objective += int((flow * cost).sum())
        # instantiate: a slot keeps its own group when the flow sends its group's class there
        remaining = flow.copy()
        pool: dict[int, list[int]] = {c: [] for c in range(len(g_classes))}
        for gi, key in zip(g_of, g_key):
            pool[g_class[key]].append(gi)
        taken: set[int] = set()
        pending: list[int] = []
        for col, i in enumerate(s_of):
            gc, sc = g_class[g_key[row[i]]], s_class[s_key[col]]
            if remaining[gc, sc] > 0:
                remaining[gc, sc] -= 1
                taken.add(i)
                choice[slots[i]] = groups[i]
            else:
                pending.append(col)
        cursor = dict.fromkeys(pool, 0)  # each class's pool is scanned once over all pending slots
        for col in pending:
            sc = s_class[s_key[col]]
            gc = int(np.flatnonzero(remaining[:, sc] > 0)[0])
            remaining[gc, sc] -= 1
            while pool[gc][cursor[gc]] in taken:
                cursor[gc] += 1
            gi = pool[gc][cursor[gc]]
            taken.add(gi)
            choice[slots[s_of[col]]] = groups[gi]
    pipelines = tuple(
        Pipeline(tuple(Stage(choice.get((j, s), st.devices), st.first, st.end, st.relief) for s, st in enumerate(p.stages)),
                 p.micro_batches) for j, p in enumerate(new.pipelines))
    plan = Plan(tp, pipelines, new.rerouted)
    report = check_plan(instance, plan, failed, model=model)
    if not report.ok and check_plan(instance, new, failed, model=model).ok:  # a permutation keeps soundness
        raise PlanRejected("slot assignment", report.violations)
    before, after = _slot_state(model, old, new, failed), _slot_state(model, old, plan, failed)
    fixed = _slot_state(model, old, Plan(tp, tuple(Pipeline(tuple(st for s, st in enumerate(p.stages)
                                                                      if (j, s) not in choice), p.micro_batches)
                                                        for j, p in enumerate(new.pipelines))), failed)
    if exact and after != objective + fixed:
        raise AssertionError(f"assignment objective {objective} + fixed {fixed} != recomputed {after} (a bug)")
    wall = time.perf_counter() - start
    status = Status.OPTIMAL if exact else Status.FEASIBLE
    reason = (f"{len(slots)} slots, {len(groups)} candidate groups; state to move {after / 1e9:.3f} GB "
              f"(the search's placement: {before / 1e9:.3f} GB)" + ("" if exact else "; costs coarsened"))
    return plan, SolveResult(status, plan, float(after), float(after) if exact else None, wall, "ortools-mcf",
                             reason=reason)
