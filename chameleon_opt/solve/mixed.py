"""Pipelines of mixed device types for the scale path: the templates (solve/templates.py) build
pipelines of one device type only, so on a cluster whose types differ in memory no template may fit
where a pipeline with its largest-memory groups in front does (under 1F1B stage s holds S - s
micro-batches in flight: the first stages need the most memory).

Construction, for each stage count S from the memory floor up: P = groups // S pipelines; the TP
groups sorted by memory (largest first, then speed) are dealt stage by stage, so every pipeline's
stage 0 gets one of the P largest groups, stage 1 one of the next P, and so on; each distinct
sequence of device types gets its own layer split: the least bottleneck time (bisection) at which
filling each stage as far as its own time and memory allow places every layer. Micro-batches are
spread by exact water-filling and rebalanced on exact 1F1B times; every plan is priced by the
performance model with its best reliefs (plans that do not fit are dropped). A heuristic: its
plans are incumbents, the search's bound still decides what is proven.
"""

from __future__ import annotations

import math

import numpy as np

from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.memory import in_flight_micro_batches
from chameleon_opt.perf.model import LayerCosts, PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.polish import spread_and_priced

MAX_STAGE_COUNTS = 24
"""Stage counts tried (from the memory floor up): each costs a few splits and one exact evaluation."""


def _split(rows: list[LayerCosts], in_flight: list[float]) -> tuple[int, ...] | None:
    """Boundaries of len(rows) contiguous stages, stage s priced by its own rows (its device type,
    the fastest relief): the least bottleneck at which the greedy fill places every layer, or None
    when memory admits none."""
    stages, layers = len(rows), len(rows[0].time_s)
    prefix = [(np.concatenate([[0.0], np.cumsum(r.time_s)]).tolist(),
               np.concatenate([[0.0], np.cumsum(r.static_bytes)]).tolist(),
               np.concatenate([[0.0], np.cumsum(r.activation_bytes)]).tolist(),
               r.capacity_bytes - r.transient_bytes) for r in rows]

    def greedy(bottleneck: float) -> tuple[int, ...] | None:
        bounds, position = [0], 0
        for s, (time_p, static_p, act_p, budget) in enumerate(prefix):
            end, last = position, layers - (stages - s - 1)
            while end < last and time_p[end + 1] - time_p[position] <= bottleneck and \
                    static_p[end + 1] - static_p[position] + in_flight[s] * (act_p[end + 1] - act_p[position]) <= budget:
                end += 1
            if end == position:
                return None
            bounds.append(end)
            position = end
        return tuple(bounds) if position == layers else None

    high = max(p[0][-1] for p in prefix)
    if greedy(high) is None:
        return None
    low = 0.0
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (low, middle) if greedy(middle) is not None else (middle, high)
    return greedy(high)


def mixed_plans(instance: Instance, failed: frozenset[int], model: PerfModel, deadline: Deadline,
                shortest: int = 1) -> list[tuple[Plan, float]]:
    """(plan, exact step) of every mixed-type construction that fits, fastest first; empty when the
    survivors have one device type (the templates cover that) or the deadline passes first."""
    tp, total = instance.plan.tensor_parallel, instance.global_micro_batches
    groups = survivor_groups(instance, failed, tp)
    if len({model.stage_device(g).name for g in groups}) < 2:
        return []
    order = sorted(groups, key=lambda g: (-model.stage_device(g).memory_gib,
                                          -model.stage_device(g).peak_tflops * model.stage_device(g).efficiency))
    rows: dict[str, LayerCosts] = {}
    for g in order:
        rows.setdefault(model.stage_device(g).name, model.layer_costs(g, replicas=2, relief=model.fastest_relief))
    found: list[tuple[Plan, float]] = []
    longest = min(instance.workload.num_layers, len(groups))
    for stages in range(max(shortest, 1), min(longest, max(shortest, 1) + MAX_STAGE_COUNTS - 1) + 1):
        if deadline.expired():
            break
        count = min(len(groups) // stages, total)
        splits: dict[tuple[str, ...], tuple[int, ...] | None] = {}
        pipelines = []
        for j in range(count):
            members = [order[s * count + j] for s in range(stages)]
            kinds = tuple(model.stage_device(g).name for g in members)
            if kinds not in splits:
                in_flight = [in_flight_micro_batches(s, stages, math.ceil(total / count)) for s in range(stages)]
                splits[kinds] = _split([rows[k] for k in kinds], in_flight)
            bounds = splits[kinds]
            if bounds is not None:
                pipelines.append(Pipeline(tuple(Stage(g, bounds[s], bounds[s + 1]) for s, g in enumerate(members)), 1))
        if not pipelines:
            continue
        priced = spread_and_priced(model, pipelines, tp, total, deadline, failed)
        if priced is not None:
            found.append(priced)
    return sorted(found, key=lambda item: item[1])
