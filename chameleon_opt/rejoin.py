"""Devices that come back: the scale-up decision, on the one planning path's terms.

A repaired or replaced device returns holding no model state. Three candidates, scored by the
same Eq. 8 rule as a failure's (`decision.score_option`):

- keep-running: the running plan goes on, the newcomers idle (no transition);
- rejoin-slots: when the running plan reroutes the work of slots whose devices are all back, those
  slots run their own micro-batches again: the newcomers take their old place and stop the peers
  from carrying the rerouted work; only those slots' state is copied to them (the cheapest
  scale-up);
- scale-up: the plan search over every live device; the migration scheduler copies the state each
  device lacks from its live holders; transition = search + migration + process-group rebuild.

No torch here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from chameleon_opt.comm import communication_plan
from chameleon_opt.errors import InfeasibleError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.relief import choose_reliefs
from chameleon_opt.plan import Plan
from chameleon_opt.planning import PlanningOptions, RecoveryDecision, executable
from chameleon_opt.decision import GROUP_REBUILD_S, RecoveryOption, mean_next_fault_s, score_option
from chameleon_opt.solve.result import SolveResult
from chameleon_opt.solve.deadline import Deadline, StageTime
from chameleon_opt.solve.search import search_plan

JOIN_POLICIES = ("keep-running", "rejoin-slots", "scale-up")


def _stand_ins(layout: Plan, joined: frozenset[int]) -> tuple[Plan, frozenset[int]]:
    """The layout with each joining device replaced by a failed stand-in id (-1 - d): it still sits
    in its old slot but holds nothing, so no state is ever sent from it."""
    stand_in = {d: -1 - d for d in joined}
    old = dataclasses.replace(layout, pipelines=tuple(
        dataclasses.replace(pipe, stages=tuple(
            dataclasses.replace(stage, devices=tuple(stand_in.get(d, d) for d in stage.devices))
            for stage in pipe.stages)) for pipe in layout.pipelines))
    return old, frozenset(stand_in.values())


def rejoined_slots(current: Plan, failed_after: frozenset[int], joined: frozenset[int]) -> Plan | None:
    """The running plan with the rerouting of every slot whose devices are all live again undone
    (None when no such slot exists)."""
    back = {(j, s) for j, pipe in enumerate(current.pipelines) for s, stage in enumerate(pipe.stages)
            if joined.intersection(stage.devices) and not failed_after.intersection(stage.devices)}
    if not back or not any((r.from_pipeline, r.stage) in back for r in current.rerouted):
        return None
    return dataclasses.replace(current, rerouted=tuple(r for r in current.rerouted
                                                       if (r.from_pipeline, r.stage) not in back))


SearchFn = Callable[[Instance, frozenset[int], Deadline], tuple[SolveResult[Plan], float]]
"""(state, failed, deadline) -> (the plan search's result, seconds charged as its time)."""


def _search(state: Instance, failed: frozenset[int], deadline: Deadline, model: PerfModel,
            options: PlanningOptions) -> tuple[SolveResult[Plan], float]:
    started = time.perf_counter()
    result = search_plan(state, failed, model=model, deadline=deadline, options=options.solver)
    return result, deadline.used_since(started)  # none on a deterministic deadline: its caller charges its own


def join_candidates(instance: Instance, current: Plan, failed_before: frozenset[int], joined: frozenset[int],
                    options: PlanningOptions = PlanningOptions(), deadline: Deadline | None = None,
                    model: PerfModel | None = None, search: SearchFn | None = None
                    ) -> tuple[tuple[RecoveryOption, ...], tuple[StageTime, ...]]:
    """Every candidate for the return of `joined` (failed until now, holding no state), scored by
    Eq. 8 under the instance's fault statistics. `instance.plan` is the layout (no rerouting),
    `current` the plan running now (the layout plus its rerouting).

    `model` and `search` let the failure-trace simulator price with the model it believes and
    reuse its cached searches (charging its own search time); by default a fresh model and a
    timed `search_plan` within the deadline."""
    deadline = deadline or Deadline.after(options.time_limit_s, deterministic=options.solver.deterministic)
    failed = failed_before - joined
    state = dataclasses.replace(instance, failed_devices=failed)
    model = model or PerfModel(state)
    batch = instance.spec.training.global_batch
    explicit = options.next_fault_s if options.next_fault_s is not None else instance.spec.failures.next_fault_s
    mean = explicit if explicit is not None else mean_next_fault_s(instance, instance.num_devices - len(failed))

    def scored(option: RecoveryOption) -> RecoveryOption:
        if not option.feasible or option.estimate is None:
            return option
        return dataclasses.replace(option, score=score_option(batch, option.iteration_time_s, option.transition_s,
                                                              explicit, mean))

    old, stand_ins = _stand_ins(instance.plan, joined)
    keep = scored(RecoveryOption("keep-running", True, f"devices {sorted(joined)} idle until the next decision",
                                 current, model.evaluate(current, failed_before), 0.0))
    candidates = [keep]
    stages: list[StageTime] = []
    back = rejoined_slots(current, failed, joined)
    if back is not None:
        started = time.perf_counter()
        relieved = choose_reliefs(model, back, failed)
        if relieved is None:
            candidates.append(RecoveryOption("rejoin-slots", False, "the slots taken back overflow memory"))
        else:
            back = relieved[0]
            communication = communication_plan(state, old, back, failed | stand_ins, assign=False, model=model,
                                               deadline=deadline.share(0.3), options=options.solver)
            migration = communication[0]
            candidates.append(scored(RecoveryOption(
                "rejoin-slots", True, f"devices {sorted(joined)} take back their slots (their state copied, "
                f"{migration.total_bytes:,} B), the peers stop carrying the rerouted work",
                communication[2].plan, model.evaluate(communication[2].plan, failed),
                migration.makespan_s + GROUP_REBUILD_S, communication=communication)))
        stages.append(StageTime("rejoin-slots", max(deadline.end - started, 0.0), time.perf_counter() - started,
                                False, candidates[-1].reason))
    started = time.perf_counter()
    result, search_s = (search or (lambda s, f, d: _search(s, f, d, model, options)))(state, failed,
                                                                                      deadline.share(0.6))
    stages.append(StageTime("search", max(deadline.end - started, 0.0), time.perf_counter() - started,
                            result.stopped_early, result.status.value))
    if result.solution is None:
        candidates.append(RecoveryOption("scale-up", False, f"no plan over the live devices: {result.reason}",
                                         solve=result))
    else:
        communication = communication_plan(state, old, result.solution, failed | stand_ins, model=model,
                                           deadline=deadline, options=options.solver)
        migration = communication[0]
        candidates.append(scored(RecoveryOption(
            "scale-up", True, f"{len(communication[2].plan.pipelines)} pipelines over every live device, migration "
            f"{migration.total_bytes:,} B in {migration.rounds} rounds", communication[2].plan,
            model.evaluate(communication[2].plan, failed), search_s + migration.makespan_s + GROUP_REBUILD_S,
            solve=result, communication=communication)))
    return tuple(candidates), tuple(stages)


def plan_join(instance: Instance, current: Plan, failed_before: frozenset[int], joined: frozenset[int],
              options: PlanningOptions = PlanningOptions(), deadline: Deadline | None = None) -> RecoveryDecision:
    """The decision when `joined` (failed until now) come back without state: the best of
    `join_candidates` by Eq. 8, lowered. `instance.plan` is the layout (no rerouting), `current`
    the plan running now (the layout plus its rerouting).

    Raises InfeasibleError when no candidate is usable."""
    deadline = deadline or Deadline.after(options.time_limit_s, deterministic=options.solver.deterministic)
    failed = failed_before - joined
    state = dataclasses.replace(instance, failed_devices=failed)
    candidates, stages = join_candidates(instance, current, failed_before, joined, options, deadline)
    usable = [c for c in candidates if c.feasible and c.score > 0]
    if not usable:
        raise InfeasibleError("no usable candidate for the returning devices: " + "; ".join(
            f"{c.policy}: {c.reason}" for c in candidates))
    best = max(usable, key=lambda c: c.score)
    others = ", ".join(f"{c.policy} {c.score:.3f}" for c in candidates if c is not best and c.feasible)
    reason = f"{best.policy} scores {best.score:.3f} samples/s" + (f" (vs {others})" if others else "")
    if best.policy == "keep-running":
        # Nothing changes: the running plan with the newcomers still out of it.
        keep_state = dataclasses.replace(instance, failed_devices=failed_before)
        return executable(keep_state, best, failed_before, reason, candidates, deadline, options.solver, stages)
    return executable(state, best, failed, reason, candidates, deadline, options.solver, stages)
