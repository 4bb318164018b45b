"""Memory relief per stage: choosing, per stage, which activations it keeps and where its optimizer
state lives (what a relief is: perf/relief_kinds.py). The performance model prices each relief per
stage (time and memory, perf/model.py); the instance says which ones the trainer supports
(`training.reliefs`, default only its global recomputation).

Why choosing per stage is cheap and exact: a pipeline's 1F1B time is the longest path of its
operation graph, non-decreasing in every operation's duration, and a stage's relief changes only
its own forward and backward durations, its own memory and its own optimizer step. So for a fixed
plan, among the reliefs that fit a stage's memory only the Pareto-minimal ones in (forward,
backward, optimizer step) can be optimal; `choose_reliefs` enumerates those (usually one per
stage) under every threshold on the optimizer step and keeps the fastest plan.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import TYPE_CHECKING

from chameleon_opt.perf.relief_kinds import ReliefCost

if TYPE_CHECKING:
    from chameleon_opt.perf.model import Estimate, PerfModel
    from chameleon_opt.plan import Plan

ENUMERATION_LIMIT = 4096
"""Most relief combinations tried per pipeline and threshold; beyond it each stage takes its fastest
(forward + backward) Pareto option, which is still optimal when those options are ordered."""


def pareto(options: list[ReliefCost]) -> list[ReliefCost]:
    """Options no other option beats or ties in every one of (forward, backward, optimizer step);
    the first of equal options is kept."""
    kept: list[ReliefCost] = []
    for i, a in enumerate(options):
        def covers(b: ReliefCost, j: int) -> bool:
            le = b.forward_s <= a.forward_s and b.backward_s <= a.backward_s and b.optimizer_s <= a.optimizer_s
            lt = b.forward_s < a.forward_s or b.backward_s < a.backward_s or b.optimizer_s < a.optimizer_s
            return le and (lt or j < i)
        if not any(covers(b, j) for j, b in enumerate(options) if j != i):
            kept.append(a)
    return kept


def choose_reliefs(model: PerfModel, plan: Plan, failed: frozenset[int] = frozenset()
                   ) -> tuple[Plan, Estimate] | None:
    """The plan with the relief on every live stage that minimises its step (see the module
    docstring), and its estimate; None when some live stage fits no supported relief. Failed slots
    keep their relief (they run nothing). Exact for the model's step when the gradient all-reduce
    is not overlapped (then the reliefs change the step only through the pipelines and the
    optimizer step); with overlap it is the same rule, evaluated on the exact model."""
    options = model.relief_options
    if len(options) == 1:
        stamped = _with(plan, {(j, s): options[0] for j, p in enumerate(plan.pipelines) for s in range(len(p.stages))})
        estimate = model.evaluate(stamped, failed)
        return (stamped, estimate) if estimate.memory_ok else None
    failed_slots = model.failed_slots(plan, failed)
    replicas = {layer: len(slots) for layer, slots in model.layer_holders(plan, failed_slots).items()}
    extras = [[0.0] * len(p.stages) for p in plan.pipelines]
    for r in plan.rerouted:
        extras[r.to_pipeline][r.stage] += r.micro_batches
    menus: dict[tuple[int, int], list[ReliefCost]] = {}
    for j, pipe in enumerate(plan.pipelines):
        for s, stage in enumerate(pipe.stages):
            if (j, s) in failed_slots:
                continue
            shards = min(replicas[layer] for layer in range(stage.first, stage.end))
            menu = model.relief_menu(pipe, s, extras[j][s], shards)
            if not menu:
                return None
            menus[(j, s)] = pareto(menu)
    thresholds = sorted({c.optimizer_s for menu in menus.values() for c in menu})
    best: tuple[float, Plan, Estimate] | None = None
    lowest = max((min(c.optimizer_s for c in menu) for menu in menus.values()), default=0.0)
    for limit in thresholds:
        if limit < lowest:
            continue
        choice: dict[tuple[int, int], str] = {}
        for j, pipe in enumerate(plan.pipelines):
            live = [s for s in range(len(pipe.stages)) if (j, s) in menus]
            allowed = {s: [c for c in menus[(j, s)] if c.optimizer_s <= limit] for s in live}
            choice.update(_best_for_pipeline(model, plan, j, allowed, extras[j]))
        candidate = _with(plan, choice)
        estimate = model.evaluate(candidate, failed)
        if estimate.memory_ok and (best is None or estimate.iteration_time_s < best[0] * (1 - 1e-12)):
            best = (estimate.iteration_time_s, candidate, estimate)
    return None if best is None else (best[1], best[2])


def _best_for_pipeline(model: PerfModel, plan: Plan, j: int, allowed: dict[int, list[ReliefCost]],
                       extras: list[float]) -> dict[tuple[int, int], str]:
    """The fastest combination of the stages' allowed reliefs for pipeline j (its 1F1B time plus its
    rerouted work; the other pipelines do not depend on it)."""
    pipe = plan.pipelines[j]
    stages = sorted(allowed)
    combos = math.prod(len(allowed[s]) for s in stages)
    if combos > ENUMERATION_LIMIT:
        return {(j, s): min(allowed[s], key=lambda c: (c.forward_s + c.backward_s, c.optimizer_s)).relief
                for s in stages}
    best: tuple[float, dict[tuple[int, int], str]] | None = None
    for pick in itertools.product(*(allowed[s] for s in stages)):
        choice = {(j, s): c.relief for s, c in zip(stages, pick)}
        if combos == 1:
            return choice
        trial = _with(plan, choice)
        costs = model.stage_costs(trial, j, extras)
        value = model.pipeline_time(costs, pipe.micro_batches, model.options.virtual_stages or 1) + sum(
            e * (c.op_forward_s + c.op_backward_s) for e, c in zip(extras, costs) if e)
        if best is None or value < best[0]:
            best = (value, choice)
    assert best is not None
    return best[1]


def _with(plan: Plan, choice: dict[tuple[int, int], str]) -> Plan:
    """`plan` with the chosen reliefs on those slots (other slots unchanged)."""
    return replace(plan, pipelines=tuple(
        replace(pipe, stages=tuple(replace(st, relief=choice.get((j, s), st.relief)) for s, st in enumerate(pipe.stages)))
        for j, pipe in enumerate(plan.pipelines)))
