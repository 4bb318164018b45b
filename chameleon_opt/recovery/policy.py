"""Recovery decisions: a rerouting and a reconfiguration candidate, their transition costs, and
the paper's Eq. 8 choice between them for the expected time to the next fault.

Eq. 8: score = (B / t_step) x (D - t_transition) / D; a candidate with D <= t_transition is
unusable. With D unknown but exponential with mean mu (per-device MTBF / survivors), the
expected fraction of the interval spent training is E[max(D - tau, 0)] / E[D] = exp(-tau / mu),
so the score becomes (B / t_step) x exp(-tau / mu): the expectation over D, not a point.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from chameleon_opt.comm import communication_plan
from chameleon_opt.errors import UnrecoverableError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import Estimate, PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.solve.result import SolveResult, Status
from chameleon_opt.solve.reroute import reroute_plan
from chameleon_opt.solve.search import search_plan

GROUP_REBUILD_S = 5.0
"""Re-forming the process groups of the new plan (NCCL communicator creation at scale takes
seconds); paid by reconfiguration, not by rerouting, which keeps its groups minus the dead."""


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


@dataclass(frozen=True)
class Candidate:
    policy: str
    feasible: bool
    reason: str
    plan: Plan | None = None
    estimate: Estimate | None = None
    transition_s: float = 0.0
    score: float = 0.0
    solve: SolveResult[Plan] | None = None
    interim: "Candidate | None" = None  # hybrid: the rerouted plan run until the switch
    communication: tuple | None = None   # (Migration, allreduce rounds, CommInfo) when scheduled

    @property
    def iteration_time_s(self) -> float:
        return self.estimate.iteration_time_s if self.estimate else math.inf

    def to_json(self) -> dict[str, object]:
        return {"policy": self.policy, "feasible": self.feasible, "reason": self.reason,
                "iteration_time_s": None if self.estimate is None else self.iteration_time_s,
                "transition_time_s": self.transition_s, "score": self.score}


@dataclass(frozen=True)
class Decision:
    policy: str
    reason: str
    chosen: Candidate | None
    candidates: tuple[Candidate, ...]
    next_fault_s: float | None


def reroute_candidate(instance: Instance, failed: frozenset[int], model: PerfModel, time_limit_s: float = 5.0,
                      threads: int = 1, seed: int = 0) -> Candidate:
    """Keep the layout, give the failed stages' work to their peers in decided shares (transition ~ 0)."""
    result = reroute_plan(instance, failed, time_limit_s, threads, seed, model)
    if not result.status.has_solution or result.solution is None:
        return Candidate("reroute", False, result.reason or result.status.value, solve=result)
    estimate = model.evaluate(result.solution, failed)
    return Candidate("reroute", True, f"layout kept; {result.reason}", result.solution, estimate, 0.0, solve=result)


def reconfigure_candidate(instance: Instance, failed: frozenset[int], model: PerfModel, time_limit_s: float,
                          threads: int, seed: int) -> Candidate:
    """Re-plan over the survivors; transition = search time + the scheduled state migration
    + group rebuild. The plan's TP groups are re-mapped onto slots so that the state to move is
    least, unless that makes the step slower (neighbouring stages pushed onto different nodes)."""
    start = time.perf_counter()
    result = search_plan(instance, failed, time_limit_s, threads, seed, model)
    search_s = time.perf_counter() - start
    if not result.status.has_solution or result.solution is None:
        return Candidate("reconfigure", False, result.reason or result.status.value, solve=result)
    comm_limit = max(time_limit_s / 2, 1.0)
    migration, rounds, comm = communication_plan(instance, instance.plan, result.solution, failed,
                                                 time_limit_s=comm_limit, threads=threads, seed=seed, model=model)
    estimate = model.evaluate(comm.plan, failed)
    searched = model.evaluate(result.solution, failed)
    if searched.iteration_time_s < estimate.iteration_time_s:  # re-mapping split neighbouring stages across nodes
        migration, rounds, comm = communication_plan(instance, instance.plan, result.solution, failed,
                                                     time_limit_s=comm_limit, assign=False, threads=threads,
                                                     seed=seed, model=model)
        estimate = searched
    transition = search_s + migration.makespan_s + GROUP_REBUILD_S
    why = (f"{len(comm.plan.pipelines)} pipelines over the survivors; transition = search {search_s:.2f} s "
           f"+ migration {migration.makespan_s:.2f} s in {migration.rounds} rounds (bound "
           f"{migration.lower_bound_s:.2f} s) + group rebuild {GROUP_REBUILD_S:.0f} s")
    return Candidate("reconfigure", True, why, comm.plan, estimate, transition, solve=result,
                     communication=(migration, rounds, comm))


def lost_layers(instance: Instance, failed: frozenset[int]) -> list[int]:
    """Layers whose every replica sat on a failed device: their state is gone."""
    alive = {layer for pipe in instance.plan.pipelines for stage in pipe.stages
             if not failed.intersection(stage.devices) for layer in range(stage.first, stage.end)}
    return [layer for layer in range(instance.workload.num_layers) if layer not in alive]


def with_stale_copies(error: UnrecoverableError, earlier: list[Plan], instance: Instance,
                      failed: frozenset[int]) -> UnrecoverableError:
    """`error`, naming the live devices that held the lost layers in an earlier layout.

    A later plan took them off those layers (a rerouting that gives their pipeline no micro-batch,
    or a reconfiguration), so any copy they kept missed every update since and cannot restore the
    layers. This is why failures reported one by one can be unrecoverable where the same failures
    reported together are not: the first decision already moved those devices off the layers."""
    lost = set(lost_layers(instance, failed))
    held = {d for plan in earlier for pipe in plan.pipelines for stage in pipe.stages for d in stage.devices
            if d not in failed and lost.intersection(range(stage.first, stage.end))}
    if not held:
        return error
    return UnrecoverableError(f"{error}; devices {sorted(held)} held them before a later plan took them off, so "
                              "any copy left there is stale (it missed every update since)")


def decide(instance: Instance, failed: frozenset[int], policy: str = "auto", time_limit_s: float = 10.0,
           threads: int = 1, seed: int = 0, next_fault_s: float | None = None) -> Decision:
    """Build the candidates the policy asks for, score them (Eq. 8) and pick the best.

    Raises UnrecoverableError when some layer lost every replica (only a checkpoint has it)."""
    gone = lost_layers(instance, failed)
    if gone:
        raise UnrecoverableError(f"layers {gone[0]}-{gone[-1]} ({len(gone)} layers) lost every replica: no surviving "
                                 "copy of their parameters and optimizer state; restart from the last checkpoint")
    model = PerfModel(instance)
    survivors = instance.num_devices - len(failed)
    explicit = next_fault_s if next_fault_s is not None else instance.spec.failures.next_fault_s
    mean = explicit if explicit is not None else mean_next_fault_s(instance, survivors)
    candidates = []
    if policy in ("auto", "reroute"):
        candidates.append(reroute_candidate(instance, failed, model, time_limit_s, threads, seed))
    if policy in ("auto", "reconfigure"):
        candidates.append(reconfigure_candidate(instance, failed, model, time_limit_s, threads, seed))
    batch = instance.spec.training.global_batch
    scored = []
    for c in candidates:
        if not c.feasible or c.estimate is None:
            scored.append(c)
            continue
        if explicit is not None:
            score = eq8_score(batch, c.iteration_time_s, c.transition_s, explicit)
        elif mean is not None:
            score = expected_score(batch, c.iteration_time_s, c.transition_s, mean)
        else:
            score = batch / c.iteration_time_s  # no fault statistics: steady-state throughput
        scored.append(dataclasses.replace(c, score=score))
    rr = next((c for c in scored if c.policy == "reroute" and c.feasible), None)
    rc = next((c for c in scored if c.policy == "reconfigure" and c.feasible), None)
    if policy == "auto" and rr is not None and rc is not None:
        background = rc.transition_s - GROUP_REBUILD_S
        score = hybrid_samples_per_s(batch, rr.iteration_time_s, rc.iteration_time_s, background, GROUP_REBUILD_S,
                                     explicit, mean)
        scored.append(Candidate("hybrid", True, f"reroute now; switch to the reconfigured plan after "
                                f"{background:.2f} s of background search and migration, pausing "
                                f"{GROUP_REBUILD_S:.0f} s", rc.plan, rc.estimate, GROUP_REBUILD_S, score, rc.solve,
                                interim=rr, communication=rc.communication))
    usable = [c for c in scored if c.feasible and c.score > 0]
    if not usable:
        reasons = "; ".join(f"{c.policy}: {c.reason}" if not c.feasible else
                            f"{c.policy}: its transition of {c.transition_s:.1f} s outlasts D = {mean:.1f} s"
                            for c in scored)
        return Decision("none", f"no usable candidate ({reasons})", None, tuple(scored), mean)
    best = max(usable, key=lambda c: c.score)
    basis = (f"D = {explicit:.0f} s (Eq. 8)" if explicit is not None else
             f"expected D = {mean:.0f} s from MTBF, exponential (Eq. 8 in expectation)" if mean is not None else
             "no fault statistics: steady-state throughput")
    others = ", ".join(f"{c.policy} {c.score:.3f}" for c in scored if c is not best and c.feasible)
    reason = f"{best.policy} scores {best.score:.3f} samples/s with {basis}" + (f" (vs {others})" if others else "")
    if rr is not None and rc is not None:
        even = break_even_next_fault(rr.iteration_time_s, rc.iteration_time_s, rc.transition_s)
        reason += f"; reconfiguration wins when D > {even:.0f} s"
    return Decision(best.policy, reason, best, tuple(scored), mean)
