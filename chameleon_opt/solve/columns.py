"""Column plans: pipelines of one layer split whose stages holding the same layers sit in one node.

Why: a stage's gradient ring runs on the intra-node link only when every replica of its layers sits
in one node, and a pipeline's sends are paid per micro-batch anyway; on small clusters with a slow
inter-node link the best plans put each stage column (the P stages holding one layer range) into
its own node, sometimes with a slower device in one pipeline (issue 21, seeds 70 and 72: 4 x 4
stages over four nodes, 3 x 3 with one slow group). The branch and bound grows pipelines one at a
time and meets such plans late; the template and mixed paths never place by column. Placement is
the whole difference from what they find, so these plans are built directly.

Construction, for each (stages S, layer split, pipelines P), cheapest estimate first: each column
takes P groups from one node that has that many free (one node per distinct composition of free
groups is tried: nodes of equal composition are interchangeable), else from the nodes with the
most free groups; pipeline j takes each column's j-th fastest group, so slower groups gather in the
last pipelines, which the exact rebalancing then gives fewer micro-batches. Every plan is priced by
the performance model with its best reliefs. A heuristic: its plans are incumbents only.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.comm import Link, ring_allreduce_time
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.polish import spread_and_priced

PLACEMENTS = 16
"""Most column-to-node placements tried per (stages, split, pipelines)."""
SPLITS = 4_096
"""Most layer splits over every stage count (the exact search's SPLIT_BUDGET): beyond, no column plans."""


def _placements(free: list[list[tuple[int, ...]]], names: dict[tuple[int, ...], str],
                speed: dict[tuple[int, ...], float], columns: int, count: int) -> Iterator[list[list[tuple[int, ...]]]]:
    """Ways to give each of `columns` columns `count` groups from the nodes' `free` lists (fastest
    first): a whole column from one node when some node has enough (the first node of each distinct
    free composition; the node whose column is fastest first, so that the first placements, the
    only ones tried when there are many, keep the fast groups together: 8-24-device seed 120's two
    four-stage pipelines on four nodes of two fast groups each), else the nodes with the most free
    groups fill it."""
    if columns == 0:
        yield []
        return
    whole: dict[tuple[str, ...], int] = {}  # free composition -> first node holding a whole column
    for node, groups in enumerate(free):
        if len(groups) >= count:
            whole.setdefault(tuple(names[g] for g in groups), node)
    if whole:
        slowest_first = {node: sorted((speed[g] for g in free[node][:count]), reverse=True) for node in whole.values()}
        for node in sorted(whole.values(), key=lambda n: (slowest_first[n], n)):
            taken, free[node] = free[node][:count], free[node][count:]
            for rest in _placements(free, names, speed, columns - 1, count):
                yield [taken] + rest
            free[node] = taken + free[node]
        return
    order = sorted(range(len(free)), key=lambda n: (-len(free[n]), n))
    if sum(len(groups) for groups in free) < count:
        return
    saved = [list(groups) for groups in free]
    taken = []
    for node in order:  # the fullest nodes first: the column spans as few nodes as it can
        need = count - len(taken)
        taken += free[node][:need]
        free[node] = free[node][need:]
        if len(taken) == count:
            break
    for rest in _placements(free, names, speed, columns - 1, count):
        yield [taken] + rest
    free[:] = saved


def _merged(free: list[list[tuple[int, ...]]], speed: dict[tuple[int, ...], float], penalty: list[float],
            count: int) -> list[list[tuple[int, ...]]] | None:
    """One placement that keeps the costliest sends inside nodes: the columns fall into runs, each on one
    node (its fastest free groups, `count` a column), and a boundary is kept inside a run, costliest send
    first, while the runs still fit the nodes (each, longest first, on the node whose groups it takes are
    fastest, then the fullest fit). The placements `_placements` yields first vary the last columns
    only, so a node of room for two columns took columns 1 and 2 where the costly sends cross 0|1 and
    3|4 (32-64-device seed 198: six four-group columns on nodes of 8, 8, 7 and 6 fast groups). None
    when the single columns do not fit whole nodes."""

    def assign(runs: list[tuple[int, int]]) -> list[list[tuple[int, ...]]] | None:
        left = [list(groups) for groups in free]
        placed: dict[int, list[tuple[int, ...]]] = {}
        for start, end in sorted(runs, key=lambda run: (run[0] - run[1], run[0])):
            size = (end - start) * count
            fits = [n for n in range(len(left)) if len(left[n]) >= size]
            if not fits:
                return None
            node = min(fits, key=lambda n: (speed[left[n][size - 1]], len(left[n]), n))
            taken, left[node] = left[node][:size], left[node][size:]
            for s in range(start, end):
                placed[s] = taken[(s - start) * count:(s - start + 1) * count]
        return [placed[s] for s in range(len(penalty))]

    runs = [(s, s + 1) for s in range(len(penalty))]
    if assign(runs) is None:
        return None
    for boundary in sorted((b for b in range(1, len(penalty)) if penalty[b] > 0), key=lambda b: (-penalty[b], b)):
        left = next(run for run in runs if run[1] == boundary)
        right = next(run for run in runs if run[0] == boundary)
        joined = [run for run in runs if run not in (left, right)] + [(left[0], right[1])]
        if assign(joined) is not None:
            runs = sorted(joined)
    return assign(runs)


def least_step(pipelines: list[Pipeline], total: int, times: Callable[[Pipeline], list[float]]) -> float:
    """A floor on the step of a plan of these pipelines however its `total` micro-batches are shared
    (`spread_and_priced` spreads, then rebalances them): the step is at least the slowest pipeline's
    1F1B time (ring and optimizer step only add), and a pipeline running m micro-batches takes at
    least T(m) = max over stages s of (the forward + backward of the stages before s + m x stage
    s's): its first micro-batch's forward reaches s only after those stages' forwards, s runs all m
    forwards and backwards, and the last backward leaves through the backwards before s (`times`:
    each stage's forward + backward, at most the model's under any relief, sends excluded). T
    grows with m, so the least over shares of the slowest is the `total`-th least of every
    pipeline's T(1..total) (a pipeline left idle counts as 0). Plain 1F1B only: 0 under interleaving."""
    values = []
    for pipe in pipelines:
        work = np.array(times(pipe))
        before = np.concatenate([[0.0], np.cumsum(work)[:-1]])
        values.extend(np.max(before[None, :] + np.arange(1, total + 1)[:, None] * work[None, :], axis=1))
    return float(np.partition(values, total - 1)[total - 1]) if len(values) >= total else 0.0


FITTED_VISITS = 2_000
"""Most partial column-to-node assignments `_fitted` visits per (stages, split, pipelines)."""


def _fitted(free: list[list[tuple[int, ...]]], names: dict[tuple[int, ...], str],
            cost: Callable[[tuple[int, ...], int, int], float], bounds: tuple[int, ...],
            count: int) -> list[list[tuple[int, ...]]] | None:
    """The whole-node placement of `count` groups per column (layers bounds[c]..bounds[c + 1]) of
    least summed stage time (`cost(group, first, end)`: inf where the group cannot hold those layers
    in memory), over the nodes of each distinct free composition per column. `_placements` and
    `_merged` hand the node with slower groups to the last columns, whatever those layers need: on
    binding memory a slow device then holds a layer it cannot fit and the plan is dropped
    (24-32-device seed 3000: three five-stage pipelines on five nodes, one of two fast and three
    slow groups, whose slow group fits only layer 0)."""
    best: list[Any] = [math.inf, None]
    visits = [0]

    def extend(column: int, chosen: list[list[tuple[int, ...]]], spent: float) -> None:
        visits[0] += 1
        if spent >= best[0] or visits[0] > FITTED_VISITS:
            return
        if column == len(bounds) - 1:
            best[0], best[1] = spent, [list(c) for c in chosen]
            return
        seen: set[tuple[str, ...]] = set()
        for node, groups in enumerate(free):
            composition = tuple(names[g] for g in groups)
            if len(groups) < count or composition in seen:
                continue
            seen.add(composition)
            taken = groups[:count]
            price = sum(cost(g, bounds[column], bounds[column + 1]) for g in taken)
            if not math.isfinite(price):
                continue
            free[node] = groups[count:]
            extend(column + 1, chosen + [taken], spent + price)
            free[node] = groups

    extend(0, [], 0.0)
    return best[1]


def column_plans(instance: Instance, failed: frozenset[int], model: PerfModel, deadline: Deadline,
                 incumbent: float = math.inf) -> list[tuple[Plan, float]]:
    """(plan, exact step) of the column plans that fit, fastest first (see the module docstring);
    candidates whose estimate (fastest device type, its share of micro-batches, intra-node rings)
    cannot beat the best found or `incumbent` (the caller's best step) are skipped: on 32-64
    devices the walk takes up to 0.5 s when nothing cuts it (seed 4, whose copy plan is optimal)."""
    tp, total, layers = instance.plan.tensor_parallel, instance.global_micro_batches, instance.workload.num_layers
    groups = survivor_groups(instance, failed, tp)
    longest = min(layers, len(groups))
    if not groups or sum(math.comb(layers - 1, s - 1) for s in range(1, longest + 1)) > SPLITS:
        return []
    # per group: its stage device type, and a speed to deal the fastest groups first
    names = {g: model.stage_device(g).name for g in groups}
    speed = {g: sum(model.stage_times(g, 0, layers)[:2]) for g in groups}
    free_by_node: dict[int, list[tuple[int, ...]]] = {}
    for g in groups:
        free_by_node.setdefault(instance.node_of(g[0]), []).append(g)
    free = [sorted(gs, key=lambda g: (speed[g], g)) for _, gs in sorted(free_by_node.items())]
    fastest = min(groups, key=lambda g: (speed[g], g))
    relief = model.fastest_relief
    grad = model.workload.params * model.grad_bytes / tp
    link = Link(max(model.intra.bandwidth, model.inter.bandwidth), min(model.intra.latency, model.inter.latency))
    # candidates (estimate, stages, split, pipelines): the estimate only orders them and skips the hopeless
    # per layer on the fastest group: forward + backward, and optimizer step (a stage's are sums)
    work = np.cumsum([0.0] + [sum(model.stage_times(fastest, layer, layer + 1, relief)[:2]) for layer in range(layers)])
    steps = np.cumsum([0.0] + [model.optimizer_time(fastest, layer, layer + 1, relief) for layer in range(layers)])
    sizes = np.cumsum(np.concatenate([[0.0], grad]))
    candidates = []
    for stages in range(1, longest + 1):
        if deadline.expired():
            return []
        for cut in itertools.combinations(range(1, layers), stages - 1):
            b = np.array((0,) + cut + (layers,))
            per_stage = work[b[1:]] - work[b[:-1]]
            before = np.concatenate([[0.0], np.cumsum(per_stage)[:-1]])  # per stage: the stages before it
            update = float((steps[b[1:]] - steps[b[:-1]]).max())
            largest = float((sizes[b[1:]] - sizes[b[:-1]]).max())
            for count in range(1, min(total, len(groups) // stages) + 1):
                # a 1F1B floor: some stage runs all its m micro-batches after the first reaches it (all
                # the work once with the slowest stage m times overstates it: 32-64-device seed 198's
                # optimum is 18.4896 where that said 18.9375, so a copy plan of 18.6876 skipped it)
                estimate = float((before + -(-total // count) * per_stage).max()) \
                    + update + ring_allreduce_time(largest, count, link)
                candidates.append((estimate, stages, tuple(int(x) for x in b), count))
    candidates.sort()
    found: list[tuple[Plan, float]] = []
    best = incumbent
    costs: dict[tuple[str, int, int, int, int], float] = {}  # per (type, layers, stages, pipelines)

    def fitted_cost(group: tuple[int, ...], first: int, end: int, stages: int, count: int) -> float:
        """The group's forward + backward on layers [first, end); inf where no relief fits them (their
        least need: the last stage's in-flight count, `count` replicas). Cached per device type."""
        key = (names[group], first, end, stages, count)
        if key not in costs:
            fits = any(needed <= available for needed, available in (
                model.stage_memory(group, first, end, stages - 1, stages, 1, replicas=count, relief=r)
                for r in model.relief_options))
            costs[key] = sum(model.stage_times(group, first, end, relief)[:2]) if fits else math.inf
        return costs[key]

    work: dict[tuple[tuple[int, ...], int, int], float] = {}  # per (group, first, end): `least_step`'s time

    def stage_work(pipe: Pipeline) -> list[float]:
        """Each stage's least forward + backward of one micro-batch over the reliefs (`least_step`)."""
        for st in pipe.stages:
            if (st.devices, st.first, st.end) not in work:
                work[st.devices, st.first, st.end] = min(sum(model.stage_times(st.devices, st.first, st.end, r)[:2])
                                                         for r in model.relief_options)
        return [work[st.devices, st.first, st.end] for st in pipe.stages]

    interleaved = (model.options.virtual_stages or 1) > 1
    for estimate, stages, bounds, count in candidates:
        if estimate >= best or deadline.expired():
            break
        penalty = [0.0] + [max(model.boundary_send_on(model.inter, bounds[s] - 1)
                               - model.boundary_send_on(model.intra, bounds[s] - 1), 0.0) for s in range(1, stages)]
        merged = _merged(free, speed, penalty, count)

        fitted = _fitted([list(f) for f in free], names, functools.partial(fitted_cost, stages=stages, count=count),
                         bounds, count)
        firsts = [placement for placement in (fitted, merged) if placement is not None]
        for columns in itertools.chain(firsts, itertools.islice(
                _placements([list(f) for f in free], names, speed, stages, count), PLACEMENTS)):
            if deadline.expired():
                break
            pipelines = [Pipeline(tuple(Stage(sorted(columns[s], key=lambda g: (speed[g], g))[j], bounds[s],
                                              bounds[s + 1]) for s in range(stages)), 1) for j in range(count)]
            if not interleaved and least_step(pipelines, total, stage_work) >= best:
                continue  # its groups cannot beat the best so far, however it is priced (ms saved per placement)
            priced = spread_and_priced(model, pipelines, tp, total, deadline, failed)
            if priced is not None:
                found.append(priced)
                best = min(best, priced[1])
    return sorted(found, key=lambda item: item[1])
