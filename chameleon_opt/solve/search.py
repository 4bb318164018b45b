"""Plan search (reconfiguration) over the survivors: the fastest plan for the performance model,
with a bound that says how far from optimal it may be.

`search_plan` runs, each within its share of one deadline:
1. the memory floor (`bounds.memory_floor`): when no pipeline of the space fits, INFEASIBLE at once;
2. the template path (`_template_plan`): pipeline templates (device type x stage count, each with
   its best layer split; solve/templates.py), constructive mixes as warm starts
   (solve/constructive.py), the relaxation bound, then the level model (solve/levels.py) solved by
   the chosen backend unless the incumbent already meets the bound; the mix is lowered onto TP
   groups and polished on the exact model (reliefs, micro-batch rebalancing, neighbouring mixes,
   layer splits: solve/polish.py). With several reliefs the relief-free templates compete too;
3. pipelines of mixed device types (solve/mixed.py) and, up to EXACT_GROUPS groups, copy plans
   (solve/copies.py: P copies of one pipeline, its paying sends inside nodes) and column plans
   (solve/columns.py: each layer range's stages in one node; candidates whose estimate cannot beat
   the incumbent skipped, so the cheap copies go first); the incumbent's stages then trade TP
   groups of their device type while the exact step falls (`polish_placement`);
4. branch and bound over the whole space when it is small (solve/exact.py), else the paper's
   enumeration (solve/enumerator.py) as one more incumbent while the survivors form at most
   ENUMERATION_GROUPS TP groups;
5. the bound: the exhausted branch and bound, else the relaxation (`bounds.relaxation_bound`); beyond
   EXACT_GROUPS groups the relaxation runs first, within SCALE_BOUND_SHARE of the time, and resumes
   here when that cut it short.

Status: OPTIMAL only when the returned plan's exact step meets the bound within
OPTIMALITY_TOLERANCE; FEASIBLE with the gap otherwise; INFEASIBLE when the memory floor, the
exhausted branch and bound or an infinite bound proves no plan of SPACE fits; NO_SOLUTION (stopped
early) when the deadline left no plan. Every returned plan passes the independent checker.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from chameleon_opt.check import assert_sound
from chameleon_opt.errors import InfeasibleError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.solve.backends import DEFAULT, SolverOptions, cpsat_start_s
from chameleon_opt.solve.blocks import PRUNE, blocks_search
from chameleon_opt.solve.bounds import RelaxationBound, memory_floor, relaxation_bound
from chameleon_opt.solve.constructive import (Mix, best_counts, bound_guided_mix, cover_mix, heuristic_mix, lower,
                                              micro_batch_cap, mix_rank, modelled_time, neighbour_mixes,
                                              restricted_mix)
from chameleon_opt.solve.columns import column_plans
from chameleon_opt.solve.copies import copy_plans
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.enumerator import enumerate_plans
from chameleon_opt.solve.exact import EXACT_GROUPS, ExactOutcome, Inventories, exact_floors, exact_search
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.homogeneous import HomogeneousBound, homogeneous_bound, shape_plans
from chameleon_opt.solve.levels import LevelModel, level_model, lp_lower_bound, solve_level_model
from chameleon_opt.solve.mixed import mixed_plans
from chameleon_opt.solve.polish import (polish_critical, polish_merged, polish_placement, polish_splits,
                                        polish_step_splits, rebalance_exact, relieved)
from chameleon_opt.solve.result import SolveResult, Status
from chameleon_opt.solve.templates import Template, build_templates


TEMPLATE_SHARE = 0.5  # of the search's time, for the template path (the rest: exact search, bound)
MIXED_SHARE = 0.3  # of what is left after it, for pipelines of mixed device types
COLUMN_SHARE = 0.15  # of what is left after the copies, for column plans (solve/columns.py, up to EXACT_GROUPS groups; up to 0.24 s at 64: 0.03 cut 32-64 seed 45's optimum)
MIN_SEARCH_S = 0.02  # less time left than this: the search does not start (NO_SOLUTION, stopped early)
POLISH_CANDIDATES = 24  # neighbouring mixes evaluated exactly after the solve
ENUMERATION_SHARE = 0.25  # of the time limit, for the paper's enumeration as an extra incumbent
ENUMERATION_GROUPS = 64  # beyond this many TP groups it cannot finish in seconds (bench/solver_scaling.py)
COPIES_SHARE = 0.05  # of what is left, for copy plans (solve/copies.py, up to EXACT_GROUPS groups; 10-20 ms at 64)
PLACEMENT_SHARE = 0.1  # of what is left, for the placement polish of the incumbent (up to EXACT_GROUPS groups)
EXACT_SHARE = 0.95  # of what is left, for the branch and bound (the rest: the relaxation bound if it stops, 3-45 ms up to 64 devices; past the deadline its own floor stands)
EARLY_REFINE_SHARE = 0.25  # of what is left after the column plans, for the branch and bound's floors against their incumbent
BLOCKS_SHARE = 0.8  # of what is left before the bound, for the search over layer counts (solve/blocks.py: 2-4 s on relief-faster-8)
HOMOGENEOUS_SHARE = 0.7  # of what is left before the branch and bound, for the one-type whole-layer bound (0.05-0.3 s)
SCALE_BOUND_SHARE = 0.8  # of the search's time, for the relaxation bound first beyond EXACT_GROUPS groups (the rest passes on; cut short, it resumes last)
OPTIMALITY_TOLERANCE = 1e-6  # OPTIMAL: the exact step is within this relative gap of a valid bound
SPACE = ("pipelines of TP groups formed inside nodes from any survivors (idle allowed), stages of any "
         "device types in any order, contiguous layer splits, any micro-batch split; 1F1B; step time, "
         "gradient all-reduce, optimizer step and memory of the performance model")



def infeasibility_reason(instance: Instance, model: PerfModel, groups: list[tuple[int, ...]]) -> str:
    """Why no template fits: total model state against total survivor memory."""
    if not groups:
        return "no surviving TP group: every node lost too many devices for one TP group"
    state = float(model.workload.params.sum()) * (model.param_bytes + model.grad_bytes + model.optimizer_bytes)
    # a device whose framework and buffers exceed its memory holds nothing (not a negative amount)
    capacity = sum(max(model.layer_costs(g).capacity_bytes, 0.0) * len(g) for g in groups)
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
                 deadline: Deadline = Deadline.never()) -> SearchSpace:
    groups = survivor_groups(instance, failed, instance.plan.tensor_parallel)
    groups_by_type: dict[str, list[tuple[int, ...]]] = {}
    for group in groups:
        groups_by_type.setdefault(model.stage_device(group).name, []).append(group)
    return SearchSpace(groups, groups_by_type, {name: len(g) for name, g in groups_by_type.items()},
                       instance.global_micro_batches, build_templates(model, groups, deadline))


def level_model_for(instance: Instance, failed: frozenset[int], model: PerfModel | None = None) -> LevelModel:
    """The level model the search would solve for these failures (for export and benchmarks).

    Raises InfeasibleError when no template fits."""
    from chameleon_opt.decision import refuse_context_parallel
    refuse_context_parallel(instance)
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
    space = search_space(instance, failed, model, deadline)
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
            most = sum(micro_batch_cap(templates[k], everything) * n for name, groups in budget.items()
                       for k, n in best_counts([(k, t.stages, micro_batch_cap(t, everything)) for k, t in enumerate(templates)
                                                 if t.device_type == name], groups).items())
            reason = (f"the pipelines that fit in memory can run at most {most} of the {total} micro-batches "
                      "(fewer micro-batches in flight is what lets them fit)")
        return SolveResult(Status.INFEASIBLE, None, None, None, 0.0, backend, time.perf_counter() - start, seed, reason)
    hint = min(starts, key=lambda mix: mix_rank(templates, mix))
    relaxation = lp_lower_bound(templates, budget, total, deadline)
    relaxation = relaxation if math.isfinite(relaxation) else 0.0
    hint = bound_guided_mix(templates, budget, total, hint, deadline)
    warm = modelled_time(templates, hint)

    def finish(mix: Mix, status: Status, bound: float, wall: float, used: str, build: float, why: str):
        tp = instance.plan.tensor_parallel
        plan = lower(templates, mix, space.groups_by_type, tp)
        # Exact polish: the model's 1F1B and sync terms are surrogates, so its neighbours are
        # evaluated exactly and the faster plan kept (ties in the surrogate hide real differences).
        evaluating = deadline.now()
        plan, best_time = relieved(model, plan, failed)
        # The polish is optional: each of its exact evaluations (0.1-0.5 s at 16,384-131,072 devices)
        # starts only while one more and the final check still fit before the deadline (timed on the
        # deadline's clock: a deterministic one's stands still, so the polish runs to its own end).
        evaluation_s = deadline.now() - evaluating
        polish = deadline.until(deadline.end - 2 * evaluation_s)
        if not math.isfinite(best_time) and mix is not hint:  # the exact memory model refuses the solver's mix
            plan, best_time = relieved(model, lower(templates, hint, space.groups_by_type, tp), failed)
            mix, why = hint, why + "; the solver's mix overflows the exact memory model, the incumbent kept"
        objective = modelled_time(templates, mix)  # the model's answer; the polish below may beat it
        balanced = rebalance_exact(model, plan, polish)
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
                model, lower(templates, other, space.groups_by_type, tp), polish), failed)
            if value < best_time * (1 - 1e-12):
                plan, best_time, mix = candidate, value, other
                why += "; a neighbouring mix is faster when evaluated exactly"
        polished = rebalance_exact(model, polish_splits(model, plan, polish), polish) \
            if polish.left() >= evaluation_s else plan
        if polished != plan:
            polished, value = relieved(model, polished, failed)
            if value < best_time * (1 - 1e-12):
                plan, best_time = polished, value
                why += "; layer splits polished on the exact 1F1B time"
        if polish.left() >= 2 * evaluation_s:  # each move is one exact evaluation; the check follows
            stepped, value = polish_step_splits(model, plan, failed, polish.until(polish.end - evaluation_s))
            if value < best_time * (1 - 1e-12):
                plan, best_time = stepped, value
                why += "; layer splits polished on the exact step"
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
    status, mix, bound, build_s, wall = solve_level_model(lm, deadline, options)
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


def search_plan(instance: Instance, failed: frozenset[int], deadline: Deadline, options: SolverOptions = DEFAULT,
                model: PerfModel | None = None) -> SolveResult[Plan]:
    """The fastest reconfigured plan over the survivors, exact for the performance model.

    Incumbents: the template path (scale, TEMPLATE_SHARE of the time), the paper's enumeration
    (within a share of the time limit). Proof: branch and bound over the whole space (`exact.py`)
    when it is small enough, else the relaxation bound (`bounds.py`). `objective` is the returned
    plan's exact step, `bound` a lower bound on the exact step of every plan in SPACE, OPTIMAL
    only when they meet within OPTIMALITY_TOLERANCE; every plan passes the checker. `deadline`
    bounds the whole search; `stopped_early` says it ran out before proving its answer."""
    start = time.perf_counter()
    seed = options.seed
    budget_s = deadline.left()
    model = model or PerfModel(instance)
    if deadline.left() < MIN_SEARCH_S:
        return SolveResult(Status.NO_SOLUTION, None, None, None, 0.0, options.backend, 0.0, seed,
                           f"not started: {deadline.left():.3f} s left of the decision's time limit",
                           stopped_early=True)
    tp = instance.plan.tensor_parallel
    live = [d for d in range(instance.num_devices) if d not in failed]
    groups = survivor_groups(instance, failed, tp)
    floor = memory_floor(model, groups, instance.global_micro_batches, live)
    if floor.stages is None:  # proven before any enumeration: nothing in the space fits in memory
        return SolveResult(Status.INFEASIBLE, None, None, None, time.perf_counter() - start, "bound", 0.0, seed,
                           f"{floor.reason}; space: {SPACE}")
    # Beyond EXACT_GROUPS the relaxation is the only bound: it runs first, so the incumbents' searches
    # (templates, their level model and exact polish: as long as they are given) cannot leave it a
    # remainder too short to finish (16,384 devices: 1-2 s of CPU; cut short its gap was 2.6-8%). Cut
    # short here, it resumes at the end with what is left, its finished whole-layer caps kept.
    relaxation, scale_bound, resume = None, None, False
    if len(groups) > EXACT_GROUPS:
        relaxation = RelaxationBound(model, groups, instance.global_micro_batches, live)
        first = deadline.share(SCALE_BOUND_SHARE)  # after the tables: their build is no part of the share
        scale_bound = relaxation.value(first)
        resume = first.expired()
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
    if len(groups) <= EXACT_GROUPS and not deadline.expired():  # P copies of one pipeline
        copies = copy_plans(instance, failed, model, deadline.share(COPIES_SHARE), value)
        if copies and copies[0][1] < value * (1 - 1e-12):
            plan, value, used = copies[0][0], copies[0][1], "copies"
            notes.append(f"copies of one pipeline are faster ({len(copies[0][0].pipelines)} pipelines)")
    if len(groups) <= EXACT_GROUPS and not deadline.expired():  # stage columns in one node each, cut by the copies' step
        columns = column_plans(instance, failed, model, deadline.share(COLUMN_SHARE), value)
        if columns and columns[0][1] < value * (1 - 1e-12):
            plan, value, used = columns[0][0], columns[0][1], "columns"
            notes.append("a column plan (the stages of each layer range in one node) is faster")
    # The branch and bound's floors against the incumbent so far (each inventory's only up to it): when
    # every one meets it, it is optimal, and the searches for other incumbents (placement polish,
    # whole-layer shapes) are skipped. Tables built here serve the branch and bound's own refining below.
    prepared = exact_floors(instance, model, failed, deadline.share(EXACT_SHARE)) \
        if plan is not None and len(groups) <= EXACT_GROUPS and not deadline.expired() else None
    floored = isinstance(prepared, Inventories) and prepared.refine(value, deadline.share(EARLY_REFINE_SHARE))
    if plan is not None and len(groups) <= EXACT_GROUPS and not deadline.expired() and not floored:
        placed, placed_value = polish_placement(model, plan, failed, deadline.share(PLACEMENT_SHARE))
        if placed_value < value * (1 - 1e-12):
            plan, value, used = placed, placed_value, f"{used}, placement polish"
            notes.append("stages traded TP groups of their device type (placement polish)")
        if not deadline.expired():  # tied slowest pipelines, each sped by its own swap at once
            placed, placed_value = polish_critical(model, plan, failed, deadline.share(PLACEMENT_SHARE))
            if placed_value < value * (1 - 1e-12):
                plan, value, used = placed, placed_value, f"{used}, joint swaps"
                notes.append("the tied slowest pipelines traded TP groups together (joint swaps)")
        if not deadline.expired():  # tied slowest pipelines, each a stage less at once
            placed, placed_value = polish_merged(model, plan, failed, deadline.share(PLACEMENT_SHARE))
            if placed_value < value * (1 - 1e-12):
                plan, value, used = placed, placed_value, f"{used}, merged stages"
                notes.append("the tied slowest pipelines merged two neighbouring stages (merged stages)")
    # One device type: whole-layer splits priced by 1F1B path families (solve/homogeneous.py; tens of ms
    # below 16 layers, 0.1-0.4 s at 38 layers and 256 micro-batches), before the branch and bound.
    whole: HomogeneousBound | None = None
    if plan is not None and not deadline.expired() and not floored:
        whole = homogeneous_bound(instance, model, failed, deadline.share(HOMOGENEOUS_SHARE), value)
    exact = None
    if not deadline.expired() or floored:  # floored: no tree left to search, the proof stands at the deadline
        exact = exact_search(instance, model, failed, value, deadline.share(EXACT_SHARE), prepared)
    elif isinstance(prepared, Inventories):  # no time for the trees: the floors built still bound every plan
        exact = ExactOutcome(None, value, False, len(prepared.prices), 0, "no time left for the branch and bound",
                             min(prepared.floors))
    if exact is None and len(groups) <= ENUMERATION_GROUPS and not deadline.expired():
        share = min(budget_s * ENUMERATION_SHARE, deadline.left())
        paper = enumerate_plans(instance, failed, deadline.within(max(share, 0.01)), model=model)
        paper_plan, paper_value = _exact_value(model, paper.solution, failed)
        if paper_value < value * (1 - 1e-12):
            plan, value, used = paper_plan, paper_value, "enumeration"
            notes.append(f"the paper's enumeration ({paper.status.value}) found a faster plan")
    # An exhausted branch and bound already proved its incumbent (or the plan it was given) optimal: the
    # bound-guided sets could not beat it (32-64 seed 164 spent 1.4 s of its 1.85 s there after the proof).
    proven = exact is not None and exact.complete
    if whole is not None and not proven and whole.value < value * (1 - OPTIMALITY_TOLERANCE) \
            and not deadline.expired():
        built = shape_plans(instance, model, failed, whole, deadline.share(0.9), plan)  # only incumbents
        if built and built[0][1] < value * (1 - 1e-12):
            plan, value, used = built[0][0], built[0][1], "bound-guided pipeline sets"
            notes.append("a pipeline set the whole-layer bound points at is faster")
    if exact is not None:
        notes.append(exact.reason)
        if exact.plan is not None and exact.objective < value * (1 - 1e-12):
            plan, value, used = exact.plan, exact.objective, "branch-and-bound"
    # One device type, identical blocks, few groups: the exhaustive search over layer counts (solve/blocks.py),
    # only once the whole-layer bound stands (cut short, it leaves that bound, not none)
    blocks = None
    if plan is not None and not proven and not deadline.expired() and whole is not None \
            and whole.value < value * (1 - OPTIMALITY_TOLERANCE):
        blocks = blocks_search(instance, model, failed, deadline.share(BLOCKS_SHARE), value)
        if blocks is not None and blocks.plan is not None and blocks.value < value * (1 - 1e-12):
            plan, value, used = blocks.plan, blocks.value, "layer counts"
            notes.append("the search over layer counts found a faster plan")
    if exact is not None and exact.complete:
        bound: float | None = value
    elif blocks is not None and blocks.complete:
        bound = value * (1 - PRUNE)  # nothing in SPACE is faster by more than PRUNE (the status note says so)
    elif scale_bound is None and deadline.expired() and (exact is None or exact.bound <= 0) and whole is None:
        bound = None  # no time for the relaxation (seconds at 16,384 devices): the gap is unknown, and
        notes.append("no time left for the relaxation bound")  # with no plan, infeasibility unproven
    else:
        if relaxation is not None and scale_bound is not None:
            bound = max(scale_bound, relaxation.value(deadline)) if resume and not deadline.expired() else scale_bound
        else:
            bound = 0.0 if deadline.expired() else relaxation_bound(model, groups, instance.global_micro_batches,
                                                                    live, deadline)
        if exact is not None and exact.bound > bound:  # the branch and bound's own floor (memory-aware)
            bound = exact.bound
            notes.append("bound: the branch and bound's relaxation (every inventory's floor)")
        if whole is not None and whole.value > bound:
            bound = whole.value
            notes.append("bound: whole-layer splits of one device type (1F1B path families, "
                         f"least at {whole.pipelines} pipelines of at least {whole.least_stages} stages)"
                         if whole.pipelines else "bound: whole-layer splits of one device type meet the plan")
    wall = time.perf_counter() - start
    space = f"space: {SPACE}"
    if (model.options.virtual_stages or 1) > 1:
        space += (f"; interleaved with {model.options.virtual_stages} chunks per device: each pipeline runs at "
                  "least as many micro-batches as it has stages (Megatron-LM's schedule refuses fewer)")
    if plan is None or not math.isfinite(value):
        if (exact is not None and exact.complete) or (bound is not None and not math.isfinite(bound)):
            reason = template.reason if template.status is Status.INFEASIBLE else \
                infeasibility_reason(instance, model, groups)
            return SolveResult(Status.INFEASIBLE, None, None, None, wall, used, 0.0, seed, f"{reason}; {space}")
        return SolveResult(Status.NO_SOLUTION, None, None, bound, wall, used, 0.0, seed,
                           "no plan found in time; " + "; ".join(notes) + f"; {space}", stopped_early=True)
    if bound is not None and value - bound > OPTIMALITY_TOLERANCE * value and len(groups) <= EXACT_GROUPS:
        # Unproven: the incumbent's splits moved one layer on the whole step, in what time is left (ms at 64
        # devices): aligned splits share rings (32-64 seed 155: the branch and bound's plan, 9e-6 above
        # the floor, is one such move from the optimum).
        stepped, stepped_value = polish_step_splits(model, plan, failed, deadline)
        if stepped_value < value * (1 - 1e-12):
            plan, value, used = stepped, stepped_value, f"{used}, split polish"
            notes.append("layer splits polished on the exact step")
    plan = assert_sound(instance, plan, failed, model=model, stage="search")
    bound = None if bound is None else min(bound, value)
    status = Status.OPTIMAL if bound is not None and value - bound <= OPTIMALITY_TOLERANCE * value else Status.FEASIBLE
    if status is Status.OPTIMAL and exact is not None and exact.complete:
        notes.append("proven: the branch and bound exhausted the space")
    elif status is Status.OPTIMAL and blocks is not None and blocks.complete:
        notes.append("proven: the search over layer counts exhausted the space")
    elif status is Status.OPTIMAL:
        notes.append("proven: the plan meets the relaxation bound")
    elif bound is not None:
        notes.append("not proven optimal: the bound is the relaxation's (a lower bound of the exact model)")
    stopped = status is not Status.OPTIMAL and deadline.expired()
    if stopped:
        notes.append(f"stopped at the deadline ({budget_s:.2f} s)")
    return SolveResult(status, plan, value, bound, wall, used, 0.0, seed, "; ".join(notes) + f"; {space}",
                       stopped_early=stopped)
