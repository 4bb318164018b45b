"""The decision core: a rerouting and a reconfiguration candidate, their transition costs, and
the paper's Eq. 8 choice between them for the expected time to the next fault. It sits below
`planning.py` (which adds communication, the check and lowering) and below every simulated policy
in `recovery/` (which decide through `decide` and score with `score_option`).

Eq. 8: score = (B / t_step) x (D - t_transition) / D; a candidate with D <= t_transition is
unusable. With D unknown but exponential with mean mu (per-device MTBF / survivors), the
expected fraction of the interval spent training is E[max(D - tau, 0)] / E[D] = exp(-tau / mu),
so the score becomes (B / t_step) x exp(-tau / mu): the expectation over D, not a point.
`score_option` is the one scorer every decision uses (point D, its expectation, the hybrid's
rate, or steady throughput without statistics).

Every candidate is one typed record, `RecoveryOption`; `decide` builds them within one
`Deadline` (rerouting first, then the search and its communication, each a share of what is left)
and records each stage's time in `Decision.stages`. `chameleon_opt.planning.plan_recovery` is the
entry everyone calls; it adds the chosen option's communication and lowering.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from chameleon_opt.check import check_plan
from chameleon_opt.comm import assign_slots, communication_plan, schedule_allreduce
from chameleon_opt.comm.api import CommInfo
from chameleon_opt.comm.migration import FINISH_S_PER_TRANSFER, too_many
from chameleon_opt.comm.reshard import CheckpointReshard, checkpoint_reshard
from chameleon_opt.comm.state import held_every_copy, moved_pairs_at_least, shard_copies_lost, shard_copies_phrase
from chameleon_opt.comm.transfers import Migration
from chameleon_opt.errors import InfeasibleError, InputError, UnrecoverableError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import Estimate, PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.solve.backends import DEFAULT, SolverOptions
from chameleon_opt.solve.bubbles import BubbleSchedule, rerouted_step
from chameleon_opt.solve.deadline import Deadline, DeadlinePassed, StageTime
from chameleon_opt.solve.result import SolveResult, Status
from chameleon_opt.solve.reroute import reroute_plan
from chameleon_opt.solve.local import disruption, local_plans
from chameleon_opt.solve.search import OPTIMALITY_TOLERANCE, search_plan
from chameleon_opt.solve.target import target_plan

GROUP_REBUILD_S = 5.0
"""Re-forming every process group of a plan (NCCL communicator creation at scale takes seconds;
assumed, not measured here). A reconfiguration pays it in proportion to the communicators it
changes (solve/local.py `disruption`: TP groups and data-parallel rings whose membership is new);
rerouting keeps its groups minus the dead and pays none."""


def eq8_score(global_batch: int, step_s: float, transition_s: float, next_fault_s: float) -> float:
    """Eq. 8 with a known D: samples/s averaged over the interval to the next fault."""
    if next_fault_s <= transition_s or step_s <= 0:
        return 0.0
    return global_batch / step_s * (next_fault_s - transition_s) / next_fault_s


def expected_score(global_batch: int, step_s: float, transition_s: float, mean_next_fault_s: float) -> float:
    """Eq. 8 in expectation over an exponential D with the given mean."""
    if step_s <= 0:
        return 0.0
    return global_batch / step_s * math.exp(-transition_s / mean_next_fault_s)


def hybrid_samples_per_s(global_batch: int, reroute_step_s: float, final_step_s: float, background_s: float,
                         switch_s: float, next_fault_s: float | None, mean_next_fault_s: float | None) -> float:
    """Samples/s until the next fault when rerouting at once, reconfiguring in the background for
    `background_s` (search and migration overlap training), then pausing `switch_s` to switch.

    Point D: (B/t_r min(D, tau) + B/t_c max(D - tau - p, 0)) / D. Exponential D with mean mu:
    E[min(D, tau)] = mu (1 - e^{-tau/mu}) and E[max(D - tau - p, 0)] = mu e^{-(tau+p)/mu}, so the
    rate is B/t_r (1 - e^{-tau/mu}) + B/t_c e^{-(tau+p)/mu}. Without statistics: B / t_c."""
    rate_r, rate_c = global_batch / reroute_step_s, global_batch / final_step_s
    if next_fault_s is not None:
        d = next_fault_s
        return (rate_r * min(d, background_s) + rate_c * max(d - background_s - switch_s, 0.0)) / d
    if mean_next_fault_s is not None:
        mu = mean_next_fault_s
        return rate_r * (1 - math.exp(-background_s / mu)) + rate_c * math.exp(-(background_s + switch_s) / mu)
    return rate_c


def score_option(global_batch: int, step_s: float, transition_s: float, next_fault_s: float | None,
                 mean_next_fault_s: float | None, interim_step_s: float | None = None,
                 background_s: float = 0.0) -> float:
    """The one Eq. 8 scorer: a hybrid (trains at `interim_step_s` for `background_s`, then pauses
    `transition_s`) by its rate until the next fault; otherwise Eq. 8 with a point D, in
    expectation over an exponential D, or steady throughput when neither is known."""
    if step_s <= 0:
        return 0.0
    if interim_step_s is not None:
        return hybrid_samples_per_s(global_batch, interim_step_s, step_s, background_s, transition_s, next_fault_s,
                                    mean_next_fault_s)
    if next_fault_s is not None:
        return eq8_score(global_batch, step_s, transition_s, next_fault_s)
    if mean_next_fault_s is not None:
        return expected_score(global_batch, step_s, transition_s, mean_next_fault_s)
    return global_batch / step_s


def break_even_next_fault(step_reroute_s: float, step_dynamic_s: float, transition_dynamic_s: float) -> float:
    """D above which reconfiguration wins (rerouting's transition ~ 0): t_tr / (1 - t_dyn / t_rr)."""
    if step_dynamic_s >= step_reroute_s:
        return math.inf
    return transition_dynamic_s / (1 - step_dynamic_s / step_reroute_s)


def mean_next_fault_s(instance: Instance, survivors: int) -> float | None:
    """The expected D: explicit when the instance gives it, else per-device MTBF / survivors."""
    failures = instance.spec.failures
    if failures.next_fault_s is not None:
        return failures.next_fault_s
    if failures.mtbf_hours_per_device is not None and survivors > 0:
        return failures.mtbf_hours_per_device * 3600.0 / survivors
    return None


def migration_lower_bound_s(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int]) -> float:
    """Largest bytes any device must receive (layers it owns in the new plan but did not hold),
    and the bytes each layer's surviving holders must send between them, over their bandwidth."""
    per_param = model.param_bytes + model.optimizer_bytes
    held: dict[int, set[int]] = {}
    for pipe in old.pipelines:
        for stage in pipe.stages:
            for d in stage.devices:
                if d not in failed:
                    held[d] = set(range(stage.first, stage.end))
    holders: dict[int, int] = {}
    for layers in held.values():
        for layer in layers:
            holders[layer] = holders.get(layer, 0) + 1
    params = model.workload.params / new.tensor_parallel
    worst_receive, need_per_layer = 0.0, {}
    for pipe in new.pipelines:
        for stage in pipe.stages:
            for d in stage.devices:
                missing = [layer for layer in range(stage.first, stage.end) if layer not in held.get(d, set())]
                nbytes = float(params[missing].sum()) * per_param
                worst_receive = max(worst_receive, nbytes)
                for layer in missing:
                    need_per_layer[layer] = need_per_layer.get(layer, 0.0) + float(params[layer]) * per_param
    worst_send = max((need / max(holders.get(layer, 1), 1) for layer, need in need_per_layer.items()), default=0.0)
    return max(worst_receive, worst_send) / model.inter.bandwidth


Communication = tuple[Migration, list[list[str]], CommInfo]
"""(migration, all-reduce rounds, info) of a scheduled plan change (`comm.communication_plan`)."""

REROUTE_SHARE = 0.3   # of the time left, for the rerouting MILP (ms at small scale: the rest passes on)
SEARCH_SHARE = 0.6    # of the time left after rerouting, for the plan search
LOCAL_SHARE = 0.2     # of the time left after rerouting, for the local re-plans (a few exact evaluations)
FREE_SHARE = 0.35     # with a target trainer, for the free search that prices the restriction
COMM_SHARE = 0.75     # of the time left after the search, for the reconfiguration's communication
LOCAL_COMM_SHARE = 0.4  # of the time left, for a local plan's when a faster global plan's migration follows
REMAP_S_PER_DEVICE = 25e-6
"""Re-mapping the searched plan's groups onto slots and listing the state each device lacks, per
surviving device (15-23 us measured at 16,384 and 131,072 devices on a 2-core machine): checked
before either starts, so a migration that cannot be listed in time is declared, not overrun."""


@dataclass(frozen=True)
class RecoveryOption:
    """One way to recover, as the decision weighs it: its plan and predicted step, its
    transition (time with no training), its Eq. 8 score, the solve behind it and, once
    scheduled, its communication. A hybrid carries the rerouting it runs first (`interim`)."""

    policy: str
    feasible: bool
    reason: str
    plan: Plan | None = None
    estimate: Estimate | None = None
    transition_s: float = 0.0
    score: float = 0.0
    solve: SolveResult[Plan] | None = None
    interim: RecoveryOption | None = None
    communication: Communication | None = None
    scope: str = ""               # a reconfiguration's: "local" (intact pipelines kept) or "global"
    rebuild_s: float = 0.0        # of transition_s: re-creating the communicators the change touches
    devices_touched: int = 0      # live devices whose stage, TP rank or neighbours change
    groups_rebuilt: int = 0       # communicators (TP groups, data-parallel rings) created anew
    bytes_moved: int = 0          # state migrated (or read from the checkpoint) before training resumes
    reshard: CheckpointReshard | None = None  # a TP-degree change: the state is re-sharded from the checkpoint
    schedule: BubbleSchedule | None = None    # a bubble-filled rerouting: every device's op order, as priced

    @property
    def iteration_time_s(self) -> float:
        return self.estimate.iteration_time_s if self.estimate else math.inf

    @property
    def step_s(self) -> float | None:
        return None if self.estimate is None else self.iteration_time_s

    @property
    def proven_infeasible(self) -> bool:
        """Unusable for a proven reason (its solver proved infeasibility), not for want of time."""
        return not self.feasible and self.solve is not None and self.solve.status is Status.INFEASIBLE

    def to_json(self) -> dict[str, object]:
        return {"policy": self.policy, "feasible": self.feasible, "reason": self.reason,
                "iteration_time_s": self.step_s, "transition_time_s": self.transition_s, "score": self.score,
                "solve": None if self.solve is None else self.solve.to_json(),
                **({"scope": self.scope, "rebuild_s": self.rebuild_s, "devices_touched": self.devices_touched,
                    "groups_rebuilt": self.groups_rebuilt, "bytes_moved": self.bytes_moved} if self.scope else {}),
                **({"tensor_parallel_change": self.reshard.to_json()} if self.reshard is not None else {})}

    @property
    def pause_s(self) -> float:
        """Of the transition, what cannot overlap training: the communicators' rebuild, and a TP
        change's read of the checkpoint (it loads the last committed step, so it follows it)."""
        return self.rebuild_s + (self.reshard.read_s if self.reshard is not None else 0.0)


@dataclass(frozen=True)
class Decision:
    """The policy's choice among its candidates; `chosen` is None when none is usable, and
    `proven` then says whether that is proven (every candidate infeasible, or never paying off)
    or only for want of time (then `stages` say which stage the deadline cut short)."""

    policy: str
    reason: str
    chosen: RecoveryOption | None
    candidates: tuple[RecoveryOption, ...]
    next_fault_s: float | None
    stages: tuple[StageTime, ...] = ()
    proven: bool = True


def _stage(name: str, deadline: Deadline, started: float, result: SolveResult | None) -> StageTime:
    wall = time.perf_counter() - started
    stopped = result is not None and result.stopped_early
    note = "" if result is None else f"{result.backend} {result.status.value}"
    return StageTime(name, max(deadline.end - started, 0.0), wall, stopped, note)


def reroute_candidate(instance: Instance, failed: frozenset[int], model: PerfModel, deadline: Deadline,
                      options: SolverOptions = DEFAULT, *, bubble_filling: bool = True) -> RecoveryOption:
    """Keep the layout, give the failed stages' work to their peers in decided shares (transition ~ 0);
    with `bubble_filling`, also in whole micro-batches placed into the peers' idle time."""
    result = reroute_plan(instance, failed, deadline, options, model=model)
    if not result.status.has_solution or result.solution is None:
        return RecoveryOption("reroute", False, result.reason or result.status.value, solve=result)
    estimate = model.evaluate(result.solution, failed)
    plan, reason = result.solution, f"layout kept; {result.reason}"
    schedule: BubbleSchedule | None = None
    if bubble_filling and not deadline.expired():
        try:  # the same work in whole micro-batches, placed into the peers' idle time
            filled = rerouted_step(model, instance.plan, failed, deadline, options, floor_ok=False)
        except InfeasibleError:
            filled = None
        # The schedule model keeps its own activation limits: the checker's memory model decides.
        if filled is not None and filled.step_s < estimate.iteration_time_s * (1 - 1e-9) and \
                check_plan(instance, filled.plan, failed, require_tp_in_node=False, model=model).ok:
            plan, schedule = filled.plan, filled.schedule
            reason = f"layout kept; {filled.how} beats the serial shares ({estimate.iteration_time_s:.4g} s)"
            estimate = dataclasses.replace(model.evaluate(plan, failed), iteration_time_s=filled.step_s)
    return RecoveryOption("reroute", True, reason, plan, estimate, 0.0, solve=result, schedule=schedule)


def reconfigure_candidate(instance: Instance, failed: frozenset[int], model: PerfModel, deadline: Deadline,
                          options: SolverOptions = DEFAULT, *, worth: Callable[[float, float], float] | None = None,
                          tp_degrees: tuple[int, ...] = ()) -> tuple[RecoveryOption, tuple[StageTime, ...]]:
    """Re-plan over the survivors, locally (solve/local.py: intact pipelines kept, only the damaged
    ones' survivors and spares re-planned; LOCAL_SHARE of `deadline`) and globally (the search,
    SEARCH_SHARE of what is left), then schedule their migrations: each option's transition = the
    time to find it + its scheduled migration + the rebuild of the communicators it changes. The
    search runs before any migration is scheduled, so a large local migration cannot starve it
    (at 131,072 devices a re-shard's took 13.6 s of 30 and left the search 5 s: its bound was cut
    short). The one `worth` scores higher (Eq. 8: `decide` passes it; else the faster step) is the
    candidate. The global plan's migration is only scheduled when its step beats the local one's
    (else it cannot win: a larger change for no faster step).

    With `tp_degrees` (checked by `check_tp_degrees`) each other TP degree is searched too, one
    search each over the survivors' groups of that degree, the search's time split evenly among
    the degrees (without them the current degree's search gets all of it, as before), and priced
    as a checkpoint re-shard (`_resharded`)."""
    worth = worth or (lambda step, transition: -step)
    stages: list[StageTime] = []
    start = time.perf_counter()
    searching = deadline.share(LOCAL_SHARE)
    local = local_plans(instance, failed, model, searching)
    local_s = deadline.used_since(start)  # charged to the transition: none on a deterministic deadline
    stages.append(StageTime("local search", max(searching.end - start, 0.0), time.perf_counter() - start,
                            searching.expired(),
                            f"{len(local)} local plan(s) fit" + (f"; best: {local[0].how}" if local else "")))
    start = time.perf_counter()
    others = [tp for tp in tp_degrees if tp != instance.plan.tensor_parallel]
    window = deadline.share(SEARCH_SHARE)
    searching = window.share(1 / (1 + len(others)))  # no other degree: the whole window
    result = search_plan(instance, failed, model=model, deadline=searching, options=options)
    search_s = deadline.used_since(start)
    stages.append(_stage("search", searching, start, result))
    changed: list[tuple[SolveResult[Plan], float]] = []
    for k, tp in enumerate(others):  # the instance seen at another degree: the search forms groups of tp
        started = time.perf_counter()
        searching = window.share(1 / (len(others) - k))
        other = search_plan(dataclasses.replace(instance, plan=Plan(tp, ())), failed, model=model,
                            deadline=searching, options=options)
        stages.append(_stage(f"search (TP {tp})", searching, started, other))
        if other.status.has_solution and other.solution is not None:
            changed.append((other, deadline.used_since(started)))
    found = result.status.has_solution and result.solution is not None
    global_step = model.evaluate(result.solution, failed).iteration_time_s if found else math.inf
    local_option, chosen, skipped = None, None, []
    # The fastest first; if its migration cannot be scheduled in time (_scheduled's only unusable answer),
    # the others by how little they move (a re-cut in the damaged pipeline's place moves only its own state).
    # One whose receiving (device, layer) pairs alone take longer to cut than the time left is passed over
    # unless it is the last. When the global plan is faster, its migration follows: LOCAL_COMM_SHARE.
    order = local[:1] + sorted(local[1:], key=lambda c: (c.receiving, c.step_s))
    for index, candidate in enumerate(order):
        needed = candidate.receiving * FINISH_S_PER_TRANSFER
        if index + 1 < len(order) and needed > deadline.left():
            skipped.append(f"{candidate.how} ({candidate.step_s:.4g} s per step): its migration's "
                           f"{candidate.receiving:,} (device, layer) pairs take about {needed:.2f} s to cut and "
                           f"schedule, {deadline.left():.2f} s left")
            continue
        share = LOCAL_COMM_SHARE if global_step < candidate.step_s * (1 - 1e-9) else COMM_SHARE
        option = _scheduled(instance, failed, model, candidate.plan, None, local_s, "local", deadline, options,
                            stages, assign=False, note=candidate.how, share=share, priced=candidate.estimate)
        if option.feasible or local_option is None:
            local_option, chosen = option, candidate
        if option.feasible or deadline.expired():
            break
        skipped.append(f"{candidate.how} ({candidate.step_s:.4g} s per step): {option.reason}")
    if skipped and local_option.feasible:
        local_option = dataclasses.replace(local_option, reason=local_option.reason + "; faster local plans "
                                           "passed over, their migrations not scheduled in time: " + "; ".join(skipped))
    if not found:
        global_option = RecoveryOption("reconfigure", False, result.reason or result.status.value, solve=result)
    elif local_option is not None and local_option.feasible and \
            global_step >= local_option.iteration_time_s * (1 - 1e-9):
        global_option = RecoveryOption("reconfigure", False, "the global plan is no faster than the local one, whose "
                                       "change is smaller: not scheduled", solve=result)
    else:
        global_option = _scheduled(instance, failed, model, result.solution, result, search_s, "global", deadline,
                                   options, stages, assign=True)
    resharded = [_resharded(instance, failed, model, other, found_s, deadline, options, stages)
                 for other, found_s in changed]
    usable = [o for o in (local_option, global_option, *resharded) if o is not None and o.feasible]
    if not usable:
        if local_option is not None:
            return dataclasses.replace(global_option, reason=f"local: {local_option.reason}; global: "
                                       f"{global_option.reason}"), tuple(stages)
        return global_option, tuple(stages)
    best = max(usable, key=lambda o: worth(o.iteration_time_s, o.transition_s))
    rivals = [o for o in (local_option, global_option, *resharded) if o is not None and o is not best]
    reason = best.reason + "".join(f"; the {_named(o)} plan: {o.reason}" if not o.feasible else
                                   f"; the {_named(o)} plan ({o.iteration_time_s:.4g} s per step, transition "
                                   f"{o.transition_s:.3g} s) scores lower" for o in rivals)
    solve = best.solve
    if best.scope == "local":  # a plan of the search's space, bounded by the search's own bound
        bound = None if result.bound is None else min(result.bound, best.iteration_time_s)
        proven = bound is not None and best.iteration_time_s - bound <= OPTIMALITY_TOLERANCE * best.iteration_time_s
        solve = SolveResult(Status.OPTIMAL if proven else Status.FEASIBLE, best.plan, best.iteration_time_s, bound,
                            local_s, "local", 0.0, options.seed, f"local re-plan ({chosen.how}); bound from the "
                            f"global search: {result.reason}", stopped_early=result.stopped_early)
    return dataclasses.replace(best, reason=reason, solve=solve), tuple(stages)


def _named(option: RecoveryOption) -> str:
    return option.scope if option.reshard is None else f"{option.scope} TP {option.reshard.to_tp}"


def _resharded(instance: Instance, failed: frozenset[int], model: PerfModel, result: SolveResult[Plan],
               found_s: float, deadline: Deadline, options: SolverOptions, stages: list[StageTime]) -> RecoveryOption:
    """The searched plan of another TP degree, priced as the re-shard the runtime runs
    (comm/reshard.py): no peer-to-peer transfer (the migration layer moves whole shards of one
    degree), every live device of the plan reads its new shards from the last step's checkpoint,
    and every communicator is rebuilt (every TP group is new and every device's shards change).
    Transition: the search + the slowest device's read + a full rebuild (GROUP_REBUILD_S)."""
    assert result.solution is not None
    plan, started = result.solution, time.perf_counter()
    label = f"communication (TP {plan.tensor_parallel})"
    if deadline.expired():
        stages.append(StageTime(label, 0.0, 0.0, True, "not started"))
        return RecoveryOption("reconfigure", False, f"stopped early: the deadline passed before the TP "
                              f"{plan.tensor_parallel} plan's gradient rounds could be scheduled (raise --time-limit)",
                              solve=result, scope="global")
    reshard = checkpoint_reshard(model, instance.plan, plan, failed)
    allreduce = schedule_allreduce(model, plan, failed, deadline.share(COMM_SHARE), options)
    held = {d for d in instance.plan.devices if d not in failed}
    nothing = SolveResult(Status.OPTIMAL, (), 0.0, 0.0, 0.0, "checkpoint", 0.0, options.seed,
                          f"TP {reshard.from_tp} -> {reshard.to_tp}: no peer-to-peer transfer, every device reads its "
                          "new shards from the checkpoint")
    migration = Migration(plan, (), 0, 0.0, 0.0, 0.0, 0, (), {d: -1 for d in sorted(held)}, nothing)
    comm = CommInfo(plan, None, migration, allreduce, time.perf_counter() - started)
    stages.append(StageTime(label, max(deadline.end - started, 0.0), time.perf_counter() - started,
                            allreduce.solve.stopped_early, f"checkpoint re-shard, all-reduce "
                            f"{allreduce.solve.status.value}"))
    change = disruption(model, instance.plan, plan, failed)
    touched = set(reshard.bytes_per_device) | held  # every device of the plan reads, every old holder drops
    transition = found_s + reshard.read_s + GROUP_REBUILD_S
    why = (f"global at TP {reshard.to_tp} (was {reshard.from_tp}): {len(plan.pipelines)} pipelines over the "
           f"survivors; transition = search {found_s:.2f} s + checkpoint re-shard {reshard.read_s:.3g} s "
           f"({reshard.total_bytes / 1e9:.3g} GB read by {len(reshard.bytes_per_device)} devices at "
           f"{reshard.read_gbps:g} GB/s each: the migration cannot move shards across TP degrees) + rebuilding all "
           f"{change.groups_total} process groups {GROUP_REBUILD_S:.2f} s")
    return RecoveryOption("reconfigure", True, why, plan, model.evaluate(plan, failed), transition, solve=result,
                          communication=(migration, allreduce.rounds, comm), scope="global",
                          rebuild_s=GROUP_REBUILD_S, devices_touched=len(touched), groups_rebuilt=change.groups_total,
                          bytes_moved=reshard.total_bytes, reshard=reshard)


def refuse_context_parallel(instance: Instance) -> None:
    """Raise InputError for a context-parallel job: the searches build TP x PP x DP plans (no cp groups
    of pipelines to keep together), so they would plan a job other than the one running. `estimate`
    prices it (PerfModel.context_parallel_exposed)."""
    cp = instance.spec.training.context_parallel
    if cp > 1:
        raise InputError(instance.path, "training.context_parallel", f"is {cp}: the planner searches tensor x "
                         "pipeline x data parallel plans only (context parallelism is priced by `estimate`, "
                         "not planned)", "set context_parallel to 1 to plan, or use `estimate` for this job")


def check_tp_degrees(instance: Instance, degrees: tuple[int, ...]) -> None:
    """Raise InputError for a candidate TP degree no plan can use: a TP group sits inside one node,
    and the runtime shards attention by heads (query and KV heads) and the MLP by its inner size."""
    arch = instance.workload.architecture
    for tp in degrees:
        widths = {"devices_per_node": instance.devices_per_node}
        if arch is not None:
            widths.update(heads=arch.heads, kv_heads=arch.kv_heads or arch.heads, ffn=arch.ffn)
        bad = [f"{name} {value}" for name, value in widths.items() if tp < 1 or value % tp]
        if bad:
            raise InputError(None, "tp_degrees", f"TP {tp} does not divide {', '.join(bad)}",
                             "give degrees that divide the devices per node, the attention heads, KV heads and "
                             "the MLP's inner size")


def target_candidate(instance: Instance, failed: frozenset[int], model: PerfModel, target: str, *,
                     deadline: Deadline, options: SolverOptions,
                     worth: Callable[[float, float], float] | None = None
                     ) -> tuple[RecoveryOption, tuple[StageTime, ...]]:
    """The reconfiguration `target` can run (solve/target.py: uniform replicas, equal micro-batches,
    global recomputation), weighed against the free plan: the free search first (FREE_SHARE of the
    time, for its plan and its bound), then the uniform space, then the migration. The reason says
    what the restriction costs against the free plan."""
    stages: list[StageTime] = []
    start = time.perf_counter()
    searching = deadline.share(FREE_SHARE)
    free = search_plan(instance, failed, model=model, deadline=searching, options=options)
    stages.append(_stage("search (free)", searching, start, free))
    start = time.perf_counter()
    searching = deadline.share(SEARCH_SHARE)
    result = target_plan(instance, failed, target, model, searching, bound=free.bound)
    found_s = deadline.used_since(start)
    stages.append(_stage(f"search ({target})", searching, start, result))
    if result.solution is None:
        return RecoveryOption("reconfigure", False, result.reason, solve=result, scope=target), tuple(stages)
    # assign=False: the trainer reads each group's slot from its rank (torchrun's node-by-node numbering),
    # so the groups are not re-mapped to save transfers (that would move them off the slots it reads)
    option = _scheduled(instance, failed, model, result.solution, result, found_s, target, deadline, options, stages,
                        assign=False, note=f"uniform plan {target} runs as it is")
    if free.objective is not None and option.feasible:
        cost = option.iteration_time_s / free.objective - 1
        option = dataclasses.replace(option, reason=option.reason + (
            f"; the free plan takes {free.objective:.4g} s per step: the restriction to {target} costs "
            f"{cost:+.1%}" if cost > 1e-9 else f"; as fast as the free plan found ({free.objective:.4g} s)"))
    return option, tuple(stages)


def _scheduled(instance: Instance, failed: frozenset[int], model: PerfModel, plan: Plan,
               result: SolveResult[Plan] | None, found_s: float, scope: str, deadline: Deadline,
               options: SolverOptions, stages: list[StageTime], assign: bool, note: str = "",
               share: float = COMM_SHARE, priced: Estimate | None = None) -> RecoveryOption:
    """`plan` with its migration scheduled within `share` of `deadline`, the stage's time appended
    to `stages`: an option whose transition is `found_s` + migration + the rebuild of the
    communicators it changes, or an unusable one saying why (the deadline passed first).
    `priced`: `plan`'s estimate when the caller has it, used when the plan is run as it is."""
    started = time.perf_counter()
    label = f"communication ({scope})"
    comm_deadline = deadline.share(share)
    if deadline.expired():  # no schedule, no transition time: the option cannot be weighed or run
        stages.append(StageTime(label, 0.0, 0.0, True, "not started"))
        return RecoveryOption("reconfigure", False, f"stopped early: the deadline passed before the migration of the "
                              f"{scope} plan could be scheduled (raise --time-limit)", solve=result, scope=scope)
    survivors = instance.num_devices - len(failed)
    if assign and deadline.left() < survivors * REMAP_S_PER_DEVICE:  # the re-mapping alone would outlast it
        needed = survivors * REMAP_S_PER_DEVICE
        stages.append(StageTime(label, deadline.left(), time.perf_counter() - started, True,
                                f"not started: re-mapping {survivors:,} devices takes about {needed:.2f} s, "
                                f"{deadline.left():.2f} s left", needed))
        return RecoveryOption("reconfigure", False, f"stopped early: re-mapping and scheduling the migration of "
                              f"{survivors:,} devices takes about {needed:.2f} s and {deadline.left():.2f} s are left "
                              "(raise --time-limit)", solve=result, scope=scope)
    try:  # a large migration that cannot be cut by the deadline: unusable, said so (not a second late)
        assigned, slower = None, True
        if assign:
            # Any re-mapping's migration lists at least this many transfers: declared before the re-mapping
            # and the listing are paid for (1.2-2.4 s at 16,384 devices, 10.6 s at 131,072).
            too_many(*moved_pairs_at_least(model, instance.plan, plan, failed, remapped=True), deadline)
            # The re-mapped plan is priced before any migration is scheduled (one schedule, not two: 0.5 s
            # each at 1,024 devices): it is kept unless it is slower (neighbouring stages pushed apart).
            assigned = assign_slots(model, instance.plan, plan, failed)
            slower = model.evaluate(plan, failed).iteration_time_s < \
                model.evaluate(assigned[0], failed).iteration_time_s
        migration, rounds, comm = communication_plan(instance, instance.plan, plan, failed,
                                                     assign=assign and not slower, model=model,
                                                     deadline=comm_deadline, options=options,
                                                     assigned=None if slower else assigned, abandon=deadline)
    except DeadlinePassed as stopped:
        needed = None if stopped.needed_s is None else time.perf_counter() - started + stopped.needed_s
        stages.append(StageTime(label, max(comm_deadline.end - started, 0.0), time.perf_counter() - started, True,
                                str(stopped), needed))
        return RecoveryOption("reconfigure", False, f"stopped early: {stopped}, so the migration of the {scope} plan "
                              "has no schedule (raise --time-limit)", solve=result, scope=scope)
    estimate = priced if priced is not None and comm.plan is plan else model.evaluate(comm.plan, failed)
    stages.append(StageTime(label, max(comm_deadline.end - started, 0.0), time.perf_counter() - started,
                            comm.stopped_early, f"migration {migration.solve.backend} "
                            f"{migration.solve.status.value}, all-reduce {comm.allreduce.solve.status.value}"))
    change = disruption(model, instance.plan, comm.plan, failed)
    rebuild = GROUP_REBUILD_S * change.rebuilt_share
    transition = found_s + migration.makespan_s + rebuild
    what = f"{scope}: {note}" if note else f"{scope}: {len(comm.plan.pipelines)} pipelines over the survivors"
    why = (f"{what}; transition = {'local search' if scope == 'local' else 'search'} {found_s:.2f} s + migration "
           f"{migration.makespan_s:.2f} s in {migration.rounds} rounds (bound {migration.lower_bound_s:.2f} s) + "
           f"rebuilding {change.groups_rebuilt} of {change.groups_total} process groups {rebuild:.2f} s "
           f"({change.devices_touched} devices change role)")
    return RecoveryOption("reconfigure", True, why, comm.plan, estimate, transition, solve=result,
                          communication=(migration, rounds, comm), scope=scope, rebuild_s=rebuild,
                          devices_touched=change.devices_touched, groups_rebuilt=change.groups_rebuilt,
                          bytes_moved=migration.total_bytes)


def lost_layers(instance: Instance, failed: frozenset[int]) -> list[int]:
    """Layers whose state is gone: every replica sat on a failed device, or, under ZeRO (stage >= 1:
    `shard_replicas` copies of each data-parallel shard, comm/state.py), every copy of some part of
    a shard did."""
    return sorted(set(layers_without_replica(instance, failed)) | set(sharded_layers_lost(instance, failed)))


def layers_without_replica(instance: Instance, failed: frozenset[int]) -> list[int]:
    """Layers whose every replica sat on a failed device."""
    alive = {layer for pipe in instance.plan.pipelines for stage in pipe.stages
             if not failed.intersection(stage.devices) for layer in range(stage.first, stage.end)}
    return [layer for layer in range(instance.workload.num_layers) if layer not in alive]


def sharded_layers_lost(instance: Instance, failed: frozenset[int]) -> list[int]:
    """Layers some part of whose ZeRO-sharded state (stage >= 1: the optimizer state over each
    layer's data-parallel slots, in `shard_replicas` copies) had every copy on failed devices: only
    a checkpoint has it. With one copy: every layer of a failed device's stage."""
    return _shards_lost(instance, failed)[0]


def _shards_lost(instance: Instance, failed: frozenset[int]) -> tuple[list[int], list[int]]:
    """(layers, failed devices that held every copy of part of them) under ZeRO; ([], []) without."""
    training = instance.spec.training
    if training.zero < 1:
        return [], []
    params = instance.workload.params
    return shard_copies_lost(instance.plan, failed, training.shard_replicas,
                             {layer for layer in range(instance.workload.num_layers) if params[layer] > 0})


def with_stale_copies(error: UnrecoverableError, earlier: list[Plan], instance: Instance,
                      failed: frozenset[int]) -> UnrecoverableError:
    """`error`, naming the live devices that held the lost layers in an earlier layout.

    A later plan took them off those layers (a rerouting that gives their pipeline no micro-batch,
    or a reconfiguration), so any copy they kept missed every update since and cannot restore the
    layers. This is why failures reported one by one can be unrecoverable where the same failures
    reported together are not: the first decision already moved those devices off the layers."""
    lost = set(layers_without_replica(instance, failed))  # a lost ZeRO shard had no copy anywhere, stale or not
    held = {d for plan in earlier for pipe in plan.pipelines for stage in pipe.stages for d in stage.devices
            if d not in failed and lost.intersection(range(stage.first, stage.end))}
    if not held:
        return error
    return UnrecoverableError(f"{error}; devices {sorted(held)} held them before a later plan took them off, so "
                              "any copy left there is stale (it missed every update since)")


def decide(instance: Instance, failed: frozenset[int], policy: str = "auto", *, deadline: Deadline,
           options: SolverOptions = DEFAULT, next_fault_s: float | None = None, model: PerfModel | None = None,
           bubble_filling: bool = True, target: str = "any", tp_degrees: tuple[int, ...] = ()) -> Decision:
    """Build the candidates the policy asks for within `deadline`, score them (Eq. 8,
    `score_option`) and pick the best. With a `target` trainer other than `any` the only
    candidate is the reconfiguration that trainer can run (`target_candidate`): neither
    rerouting nor the hybrid is something Megatron-LM or torchtitan can execute. `tp_degrees`: the
    TP degrees a reconfiguration may move to (`reconfigure_candidate`; empty: the job's degree only).

    Raises UnrecoverableError when some layer lost every replica (only a checkpoint has it)."""
    sharded, holders = _shards_lost(instance, failed)
    if sharded:
        training = instance.spec.training
        raise UnrecoverableError(
            f"{shard_copies_phrase(training.zero, training.shard_replicas)}: failed devices {holders} held "
            f"{held_every_copy(training.shard_replicas)} (layers {sharded[0]}-{sharded[-1]}); restart from the last "
            "checkpoint")
    gone = layers_without_replica(instance, failed)
    if gone:
        raise UnrecoverableError(f"layers {gone[0]}-{gone[-1]} ({len(gone)} layers) lost every replica: no surviving "
                                 "copy of their parameters and optimizer state; restart from the last checkpoint")
    refuse_context_parallel(instance)
    check_tp_degrees(instance, tp_degrees)
    model = model or PerfModel(instance)  # another model: what a policy believes (e.g. perturbed)
    survivors = instance.num_devices - len(failed)
    explicit = next_fault_s if next_fault_s is not None else instance.spec.failures.next_fault_s
    mean = explicit if explicit is not None else mean_next_fault_s(instance, survivors)
    candidates: list[RecoveryOption] = []
    stages: list[StageTime] = []
    if target != "any":
        if policy == "reroute":
            raise InputError(None, "--target", f"{target} cannot run a rerouting (peers taking a failed stage's "
                             "work)", "use --policy auto or reconfigure with a target, or --target any")
        batch = instance.spec.training.global_batch
        candidate, searched = target_candidate(
            instance, failed, model, target, deadline=deadline, options=options,
            worth=lambda step, transition: score_option(batch, step, transition, explicit, mean))
        candidates.append(candidate)
        stages += searched
        policy = "reconfigure"
    elif policy in ("auto", "reroute"):
        started = time.perf_counter()
        rerouting = deadline.share(REROUTE_SHARE) if policy == "auto" else deadline
        candidate = reroute_candidate(instance, failed, model, deadline=rerouting, options=options,
                                      bubble_filling=bubble_filling)
        candidates.append(candidate)
        stages.append(_stage("reroute", rerouting, started, candidate.solve))
    if policy in ("auto", "reconfigure") and target == "any":
        batch = instance.spec.training.global_batch
        candidate, searched = reconfigure_candidate(
            instance, failed, model, deadline=deadline, options=options,
            worth=lambda step, transition: score_option(batch, step, transition, explicit, mean),
            tp_degrees=tp_degrees)
        candidates.append(candidate)
        stages += searched
    batch = instance.spec.training.global_batch
    scored = [c if not c.feasible or c.estimate is None else
              dataclasses.replace(c, score=score_option(batch, c.iteration_time_s, c.transition_s, explicit, mean))
              for c in candidates]
    rr = next((c for c in scored if c.policy == "reroute" and c.feasible), None)
    rc = next((c for c in scored if c.policy == "reconfigure" and c.feasible), None)
    if policy == "auto" and rr is not None and rc is not None:
        background = rc.transition_s - rc.pause_s
        score = score_option(batch, rc.iteration_time_s, rc.pause_s, explicit, mean,
                             interim_step_s=rr.iteration_time_s, background_s=background)
        scored.append(dataclasses.replace(rc, policy="hybrid", reason=f"reroute now; switch to the reconfigured "
                                          f"({_named(rc)}) plan after {background:.2f} s of background search and "
                                          f"migration, pausing {rc.pause_s:.2f} s", transition_s=rc.pause_s,
                                          score=score, interim=rr))
    usable = [c for c in scored if c.feasible and c.score > 0]
    if not usable:
        reasons = "; ".join(f"{c.policy}: {c.reason}" if not c.feasible else
                            f"{c.policy}: its transition of {c.transition_s:.3g} s outlasts D = {mean:.3g} s"
                            for c in scored)
        proven = all(c.feasible or c.proven_infeasible for c in scored)
        return Decision("none", f"no usable candidate ({reasons})", None, tuple(scored), mean, tuple(stages), proven)
    best = max(usable, key=lambda c: c.score)
    basis = (f"D = {explicit:.0f} s (Eq. 8)" if explicit is not None else
             f"expected D = {mean:.0f} s from MTBF, exponential (Eq. 8 in expectation)" if mean is not None else
             "no fault statistics: steady-state throughput")
    others = ", ".join(f"{c.policy} {c.score:.3f}" for c in scored if c is not best and c.feasible)
    reason = f"{best.policy} scores {best.score:.3f} samples/s with {basis}" + (f" (vs {others})" if others else "")
    if rr is not None and rc is not None:
        even = break_even_next_fault(rr.iteration_time_s, rc.iteration_time_s, rc.transition_s)
        reason += f"; reconfiguration wins when D > {even:.0f} s"
    return Decision(best.policy, reason, best, tuple(scored), mean, tuple(stages))
