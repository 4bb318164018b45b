"""The exact polish every constructive path shares (templates, local re-plans, mixed pipelines):
the performance model's own prices, not a surrogate's. Best reliefs per stage with the exact step,
one pipeline's exact 1F1B time, micro-batches spread by water-filling on exact stage times and
rebalanced on exact 1F1B times, and layer boundaries moved one at a time while the exact time falls.
"""

from __future__ import annotations

import itertools
import math

from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.pipeline import one_f_one_b_time
from chameleon_opt.perf.relief import choose_reliefs
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.microbatch import allocate_greedy


def spread(model: PerfModel, pipelines: list[Pipeline], tp: int, total: int) -> Plan | None:
    """The pipelines with `total` micro-batches spread by water-filling on their exact stage times."""
    fills, steps = [], []
    for pipe in pipelines:
        costs = model.stage_costs(Plan(tp, (pipe,)), 0, [0.0] * len(pipe.stages))
        times = [c.op_forward_s + c.op_backward_s for c in costs]
        fills.append(sum(times))
        steps.append(max(times))
    shares = allocate_greedy(fills, steps, total).solution
    if shares is None:
        return None
    return Plan(tp, tuple(Pipeline(p.stages, m) for p, m in zip(pipelines, shares)))


def relieved(model: PerfModel, plan: Plan, failed: frozenset[int] = frozenset()) -> tuple[Plan, float]:
    """The plan with its best memory relief per stage and its exact step (inf when some stage fits
    no supported relief)."""
    chosen = choose_reliefs(model, plan, failed)
    return (plan, math.inf) if chosen is None else (chosen[0], chosen[1].iteration_time_s)


def pipeline_exact(model: PerfModel, pipe: Pipeline, tp: int) -> float:
    """Exact 1F1B time (Eq. 11) of one pipeline under its best reliefs, inf when a stage fits none."""
    chosen = choose_reliefs(model, Plan(tp, (pipe,)))
    if chosen is None:
        return math.inf
    costs = chosen[1].pipelines[0].stages
    return one_f_one_b_time([c.op_forward_s for c in costs], [c.op_backward_s for c in costs], pipe.micro_batches)


def spread_and_priced(model: PerfModel, pipelines: list[Pipeline], tp: int, total: int, deadline: Deadline,
                      failed: frozenset[int]) -> tuple[Plan, float] | None:
    """Pipelines turned into a candidate plan as the incumbent builders do it: micro-batches spread,
    rebalanced on exact times, each stage given its best relief; with its exact step, or None when
    no spread exists or some stage fits no relief."""
    plan = spread(model, pipelines, tp, total)
    if plan is None:
        return None
    plan, step = relieved(model, rebalance_exact(model, plan, deadline), failed)
    return (plan, step) if math.isfinite(step) else None


def rebalance_exact(model: PerfModel, plan: Plan, deadline: Deadline) -> Plan:
    """Move micro-batches one at a time from the slowest pipeline to the one that finishes
    earliest after taking it, judged by exact 1F1B times, while the slowest pipeline speeds up.
    (The surrogate sees pipelines of equal fill and bottleneck as equal; their exact schedules
    are not.)"""
    tp = plan.tensor_parallel
    shares = [p.micro_batches for p in plan.pipelines]
    cache: dict[tuple, float] = {}
    shapes = []  # per pipeline, what its 1F1B time depends on: each stage's layers and type, each crossing
    for pipe in plan.pipelines:
        nodes = [model.instance.node_of(st.devices[0]) for st in pipe.stages]
        shapes.append((tuple((st.first, st.end, model.stage_device(st.devices).name) for st in pipe.stages),
                       tuple(a != b for a, b in zip(nodes, nodes[1:]))))

    def exact(j: int, m: int) -> float:
        if (shapes[j], m) not in cache:
            cache[shapes[j], m] = pipeline_exact(model, Pipeline(plan.pipelines[j].stages, m), tp) if m > 0 else 0.0
        return cache[shapes[j], m]

    while not deadline.expired():
        times = [exact(j, m) for j, m in enumerate(shares)]
        slow = max(range(len(shares)), key=lambda j: times[j])
        if shares[slow] <= 1:
            break
        target = min((j for j in range(len(shares)) if j != slow), key=lambda j: exact(j, shares[j] + 1), default=None)
        if target is None or max(exact(target, shares[target] + 1), exact(slow, shares[slow] - 1)) >= times[slow]:
            break
        shares[slow] -= 1
        shares[target] += 1
    return Plan(tp, tuple(Pipeline(p.stages, m) for p, m in zip(plan.pipelines, shares)), plan.rerouted)


def polish_splits(model: PerfModel, plan: Plan, deadline: Deadline) -> Plan:
    """Exact split polish: the templates' min-max split ignores fill and the forward/backward
    asymmetry that matter when a pipeline runs few micro-batches, so each distinct pipeline
    shape (stage count, split, micro-batches) has its boundaries moved one layer at a time while
    its exact 1F1B time falls and memory fits; all pipelines of that shape take the result."""
    improved: dict[tuple, tuple[int, ...]] = {}
    for pipe in plan.pipelines:
        bounds = (pipe.stages[0].first,) + tuple(st.end for st in pipe.stages)
        key = (bounds, pipe.micro_batches, model.stage_device(pipe.stages[0].devices).name)
        if key in improved or len(pipe.stages) < 2:
            continue
        best = list(bounds)
        best_time = pipeline_exact(model, pipe, plan.tensor_parallel)
        moved = True
        while moved and not deadline.expired():
            moved = False
            for i in range(1, len(best) - 1):
                for step in (-1, 1):
                    trial = best.copy()
                    trial[i] += step
                    if not trial[i - 1] < trial[i] < trial[i + 1]:
                        continue
                    candidate = Pipeline(tuple(Stage(st.devices, trial[s], trial[s + 1])
                                               for s, st in enumerate(pipe.stages)), pipe.micro_batches)
                    value = pipeline_exact(model, candidate, plan.tensor_parallel)
                    if value < best_time * (1 - 1e-12):
                        best, best_time, moved = trial, value, True
        improved[key] = tuple(best)
    pipelines = []
    for pipe in plan.pipelines:
        bounds = (pipe.stages[0].first,) + tuple(st.end for st in pipe.stages)
        new = improved.get((bounds, pipe.micro_batches, model.stage_device(pipe.stages[0].devices).name), bounds)
        pipelines.append(Pipeline(tuple(Stage(st.devices, new[s], new[s + 1]) for s, st in enumerate(pipe.stages)),
                                  pipe.micro_batches))
    return Plan(plan.tensor_parallel, tuple(pipelines), plan.rerouted)


def polish_step_splits(model: PerfModel, plan: Plan, failed: frozenset[int], deadline: Deadline) -> tuple[Plan, float]:
    """Split polish on the whole step: the 1F1B polish ignores the gradient all-reduce and the
    optimizer step, which follow the largest stage, so a split slower in 1F1B can make the faster
    plan. Each pipeline shape (boundaries, micro-batches, first stage's type) has a boundary moved
    one layer, in all its pipelines at once, while the plan's exact step (best reliefs) falls.
    Returns the plan and its step (inf when it fits no relief)."""
    best, best_value = relieved(model, plan, failed)

    def key(pipe: Pipeline) -> tuple:
        return ((pipe.stages[0].first,) + tuple(st.end for st in pipe.stages), pipe.micro_batches,
                model.stage_device(pipe.stages[0].devices).name)

    moved = math.isfinite(best_value)
    while moved and not deadline.expired():
        moved = False
        for shape in dict.fromkeys(key(pipe) for pipe in best.pipelines if len(pipe.stages) > 1):
            bounds = shape[0]
            for i in range(1, len(bounds) - 1):
                for step in (-1, 1):
                    trial = list(bounds)
                    trial[i] += step
                    if not trial[i - 1] < trial[i] < trial[i + 1] or deadline.expired():
                        continue
                    candidate = Plan(plan.tensor_parallel, tuple(
                        Pipeline(tuple(Stage(st.devices, trial[s], trial[s + 1]) for s, st in enumerate(pipe.stages)),
                                 pipe.micro_batches) if key(pipe) == shape else pipe
                        for pipe in best.pipelines), best.rerouted)
                    candidate, value = relieved(model, candidate, failed)
                    if value < best_value * (1 - 1e-12):
                        best, best_value, moved = candidate, value, True
                        break
                if moved:
                    break
            if moved:
                break
    return best, best_value


def polish_placement(model: PerfModel, plan: Plan, failed: frozenset[int], deadline: Deadline) -> tuple[Plan, float]:
    """Placement polish: two stages on TP groups of the same device type trade groups while the
    plan's exact step (best reliefs) falls. Which node holds which stage changes only the sends and
    the all-reduce rings: plateaus of near-equal plans the branch and bound may not tell apart in
    time (a 16-device instance: 2e-4 s of rings, one swap away). The aligned placement
    (`aligned_placement`) is tried first: rings stay inside a node only when every holder of their
    layers does, which no single swap reaches. A swap that keeps the step but shortens the sum of
    the pipelines' 1F1B times is taken too: the slowest pipeline sets the step, so the swaps that
    take a node crossing out of each of several equally slow pipelines gain only at the last one
    (8-24-device seed 220: four pipelines, each with one crossing after its first stage). Returns
    the plan and its step."""
    best, best_value, best_sum = _scored(model, plan, failed)
    aligned, value, total = _scored(model, aligned_placement(model, best), failed)
    if _better(value, total, best_value, best_sum):
        best, best_value, best_sum = aligned, value, total
    slots = [(j, s) for j, pipe in enumerate(best.pipelines) for s in range(len(pipe.stages))]
    improved = math.isfinite(best_value)
    while improved and not deadline.expired():
        improved = False
        for a, b in itertools.combinations(slots, 2):
            if deadline.expired():
                break
            first, second = best.pipelines[a[0]].stages[a[1]], best.pipelines[b[0]].stages[b[1]]
            if model.stage_device(first.devices).name != model.stage_device(second.devices).name:
                continue
            candidate, value, total = _scored(model, _swapped(best, a, b), failed)
            if _better(value, total, best_value, best_sum):
                best, best_value, best_sum, improved = candidate, value, total, True
    return best, best_value


def _better(value: float, total: float, best_value: float, best_sum: float) -> bool:
    """A faster step, or the same step with a shorter sum of pipeline times (strictly lexicographic,
    so the polish ends)."""
    return value < best_value * (1 - 1e-12) or (value <= best_value and total < best_sum * (1 - 1e-12))


def _scored(model: PerfModel, plan: Plan, failed: frozenset[int]) -> tuple[Plan, float, float]:
    """The plan with its best reliefs, its exact step and the sum of its pipelines' 1F1B times
    (inf, inf when some stage fits no relief)."""
    chosen = choose_reliefs(model, plan, failed)
    if chosen is None:
        return plan, math.inf, math.inf
    return chosen[0], chosen[1].iteration_time_s, sum(p.iteration_time_s for p in chosen[1].pipelines)


def aligned_placement(model: PerfModel, plan: Plan) -> Plan:
    """The plan's TP groups re-dealt among its stages of the same device type so that stages holding
    the same layers (one gradient ring) share a node where they can: columns of such stages, the
    largest first, each filled from the node with the most unassigned groups of its type."""
    free: dict[tuple[str, int], list[tuple[int, ...]]] = {}
    columns: dict[tuple[int, int, str], list[tuple[int, int]]] = {}
    for j, pipe in enumerate(plan.pipelines):
        for s, stage in enumerate(pipe.stages):
            name = model.stage_device(stage.devices).name
            free.setdefault((name, model.instance.node_of(stage.devices[0])), []).append(stage.devices)
            columns.setdefault((stage.first, stage.end, name), []).append((j, s))
    dealt: dict[tuple[int, int], tuple[int, ...]] = {}
    for (_, _, name), slots in sorted(columns.items(), key=lambda item: -len(item[1])):
        left = list(slots)
        while left:  # the node with the most groups of the type left gives as many as it has
            source = max((k for k in free if k[0] == name and free[k]), key=lambda k: (len(free[k]), -k[1]))
            taken = min(len(free[source]), len(left))
            for slot in left[:taken]:
                dealt[slot] = free[source].pop(0)
            left = left[taken:]
    return Plan(plan.tensor_parallel, tuple(
        Pipeline(tuple(Stage(dealt[j, s], st.first, st.end) for s, st in enumerate(pipe.stages)), pipe.micro_batches)
        for j, pipe in enumerate(plan.pipelines)), plan.rerouted)


def _swapped(plan: Plan, a: tuple[int, int], b: tuple[int, int]) -> Plan:
    """The plan with the TP groups of stages a and b (pipeline, stage) traded, layer ranges kept."""
    stages = [list(pipe.stages) for pipe in plan.pipelines]
    first, second = plan.pipelines[a[0]].stages[a[1]], plan.pipelines[b[0]].stages[b[1]]
    stages[a[0]][a[1]] = Stage(second.devices, first.first, first.end)
    stages[b[0]][b[1]] = Stage(first.devices, second.first, second.end)
    return Plan(plan.tensor_parallel, tuple(Pipeline(tuple(st), pipe.micro_batches)
                                            for st, pipe in zip(stages, plan.pipelines)), plan.rerouted)


def polish_critical(model: PerfModel, plan: Plan, failed: frozenset[int], deadline: Deadline,
                    tries: int = 4) -> tuple[Plan, float]:
    """Joint swaps for tied slowest pipelines: when several pipelines share the slowest 1F1B time, a
    swap that speeds one of them leaves the step where it was (or raises it through a ring it moves
    across nodes), so `polish_placement`, one swap at a time, never takes it. Here each such pipeline
    gets its own same-type swap with a pipeline outside the tie that speeds it most (then by the whole
    step), the swaps applied together and priced exactly: 24-32-device seed 3253, two slow(0-1)-fast-
    fast copies at 22.070 with both sends across nodes, each swap alone keeps 22.241479, both at once
    22.240532 (its optimum). Up to `tries` combinations (the k-th best swap of the first pipeline), the
    first whose step is lower kept; a few hundred pricings (ms). Returns the plan and its step."""
    chosen = choose_reliefs(model, plan, failed)
    if chosen is None:
        return plan, math.inf
    best, estimate = chosen
    best_value = estimate.iteration_time_s
    times = [p.iteration_time_s for p in estimate.pipelines]
    slowest = max(times)
    critical = [j for j, t in enumerate(times) if t >= slowest * (1 - 1e-12)]
    if len(critical) < 2:
        return best, best_value
    name = {(j, s): model.stage_device(stage.devices).name
            for j, pipe in enumerate(best.pipelines) for s, stage in enumerate(pipe.stages)}
    ranked: list[list[tuple[float, float, tuple[int, int], tuple[int, int]]]] = []
    for j in critical:  # per slowest pipeline: its swaps that speed it, fastest first
        options = []
        for s in range(len(best.pipelines[j].stages)):
            for other in name:
                if deadline.expired():
                    return best, best_value
                if other[0] in critical or name[other] != name[(j, s)]:
                    continue
                scored = choose_reliefs(model, _swapped(best, (j, s), other), failed)
                if scored is not None and scored[1].pipelines[j].iteration_time_s < slowest * (1 - 1e-12):
                    options.append((scored[1].pipelines[j].iteration_time_s, scored[1].iteration_time_s, (j, s), other))
        if not options:
            return best, best_value
        ranked.append(sorted(options))
    for k in range(min(tries, len(ranked[0]))):
        candidate, used = best, set()
        for position, options in enumerate(ranked):
            pick = next((o for o in options[k if position == 0 else 0:] if o[3] not in used and o[2] not in used), None)
            if pick is None:
                break
            used |= {pick[2], pick[3]}
            candidate = _swapped(candidate, pick[2], pick[3])
        else:
            candidate, value, _ = _scored(model, candidate, failed)
            if value < best_value * (1 - 1e-12):
                return candidate, value
    return best, best_value


def _merged(plan: Plan, members: list[int], s: int, keep: int) -> Plan:
    """The plan with stages s and s + 1 of each pipeline in `members` merged into one stage on the group
    of the first (keep 0) or the second (keep 1); the other group idles."""
    pipelines = list(plan.pipelines)
    for j in members:
        stages = list(pipelines[j].stages)
        first, second = stages[s], stages[s + 1]
        stages[s:s + 2] = [Stage((first, second)[keep].devices, first.first, second.end)]
        pipelines[j] = Pipeline(tuple(stages), pipelines[j].micro_batches)
    return Plan(plan.tensor_parallel, tuple(pipelines), plan.rerouted)


def polish_merged(model: PerfModel, plan: Plan, failed: frozenset[int], deadline: Deadline) -> tuple[Plan, float]:
    """Merged neighbouring stages for the slowest pipelines: the tied slowest ones of one layer split
    each merge stages s and s + 1 onto the group of one of them, all at once (one alone leaves the step
    where it was), priced exactly, kept while the step falls. A stage less saves its sends, and the
    merged stage may sit beside the other pipelines' stages of those layers (one ring inside a node);
    neither the placement polish (groups traded, splits kept) nor the split polish (boundaries moved,
    stage counts kept) can do it: 24-32-device seed 8080, two six-stage pipelines 0 | 1 | 2 | 3 | 4 | 5
    beside two five-stage 0 | 1 | 2-3 | 4 | 5 ones, whose 2-3 stages share a node: merging 2 and 3 onto
    that node's free groups gives four copies, 26.263957 -> 26.261917 (the floor). (S - 1) x 2
    pricings per split of the tied pipelines, per step down. Returns the plan and its step."""
    chosen = choose_reliefs(model, plan, failed)
    if chosen is None:
        return plan, math.inf
    best, estimate = chosen
    best_value = estimate.iteration_time_s
    improved = True
    while improved and not deadline.expired():
        improved = False
        times = [p.iteration_time_s for p in estimate.pipelines]
        slowest = max(times)
        shapes: dict[tuple[int, ...], list[int]] = {}
        for j, t in enumerate(times):
            if t >= slowest * (1 - 1e-12):
                shapes.setdefault(tuple(st.first for st in best.pipelines[j].stages), []).append(j)
        for members in shapes.values():
            for s, keep in itertools.product(range(len(best.pipelines[members[0]].stages) - 1), (0, 1)):
                if deadline.expired():
                    return best, best_value
                found = choose_reliefs(model, _merged(best, members, s, keep), failed)
                if found is not None and found[1].iteration_time_s < best_value * (1 - 1e-12):
                    (best, estimate), best_value, improved = found, found[1].iteration_time_s, True
                    break
            if improved:
                break
    return best, best_value
