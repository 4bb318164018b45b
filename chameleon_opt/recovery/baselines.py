"""Recovery policies as objects, all on the one performance model, for the failure-trace simulator.

A policy sees a `PolicyState` (the instance whose `plan` is the layout running now, the devices
down now, what just happened) and answers a `Response`: the plan to run, its step time, the time
with no training before it runs (`transition_s`) and, for the hybrid, a phase of training at an
interim step while the reconfiguration proceeds in the background (`interim_s`). Responses are
cached per (layout, dead devices, event): plan search can take seconds, and traces revisit states.

Policies and what they charge (all transitions are time with no training):

- `EvenRerouteAblation` (ReCycle's rerouting without its bubble filling; the baseline is
  recovery/recycle.py): even rerouting (`even_reroute`, Eq. 12/13); transition 0 (the in-flight
  iteration is finished by the peers; at most a partial iteration would be lost, not counted).
  When a stage lost every replica, or the rerouted work overflows a peer's memory, it falls back
  to checkpoint-restart (`fallback=True` in the response).
- `TemplatesAblation` (our card-level reconfiguration with Oobleck's templates; the baseline is
  recovery/oobleck.py): pipeline templates (`build_templates`: best layer split per stage count,
  a DP/bisection over layers) precomputed once for 1..k TP groups; on every change it
  instantiates templates over all surviving TP groups (an exact-fill knapsack over template
  sizes, plus each single size with the remainder lengthening some pipelines), splits the
  micro-batches across the heterogeneous pipelines in proportion to their throughput and keeps the
  fastest by the performance model. Transition = `migration_lower_bound_s` + `GROUP_REBUILD_S`;
  no search time (its planning is precomputed).
- `RedundancyAblation` (a redundancy model on ours; the baseline is recovery/bamboo.py):
  redundant computation. Stage s of every pipeline also runs the forward of
  its successor's layers (the last stage covers stage 0), so each stage's forward op is longer by
  `redundancy` x the successor's forward time, with or without failures. Default 1.0, i.e. the
  whole successor forward is exposed: with backward = 2 x forward that is about a third more
  compute (a quarter with recomputation), above the ~10-20% Bamboo reports, because Bamboo hides
  part of it in pipeline bubbles; `redundancy=0.5` lands in the reported range. On a failure the
  predecessor (which holds the layers and state) takes over at once (`takeover_s`, 2 s: detect
  and re-link the pipeline); it then does two stages' work, and its gradient all-reduce takes
  twice as long (it reduces both stages' buckets). When a stage and its predecessor are both down
  the replica is lost: Bamboo re-plans (search over the survivors, state from the DP replicas,
  migration bound + group rebuild; search not charged). Memory of the redundant layers is not
  enforced (Bamboo keeps them, partly in host memory).
- `Chameleon` (ours): `decide(..., policy="auto")`: rerouting with decided shares, the searched
  reconfiguration and the hybrid of the two, scored by Eq. 8 in expectation over an exponential
  D with mean MTBF / survivors; the plan search time is counted in the transition (measured, or
  a fixed `search_charge_s` for reproducible runs, with the choice re-scored accordingly). Two
  guards (on by default, see `_ChameleonFamily`) replace a candidate by a faster one built from
  the same pieces; "chameleon-unguarded" takes decide's candidates exactly as built.
- `ChameleonPaper`: the paper's rule: even rerouting vs. reconfiguration by the paper's
  Algorithm 1 enumeration (`enumerate_plans`, `search_plan` when it is absent), Eq. 8 with a
  point D (the mean), no hybrid. Transition = enumeration time + migration bound + rebuild.
- `Hybrid`: reroute now, reconfigure in the background (search + migration overlap training),
  pause `GROUP_REBUILD_S` to switch; it stays rerouted when the reconfigured step is not faster.
- `RerouteOnly` / `ReconfigureOnly`: the two pure candidates of `decide` (for the hybrid's
  dominance check).
- `CheckpointRestart`: on a failure, lose the work since the last checkpoint (expected half an
  interval, `checkpoint_interval_s` = 30 min, counted as dead time: that work is redone) plus a
  restart (`restart_s` = 10 min: rescheduling, container start, loading the checkpoint), then
  train on the survivors with a fresh plan (`search_plan`, inside the restart time).

Repairs. Chameleon (the adaptive policy, told or blind) decides them as `rejoin.plan_join` does,
on the same candidates (`rejoin.join_candidates`, cached in the `DecisionSource`): keep running
with the repaired devices idle (`Response.idle`: they stay down for later decisions until the
next repair offers them again), take back their rerouted slots (state copied by the scheduled
migration, + group rebuild) or scale up over every live device (search charged as for a
failure + scheduled migration + group rebuild); Eq. 8 under its fault statistics. The others
(kept simple): a repaired device that sits in the running layout rejoins its own slot (its
stage's state is copied from a replica: migration bound + group rebuild); a repaired device
outside the layout joins the idle pool, which Oobleck and ReconfigureOnly always re-plan over,
ChameleonPaper re-plans over when Eq. 8 says so, the Hybrid re-plans over in the background when
that is faster, and ReCycle, Bamboo, RerouteOnly and CheckpointRestart leave idle
(CheckpointRestart's next restart, after a failure, uses them: no restart for a repair).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from chameleon_opt.check import PlanRejected
from chameleon_opt.errors import InfeasibleError, UnrecoverableError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.pipeline import one_f_one_b_time
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.plan import Plan
from chameleon_opt.planning import PlanningOptions
from chameleon_opt.recovery.policy import (GROUP_REBUILD_S, Candidate, RecoveryOption, break_even_next_fault, decide,
                                           eq8_score, expected_score, hybrid_samples_per_s, lost_layers,
                                           mean_next_fault_s, migration_lower_bound_s, reroute_candidate)
from chameleon_opt.rejoin import join_candidates
from chameleon_opt.solve.backends import SolverOptions
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.search import Mix, lower, search_plan
from chameleon_opt.solve.templates import Template, build_templates

CHECKPOINT_INTERVAL_S = 1800.0
RESTART_S = 600.0
BAMBOO_TAKEOVER_S = 2.0
SEARCH_TIME_LIMIT_S = 2.0
"""Default plan-search limit inside the simulator (the CLI's default is 10 s; the searches here
run once per failure, and the measured time is charged as transition)."""


# -- the interface ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyState:
    """What a policy sees when it must respond.

    `instance.plan` is the layout running now (rerouting not included: the policy re-derives it
    from `dead`); `instance.failed_devices` equals `dead`. `changed` are the devices that just
    failed (`kind == "fail"`) or came back (`"repair"`); `"start"` asks for the failure-free plan."""

    instance: Instance
    dead: frozenset[int]
    kind: str = "start"
    changed: frozenset[int] = frozenset()
    time_s: float = 0.0

    @property
    def layout(self) -> Plan:
        return self.instance.plan

    @property
    def previous_dead(self) -> frozenset[int]:
        """The dead set before this event (repaired devices count as holding no state)."""
        if self.kind == "fail":
            return self.dead - self.changed
        if self.kind == "repair":
            return self.dead | self.changed
        return self.dead


@dataclass(frozen=True)
class Response:
    """What a policy does: after `interim_s` at `interim_step_s` (hybrid only) and then
    `transition_s` with no training, it runs `plan` at `step_s` per iteration.

    `plan` None (or `step_s` inf) means it cannot train until something changes. `layout` is
    the layout the next decision starts from (default: `plan` without its rerouting)."""

    plan: Plan | None
    step_s: float
    transition_s: float
    notes: str
    action: str = "stay"  # start | stay | reroute | reconfigure | hybrid | takeover | rejoin | restart
    layout: Plan | None = None
    interim_step_s: float | None = None
    interim_s: float = 0.0
    fallback: bool = False
    search_s: float = 0.0  # the part of the transition (or of the interim) spent searching
    idle: frozenset[int] = frozenset()  # repaired devices left out (keep-running): still down for decisions

    @property
    def next_layout(self) -> Plan | None:
        if self.layout is not None:
            return self.layout
        return None if self.plan is None else dataclasses.replace(self.plan, rerouted=())

    def rate(self, global_batch: int) -> float:
        """Samples/s once the transition is over."""
        return global_batch / self.step_s if self.plan is not None and 0 < self.step_s < math.inf else 0.0


_STRUCTURE: dict[int, tuple[object, str]] = {}


def structure_key(instance: Instance) -> str:
    """The instance without its failure section (cluster, workload, training): what plans,
    step times and searches depend on. Fault statistics only change how candidates are scored."""
    spec = instance.spec
    found = _STRUCTURE.get(id(spec))
    if found is None or found[0] is not spec:
        found = (spec, spec.model_dump_json(exclude={"failures", "plan", "name", "description"}))
        _STRUCTURE[id(spec)] = found
    return found[1]


_SEARCHES: dict[tuple, tuple[object, float]] = {}


def cached_search(instance: Instance, dead: frozenset[int], time_limit_s: float, model: PerfModel,
                  how: str = "search") -> tuple[object, float]:
    """(SolveResult, measured seconds) of `search_plan` (how='search') or the paper's
    `enumerate_plans` (how='enumerate'), memoised per (structure, layout, dead, limit): a trace
    revisits states and several policies search the same one. The measured time is the first run's."""
    key = (structure_key(instance), instance.plan, dead, time_limit_s, how)
    if key not in _SEARCHES:
        start = time.perf_counter()
        if how == "enumerate":
            from chameleon_opt.solve.enumerator import enumerate_plans  # lazily: may be absent
            result = enumerate_plans(instance, dead, time_limit_s=time_limit_s, model=model)
        else:
            result = search_plan(instance, dead, time_limit_s, 1, 0, model)
        _SEARCHES[key] = (result, time.perf_counter() - start)
    return _SEARCHES[key]


def at_state(instance: Instance, layout: Plan, dead: frozenset[int]) -> Instance:
    """The instance with `layout` as its running plan and `dead` as its failed devices."""
    return dataclasses.replace(instance, plan=layout, failed_devices=frozenset(dead))


class Policy:
    """Base class: `respond` caches `_respond` per (instance, layout, dead, event)."""

    name = "policy"

    def __init__(self) -> None:
        self._cache: dict[tuple, Response] = {}
        self._pinned: dict[int, object] = {}  # keeps cached specs alive so their ids stay unique
        self._models: dict[str, PerfModel] = {}

    def respond(self, state: PolicyState) -> Response:
        spec = state.instance.spec
        self._pinned[id(spec)] = spec
        key = (id(spec), state.layout, state.dead, state.kind, state.changed)  # fault statistics included
        if key not in self._cache:
            self._cache[key] = self._respond(state)
        return self._cache[key]

    def _respond(self, state: PolicyState) -> Response:
        raise NotImplementedError

    def model(self, instance: Instance) -> PerfModel:
        """One performance model per instance structure (its tables depend on neither the plan nor
        the fault statistics)."""
        key = structure_key(instance)
        if key not in self._models:
            self._models[key] = PerfModel(instance)
        return self._models[key]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # -- shared pieces ------------------------------------------------------------------------
    def start(self, state: PolicyState) -> Response:
        model = self.model(state.instance)
        estimate = model.evaluate(state.layout, state.dead)
        return Response(state.layout, estimate.iteration_time_s, 0.0, "failure-free plan", "start")

    def rejoin_cost_s(self, state: PolicyState, new_layout: Plan) -> float:
        """Copy the state repaired devices need for their slots + rebuild the groups."""
        model = self.model(state.instance)
        return migration_lower_bound_s(model, state.layout, new_layout, state.previous_dead) + GROUP_REBUILD_S


def restart_response(policy: Policy, state: PolicyState, why: str, restart_s: float = RESTART_S,
                     lost_s: float = CHECKPOINT_INTERVAL_S / 2, time_limit_s: float = SEARCH_TIME_LIMIT_S,
                     fallback: bool = True) -> Response:
    """Checkpoint-restart on the live devices with a fresh plan: `restart_s` + the lost work."""
    instance = at_state(state.instance, state.layout, state.dead)
    model = policy.model(instance)
    result, _ = cached_search(instance, state.dead, time_limit_s, model)
    if result.solution is None:
        return Response(None, math.inf, restart_s + lost_s, f"{why}; checkpoint-restart finds no plan on the "
                        f"survivors ({result.reason})", "restart", layout=state.layout, fallback=fallback)
    step = model.evaluate(result.solution, state.dead).iteration_time_s
    notes = (f"{why}; checkpoint-restart: {restart_s:.0f} s restart + {lost_s:.0f} s of lost work redone, "
             f"fresh plan of {len(result.solution.pipelines)} pipelines on {instance.num_devices - len(state.dead)} "
             "live devices")
    return Response(result.solution, step, restart_s + lost_s, notes, "restart", fallback=fallback)


def _devices(plan: Plan) -> set[int]:
    return set(plan.devices)


# -- ReCycle ----------------------------------------------------------------------------------------
class EvenRerouteAblation(Policy):
    """Ablation (not ReCycle: see recovery/recycle.py): always reroute with the even fractional split
    of Eq. 12/13, serial after the peers' own work; checkpoint-restart when that is impossible."""

    name = "even-reroute-ablation"

    def __init__(self, restart_s: float = RESTART_S, checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
                 time_limit_s: float = SEARCH_TIME_LIMIT_S) -> None:
        super().__init__()
        self.restart_s, self.interval_s, self.time_limit_s = restart_s, checkpoint_interval_s, time_limit_s

    def rerouted(self, state: PolicyState) -> tuple[Plan, float]:
        """Raises InfeasibleError when a stage lost every replica or a peer runs out of memory."""
        model = self.model(state.instance)
        plan = even_reroute(state.layout, state.dead)
        estimate = model.evaluate(plan, state.dead)
        if not estimate.memory_ok:
            raise InfeasibleError("rerouted work overflows a peer's memory: "
                                  + "; ".join(estimate.memory_violations()[:2]))
        return plan, estimate.iteration_time_s

    def _respond(self, state: PolicyState) -> Response:
        if state.kind == "start":
            return self.start(state)
        if state.kind == "repair" and not state.changed & _devices(state.layout):
            plan, step = self.rerouted(state)  # idle devices came back: ReCycle leaves them idle
            return Response(plan, step, 0.0, "repaired devices outside the layout stay idle", "stay")
        try:
            plan, step = self.rerouted(state)
        except InfeasibleError as error:
            return restart_response(self, state, f"ReCycle cannot reroute ({error.reason})", self.restart_s,
                                    self.interval_s / 2, self.time_limit_s)
        if state.kind == "repair":
            return Response(plan, step, self.rejoin_cost_s(state, state.layout),
                            "repaired devices rejoin their slots (state copied from a replica)", "rejoin")
        shares = len(plan.rerouted)
        return Response(plan, step, 0.0, f"even split of the failed slots' micro-batches over {shares} peer shares "
                        "(transition 0: no partial iteration counted)", "reroute")


# -- Oobleck ----------------------------------------------------------------------------------------
class TemplatesAblation(Policy):
    """Ablation (not Oobleck: see recovery/oobleck.py): our card-level templates, instantiated over all
    surviving TP groups on every change, with no search time charged."""

    name = "templates-ablation"
    EXACT_CANDIDATES = 4

    def __init__(self) -> None:
        super().__init__()
        self._templates: dict[str, list[Template]] = {}

    def templates(self, instance: Instance) -> list[Template]:
        """Templates for 1..k TP groups on the full cluster (device type of the first group): built
        once, before training, as Oobleck does."""
        key = structure_key(instance)
        if key not in self._templates:
            model = self.model(instance)
            groups = survivor_groups(instance, frozenset(), instance.plan.tensor_parallel)
            kind = model.stage_device(groups[0]).name
            same = [g for g in groups if model.stage_device(g).name == kind]
            self._templates[key] = [t for t in build_templates(model, same) if t.max_level is None]
        return self._templates[key]

    @staticmethod
    def proportional_shares(rates: list[float], total: int) -> list[int] | None:
        """Micro-batches in proportion to throughput, largest remainder, at least one each."""
        if len(rates) > total:
            return None
        whole = sum(rates)
        raw = [total * r / whole for r in rates]
        shares = [max(int(math.floor(x)), 1) for x in raw]
        order = sorted(range(len(rates)), key=lambda j: raw[j] - math.floor(raw[j]), reverse=True)
        i = 0
        while sum(shares) < total:
            shares[order[i % len(order)]] += 1
            i += 1
        while sum(shares) > total:
            j = max((j for j in range(len(shares)) if shares[j] > 1), key=lambda j: shares[j] - raw[j])
            shares[j] -= 1
        return shares

    def instantiations(self, templates: list[Template], groups: int, total: int) -> list[dict[int, int]]:
        """Pipelines per template index that use the groups: the exact-fill knapsack maximising
        summed throughput, and each single size with the remainder lengthening pipelines."""
        by_size = {t.stages: k for k, t in enumerate(templates)}
        sizes = sorted(by_size)
        found: list[dict[int, int]] = []
        best = [-math.inf] * (groups + 1)
        choice = [-1] * (groups + 1)
        best[0] = 0.0
        for g in range(1, groups + 1):
            for s in sizes:
                if s <= g and best[g - s] > -math.inf:
                    value = best[g - s] + 1.0 / templates[by_size[s]].per_micro_batch_s
                    if value > best[g] + 1e-15:
                        best[g], choice[g] = value, s
        fill = max((g for g in range(groups + 1) if best[g] > -math.inf and g > 0), default=0)
        counts: dict[int, int] = {}
        g = fill
        while g > 0:
            s = choice[g]
            counts[by_size[s]] = counts.get(by_size[s], 0) + 1
            g -= s
        if counts:
            found.append(counts)
        for s in sizes:
            n, r = divmod(groups, s)
            if n == 0:
                continue
            if r and s + 1 in by_size and r <= n:
                found.append({by_size[s]: n - r, by_size[s + 1]: r})
            else:
                found.append({by_size[s]: n})
        unique = []
        for counts in found:
            counts = {k: c for k, c in counts.items() if c}
            if counts and counts not in unique and sum(counts.values()) <= total and all(
                    sum(counts.values()) >= templates[k].min_pipelines for k in counts):
                unique.append(counts)
        return unique

    def instantiate(self, instance: Instance, dead: frozenset[int]) -> tuple[Plan, float] | None:
        model = self.model(instance)
        templates = self.templates(instance)
        groups = survivor_groups(instance, dead, instance.plan.tensor_parallel)
        if not templates:
            return None
        kind = templates[0].device_type
        pool = [g for g in groups if model.stage_device(g).name == kind]
        total = instance.global_micro_batches
        ranked = []
        for counts in self.instantiations(templates, len(pool), total):
            chosen = [k for k in sorted(counts) for _ in range(counts[k])]
            shares = self.proportional_shares([1.0 / templates[k].per_micro_batch_s for k in chosen], total)
            if shares is None:
                continue
            per: dict[int, list[int]] = {}
            for k, m in zip(chosen, shares):
                per.setdefault(k, []).append(m)
            mix = Mix(tuple(len(per.get(k, ())) for k in range(len(templates))),
                      tuple(tuple(per.get(k, ())) for k in range(len(templates))))
            surrogate = max(templates[k].pipeline_time(m) for k, m in zip(chosen, shares)) + max(
                templates[k].sync_s for k in chosen)
            ranked.append((surrogate, mix))
        ranked.sort(key=lambda item: item[0])
        best: tuple[Plan, float] | None = None
        for _, mix in ranked[:self.EXACT_CANDIDATES]:
            plan = lower(templates, mix, {kind: pool}, instance.plan.tensor_parallel)
            estimate = model.evaluate(plan, dead)
            if estimate.memory_ok and (best is None or estimate.iteration_time_s < best[1]):
                best = (plan, estimate.iteration_time_s)
        return best

    def _respond(self, state: PolicyState) -> Response:
        if state.kind == "start":
            return self.start(state)
        if lost_layers(state.instance, state.dead) and state.kind == "fail":
            return restart_response(self, state, "some layer lost every replica")
        found = self.instantiate(state.instance, state.dead)
        if found is None:
            return Response(None, math.inf, 0.0, "no template instantiation fits the survivors", "reconfigure",
                            layout=state.layout)
        plan, step = found
        model = self.model(state.instance)
        migration = migration_lower_bound_s(model, state.layout, plan, state.previous_dead if state.kind == "repair"
                                            else state.dead)
        sizes = sorted({len(p.stages) for p in plan.pipelines})
        return Response(plan, step, migration + GROUP_REBUILD_S,
                        f"templates instantiated: {len(plan.pipelines)} pipelines of {sizes} stages, batch split by "
                        f"throughput; migration bound {migration:.2f} s + rebuild {GROUP_REBUILD_S:.0f} s, "
                        "planning precomputed", "reconfigure")


# -- Bamboo -----------------------------------------------------------------------------------------
class RedundancyAblation(Policy):
    """Ablation (not Bamboo: see recovery/bamboo.py): each stage also runs its successor's forward on
    our model; a failed stage's predecessor takes over almost at once."""

    name = "redundancy-ablation"

    def __init__(self, redundancy: float = 1.0, takeover_s: float = BAMBOO_TAKEOVER_S,
                 time_limit_s: float = SEARCH_TIME_LIMIT_S) -> None:
        super().__init__()
        self.redundancy, self.takeover_s, self.time_limit_s = redundancy, takeover_s, time_limit_s

    def step(self, instance: Instance, layout: Plan, dead: frozenset[int]) -> float | None:
        """Step time with redundancy and takeovers; None when some slot and its predecessor
        (its replica holder) are both down."""
        model = self.model(instance)
        failed = model.failed_slots(layout, dead)
        takeover = False
        slowest = 0.0
        optimizer = 0.0
        schedules: dict[tuple, float] = {}  # identical pipelines are the common case
        for j, pipe in enumerate(layout.pipelines):
            costs = model.stage_costs(layout, j, [0.0] * len(pipe.stages))
            n = len(pipe.stages)
            live = [s for s in range(n) if (j, s) not in failed]
            if not live:
                return None  # the whole pipeline is gone: its micro-batches have nowhere to run
            owned: dict[int, list[int]] = {s: [s] for s in live}
            for s in range(n):
                if (j, s) in failed:
                    holder = (s - 1) % n
                    if (j, holder) in failed or n == 1:
                        return None  # the replica holder is down too
                    owned[holder].append(s)
                    takeover = True
            forward, backward = [], []
            for s in live:
                stages = owned[s]
                f = sum(costs[x].op_forward_s for x in stages)
                b = sum(costs[x].op_backward_s for x in stages)
                successor = (stages[-1] + 1) % n  # redundant forward of the next stage it does not own
                if successor not in stages:
                    f += self.redundancy * costs[successor].forward_s
                forward.append(f)
                backward.append(b)
                optimizer = max(optimizer, sum(model.optimizer_time(pipe.stages[x].devices, pipe.stages[x].first,
                                                                    pipe.stages[x].end) for x in stages))
            key = (tuple(forward), tuple(backward), pipe.micro_batches)
            if key not in schedules:
                schedules[key] = one_f_one_b_time(forward, backward, pipe.micro_batches)
            slowest = max(slowest, schedules[key])
        data_parallel = model.data_parallel_time(layout) * (2.0 if takeover else 1.0)
        return slowest + data_parallel + optimizer

    def _respond(self, state: PolicyState) -> Response:
        instance, layout = state.instance, state.layout
        if state.kind == "start":
            step = self.step(instance, layout, state.dead)
            plain = self.model(instance).evaluate(layout, state.dead).iteration_time_s
            return Response(layout, step if step is not None else math.inf, 0.0,
                            f"redundant forward of each successor stage (factor {self.redundancy:g}): "
                            f"{100 * ((step or math.inf) / plain - 1):.1f}% over failure-free", "start")
        step = self.step(instance, layout, state.dead)
        if step is not None:
            if state.kind == "repair":
                if not state.changed & _devices(layout):
                    return Response(layout, step, 0.0, "repaired devices outside the layout stay idle", "stay")
                return Response(layout, step, self.rejoin_cost_s(state, layout),
                                "repaired devices take their stages back (state copied)", "rejoin")
            return Response(layout, step, self.takeover_s, "predecessor takes over the failed stage (two stages' "
                            "work, doubled gradient reduction)", "takeover")
        if lost_layers(instance, state.dead):
            return restart_response(self, state, "some layer lost every replica")
        model = self.model(instance)
        result, _ = cached_search(instance, state.dead, self.time_limit_s, model)
        if result.solution is None:
            return restart_response(self, state, f"Bamboo cannot re-plan ({result.reason})")
        new = result.solution
        step = self.step(instance, new, state.dead)
        if step is None:
            return restart_response(self, state, "Bamboo's re-plan cannot hold redundancy")
        migration = migration_lower_bound_s(model, layout, new, state.previous_dead)
        return Response(new, step, migration + GROUP_REBUILD_S,
                        f"a stage and its replica holder are both down: re-plan over the survivors from DP replicas "
                        f"(migration bound {migration:.2f} s + rebuild {GROUP_REBUILD_S:.0f} s)", "reconfigure",
                        fallback=True)


# -- Eq. 8 selection ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """One way to respond, as Eq. 8 sees it. A hybrid trains at `interim_step_s` for
    `background_s`, then pauses `transition_s`, then runs at `step_s`."""

    name: str
    step_s: float
    transition_s: float
    background_s: float = 0.0
    interim_step_s: float | None = None


def option_score(option: Option, global_batch: int, next_fault_s: float | None = None,
                 mean_next_fault: float | None = None) -> float:
    """Eq. 8 (point D), its expectation over an exponential D, or the hybrid's rate; steady
    throughput when neither D nor its mean is known."""
    if option.interim_step_s is not None:
        return hybrid_samples_per_s(global_batch, option.interim_step_s, option.step_s, option.background_s,
                                    option.transition_s, next_fault_s, mean_next_fault)
    if next_fault_s is not None:
        return eq8_score(global_batch, option.step_s, option.transition_s, next_fault_s)
    if mean_next_fault is not None:
        return expected_score(global_batch, option.step_s, option.transition_s, mean_next_fault)
    return global_batch / option.step_s if option.step_s > 0 else 0.0


def select(options: list[Option], global_batch: int, next_fault_s: float | None = None,
           mean_next_fault: float | None = None) -> tuple[Option | None, dict[str, float]]:
    """The highest-scoring option (the first on ties) and every option's score; None when no
    option scores above 0 (each transition outlasts D)."""
    scores = {o.name: option_score(o, global_batch, next_fault_s, mean_next_fault) for o in options}
    usable = [o for o in options if scores[o.name] > 0]
    return (max(usable, key=lambda o: scores[o.name]) if usable else None), scores


# -- the candidates of `decide`, shared by the Chameleon family -------------------------------------
@dataclass
class DecisionSource:
    """`decide(policy="auto")` per (instance, layout, dead), cached and shared by the policies built
    on its candidates (Chameleon, Hybrid, RerouteOnly, ReconfigureOnly)."""

    time_limit_s: float = SEARCH_TIME_LIMIT_S
    threads: int = 1
    seed: int = 0
    cache: dict = field(default_factory=dict)
    join_cache: dict = field(default_factory=dict)
    calls: int = 0
    rejected: list = field(default_factory=list)
    believed: Callable[[Instance], PerfModel] | None = None  # the model decisions use (default: the true one)

    @staticmethod
    def even_candidate(instance: Instance, dead: frozenset[int], model: PerfModel | None = None,
                       why: str = "even split (Eq. 12/13)") -> Candidate | None:
        """The paper's even split as a rerouting candidate; None when impossible or over memory."""
        try:
            plan = even_reroute(instance.plan, dead)
        except InfeasibleError:
            return None
        estimate = (model or PerfModel(instance)).evaluate(plan, dead)
        if not estimate.memory_ok:
            return None
        return Candidate("reroute", True, why, plan, estimate, 0.0)

    def candidates(self, instance: Instance, dead: frozenset[int]) -> tuple[Candidate | None, Candidate | None, str]:
        """(rerouting, reconfiguration, decide's own choice). Raises UnrecoverableError.

        Cached per instance structure (not its fault statistics, which only change the scores):
        decide's own choice is the one under the statistics of the first instance that asked."""
        key = (structure_key(instance), instance.plan, dead)
        if key not in self.cache:
            self.calls += 1
            try:
                decision = decide(instance, dead, "auto", self.time_limit_s, self.threads, self.seed,
                                  model=self.believed(instance) if self.believed else None)
            except UnrecoverableError as error:
                self.cache[key] = error
            except PlanRejected as error:
                # The rerouting MILP returned a plan the checker rejects (a bug outside this module,
                # reported): take the reconfiguration alone and the even split when it fits.
                self.rejected.append(str(error))
                decision = decide(instance, dead, "reconfigure", self.time_limit_s, self.threads, self.seed)
                rc = next((c for c in decision.candidates if c.policy == "reconfigure" and c.feasible), None)
                self.cache[key] = (self.even_candidate(instance, dead, why="even split (the rerouting MILP's "
                                                       "plan was rejected by the checker)"), rc, decision.policy)
            else:
                rr = next((c for c in decision.candidates if c.policy == "reroute" and c.feasible), None)
                rc = next((c for c in decision.candidates if c.policy == "reconfigure" and c.feasible), None)
                self.cache[key] = (rr, rc, decision.policy)
        value = self.cache[key]
        if isinstance(value, Exception):
            raise value
        return value

    def join_candidates(self, instance: Instance, current: Plan, before: frozenset[int], joined: frozenset[int],
                        model: PerfModel) -> tuple[RecoveryOption, ...]:
        """`rejoin.join_candidates` (what `plan_join` weighs) for `joined` coming back to
        `instance.plan` running as `current` with `before` down, cached per (structure, layout,
        running plan, down, joined); its search through `cached_search`, so the measured time is the
        first run's."""
        key = (structure_key(instance), instance.plan, current, before, joined)
        if key not in self.join_cache:
            options = PlanningOptions("auto", self.time_limit_s, SolverOptions("cpsat", self.threads, self.seed))
            self.join_cache[key], _ = join_candidates(
                instance, current, before, joined, options, model=model,
                search=lambda state, failed, _deadline: cached_search(state, failed, self.time_limit_s, model))
        return self.join_cache[key]


@dataclass(frozen=True)
class Reconfiguration:
    """A reconfiguration candidate as the family uses it: the plan, its step, the measured search
    time, the migration time (scheduled, or its lower bound) and why."""

    plan: Plan
    step_s: float
    search_s: float
    migration_s: float
    reason: str


class _ChameleonFamily(Policy):
    """Responses built from `decide`'s candidates; repairs handled as the module says.

    With `guards` (default) two shortcomings of the candidates as `decide` builds them are
    corrected, each with a note in the response: (1) the rerouting MILP's plan is replaced by the
    paper's even split when that is faster (seen at 16k GPUs: 26.9 s vs 17.35 s per step); (2) the
    migration-minimising re-mapping of the searched plan's TP groups is dropped when the search's
    own mapping runs faster (stage neighbours on one node: ~1% on 32 GPUs), its migration then
    taken as `migration_lower_bound_s`. `guards=False` ("chameleon-unguarded") uses them as is."""

    def __init__(self, time_limit_s: float = SEARCH_TIME_LIMIT_S, search_charge_s: float | None = None,
                 source: DecisionSource | None = None, restart_s: float = RESTART_S,
                 checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S, guards: bool = True) -> None:
        super().__init__()
        self.source = source or DecisionSource(time_limit_s)
        self.search_charge_s = search_charge_s
        self.restart_s, self.interval_s = restart_s, checkpoint_interval_s
        self.guards = guards

    def __repr__(self) -> str:
        return f"{type(self).__name__}(search_charge_s={self.search_charge_s}, guards={self.guards})"

    # Candidates ----------------------------------------------------------------------------------
    def better_reroute(self, state: PolicyState, rr: Candidate | None) -> tuple[Candidate | None, str]:
        """The decided shares, or the even split when guards are on and it is faster."""
        if not self.guards:
            return rr, ""
        even = DecisionSource.even_candidate(state.instance, state.dead, self.model(state.instance))
        if even is not None and (rr is None or even.iteration_time_s < rr.iteration_time_s * (1 - 1e-9)):
            was = "infeasible" if rr is None else f"{rr.iteration_time_s:.3f} s"
            return even, f"guard: even split {even.iteration_time_s:.3f} s/step beats the decided shares ({was})"
        return rr, ""

    def reconfiguration(self, state: PolicyState, rc: Candidate | None) -> tuple[Reconfiguration | None, str]:
        if rc is None:
            return None, ""
        migration = rc.communication[0].makespan_s if rc.communication else 0.0
        measured = max(rc.transition_s - migration - GROUP_REBUILD_S, 0.0)
        found = Reconfiguration(rc.plan, rc.iteration_time_s, measured, migration, rc.reason)
        raw = rc.solve.solution if rc.solve is not None else None
        if not self.guards or raw is None or raw == rc.plan:
            return found, ""
        model = self.model(state.instance)
        estimate = model.evaluate(raw, state.dead)
        if not estimate.memory_ok or estimate.iteration_time_s >= found.step_s * (1 - 1e-9):
            return found, ""
        bound = migration_lower_bound_s(model, state.layout, raw, state.dead)
        note = (f"guard: the search's own device mapping runs {estimate.iteration_time_s:.3f} s/step vs "
                f"{found.step_s:.3f} s re-mapped; migration bound {bound:.2f} s (vs {migration:.2f} s scheduled)")
        return Reconfiguration(raw, estimate.iteration_time_s, measured, bound, rc.reason), note

    def charged_search(self, rc: Reconfiguration) -> float:
        return rc.search_s if self.search_charge_s is None else self.search_charge_s

    def options(self, rr: Candidate | None, rc: Reconfiguration | None) -> list[Option]:
        found = []
        if rr is not None:
            found.append(Option("reroute", rr.iteration_time_s, 0.0))
        if rc is not None:
            background = self.charged_search(rc) + rc.migration_s
            found.append(Option("reconfigure", rc.step_s, background + GROUP_REBUILD_S))
            if rr is not None:
                found.append(Option("hybrid", rc.step_s, GROUP_REBUILD_S, background, rr.iteration_time_s))
        return found

    def respond_option(self, option: Option, rr: Candidate | None, rc: Reconfiguration | None, why: str) -> Response:
        if option.name == "reroute":
            assert rr is not None
            return Response(rr.plan, rr.iteration_time_s, 0.0, f"reroute: {rr.reason}; {why}", "reroute")
        assert rc is not None
        search = self.charged_search(rc)
        if option.name == "reconfigure":
            return Response(rc.plan, rc.step_s, option.transition_s,
                            f"reconfigure: {rc.reason}; charged search {search:.2f} s + migration "
                            f"{rc.migration_s:.2f} s + rebuild {GROUP_REBUILD_S:.0f} s; {why}", "reconfigure",
                            search_s=search)
        return Response(rc.plan, rc.step_s, option.transition_s,
                        f"hybrid: rerouted at {option.interim_step_s:.3f} s/step for {option.background_s:.2f} s of "
                        f"background search and migration, then {option.transition_s:.0f} s switch; {why}", "hybrid",
                        interim_step_s=option.interim_step_s, interim_s=option.background_s, search_s=search)

    def choose(self, state: PolicyState, options: list[Option]) -> tuple[Option | None, str]:
        raise NotImplementedError

    # Failures ------------------------------------------------------------------------------------
    def on_failure(self, state: PolicyState) -> Response:
        try:
            rr, rc, _ = self.source.candidates(state.instance, state.dead)
        except UnrecoverableError as error:
            return restart_response(self, state, str(error), self.restart_s, self.interval_s / 2,
                                    self.source.time_limit_s)
        rr, note_rr = self.better_reroute(state, rr)
        reconf, note_rc = self.reconfiguration(state, rc)
        options = self.options(rr, reconf)
        option, why = self.choose(state, options)
        if option is None:
            if not options:
                return restart_response(self, state, "neither rerouting nor reconfiguration is feasible",
                                        self.restart_s, self.interval_s / 2, self.source.time_limit_s)
            option, why = min(options, key=lambda o: o.transition_s), why + "; none usable, least transition taken"
        why = "; ".join(x for x in (why, note_rr if option.name != "reconfigure" else "",
                                     note_rc if option.name != "reroute" else "") if x)
        return self.respond_option(option, rr, reconf, why)

    # Repairs -------------------------------------------------------------------------------------
    def steady(self, state: PolicyState) -> tuple[Plan, float]:
        """The current layout with its own dead devices rerouted around (decided shares)."""
        model = self.model(state.instance)
        if not state.dead & _devices(state.layout):
            return state.layout, model.evaluate(state.layout, state.dead).iteration_time_s
        rr = reroute_candidate(state.instance, state.dead, model, self.source.time_limit_s)
        best, _ = self.better_reroute(state, rr if rr.feasible else None)
        if best is not None:
            return best.plan, best.iteration_time_s
        plan = even_reroute(state.layout, state.dead)
        return plan, model.evaluate(plan, state.dead).iteration_time_s

    def regroup_option(self, state: PolicyState) -> tuple[Option | None, Plan | None, float]:
        """Reconfigure over every live device, the repaired ones included (they hold no state)."""
        model = self.model(state.instance)
        result, measured = cached_search(state.instance, state.dead, self.source.time_limit_s, model)
        if result.solution is None:
            return None, None, 0.0
        search = measured if self.search_charge_s is None else self.search_charge_s
        migration = migration_lower_bound_s(model, state.layout, result.solution, state.previous_dead)
        step = model.evaluate(result.solution, state.dead).iteration_time_s
        return Option("reconfigure", step, search + migration + GROUP_REBUILD_S), result.solution, search

    def on_repair(self, state: PolicyState) -> Response:
        if lost_layers(state.instance, state.dead):
            return restart_response(self, state, "some layer lost every replica", self.restart_s, 0.0,
                                    self.source.time_limit_s)
        plan, step = self.steady(state)
        if state.changed & _devices(state.layout):
            return Response(plan, step, self.rejoin_cost_s(state, state.layout),
                            "repaired devices rejoin their slots (state copied from a replica)", "rejoin")
        return self.use_idle(state, plan, step)

    def use_idle(self, state: PolicyState, plan: Plan, step: float) -> Response:
        return Response(plan, step, 0.0, "repaired devices outside the layout stay idle", "stay")

    def _respond(self, state: PolicyState) -> Response:
        if state.kind == "start":
            return self.start(state)
        if state.kind == "repair":
            return self.on_repair(state)
        return self.on_failure(state)


class Chameleon(_ChameleonFamily):
    """Ours: Eq. 8 in expectation over D (mean = MTBF / survivors) among reroute, reconfigure, hybrid."""

    name = "chameleon"

    def fault_statistics(self, state: PolicyState) -> tuple[float | None, float | None]:
        """(explicit D, mean D) as `decide` reads them from the instance."""
        explicit = state.instance.spec.failures.next_fault_s
        survivors = state.instance.num_devices - len(state.dead)
        return explicit, (explicit if explicit is not None else mean_next_fault_s(state.instance, survivors))

    def choose(self, state: PolicyState, options: list[Option]) -> tuple[Option | None, str]:
        explicit, mean = self.fault_statistics(state)
        option, scores = select(options, state.instance.spec.training.global_batch, explicit, mean)
        basis = (f"D = {explicit:.0f} s" if explicit is not None else
                 f"expected D = {mean:.0f} s (MTBF / survivors)" if mean is not None else "no fault statistics")
        return option, basis + ", scores " + ", ".join(f"{k} {v:.2f}" for k, v in scores.items())

    def running(self, state: PolicyState) -> Plan:
        """The plan that ran before the repair: the layout with the devices then down rerouted
        around as this policy rerouted them (`decide`'s candidates, cached at that failure).
        Raises InfeasibleError when no rerouting of the layout exists (nothing was running)."""
        before = state.previous_dead
        if not before & _devices(state.layout):
            return state.layout
        previous = PolicyState(at_state(state.instance, state.layout, before), before, "fail", time_s=state.time_s)
        try:
            rr, _, _ = self.source.candidates(previous.instance, before)
        except UnrecoverableError:
            rr = None
        best, _ = self.better_reroute(previous, rr)
        return best.plan if best is not None else even_reroute(state.layout, before)

    def on_repair(self, state: PolicyState) -> Response:
        """The repaired devices come back as `rejoin.plan_join` decides: keep running (they stay
        idle and out of later decisions until the next repair offers them again), take back their
        rerouted slots (their state copied by the migration schedule) or scale up over every live
        device (search charged as for a failure, migration, group rebuild); Eq. 8 under this
        policy's fault statistics."""
        if lost_layers(state.instance, state.dead):
            return restart_response(self, state, "some layer lost every replica", self.restart_s, 0.0,
                                    self.source.time_limit_s)
        try:
            current = self.running(state)
        except InfeasibleError:
            return super().on_repair(state)
        model = self.model(state.instance)
        candidates = self.source.join_candidates(at_state(state.instance, state.layout, state.previous_dead),
                                                 current, state.previous_dead, state.changed, model)
        options, found, searched = [], {}, 0.0
        for c in candidates:
            if not c.feasible or c.estimate is None:
                continue
            transition = c.transition_s
            if c.policy == "scale-up":
                rest = c.communication[0].makespan_s + GROUP_REBUILD_S if c.communication else GROUP_REBUILD_S
                searched = max(c.transition_s - rest, 0.0) if self.search_charge_s is None else self.search_charge_s
                transition = searched + rest
            options.append(Option(c.policy, c.iteration_time_s, transition))
            found[c.policy] = c
        explicit, mean = self.fault_statistics(state)
        chosen, scores = select(options, state.instance.spec.training.global_batch, explicit, mean)
        why = "scores " + ", ".join(f"{k} {v:.2f}" for k, v in scores.items())
        if chosen is None or chosen.name == "keep-running":
            keep = found["keep-running"]
            return Response(keep.plan, keep.iteration_time_s, 0.0, f"keep running, devices {sorted(state.changed)} "
                            f"idle ({why})", "stay", idle=state.changed)
        option = found[chosen.name]
        if chosen.name == "rejoin-slots":
            return Response(option.plan, chosen.step_s, chosen.transition_s, f"{option.reason} ({why})", "rejoin")
        return Response(option.plan, chosen.step_s, chosen.transition_s, f"scale-up: {option.reason}; charged "
                        f"search {searched:.2f} s ({why})", "reconfigure", search_s=searched)


class Hybrid(_ChameleonFamily):
    """Reroute now, reconfigure in the background, switch when ready (if the new plan is faster)."""

    name = "hybrid"

    def choose(self, state: PolicyState, options: list[Option]) -> tuple[Option | None, str]:
        named = {o.name: o for o in options}
        if "hybrid" in named:
            if named["hybrid"].step_s < named["hybrid"].interim_step_s:
                return named["hybrid"], "switch when the background reconfiguration is ready"
            return named["reroute"], "the reconfigured plan is not faster: stay rerouted"
        if "reroute" in named:
            return named["reroute"], "no reconfiguration found: reroute"
        if "reconfigure" in named:
            return named["reconfigure"], "rerouting impossible: reconfigure (no interim training)"
        return None, "no candidate"

    def use_idle(self, state: PolicyState, plan: Plan, step: float) -> Response:
        option, new, search = self.regroup_option(state)
        if option is None or new is None or option.step_s >= step:
            return Response(plan, step, 0.0, "repaired devices stay idle (no faster plan uses them)", "stay")
        background = option.transition_s - GROUP_REBUILD_S
        return Response(new, option.step_s, GROUP_REBUILD_S, f"re-plan over the repaired devices in the background "
                        f"({background:.2f} s), then switch", "hybrid", interim_step_s=step, interim_s=background,
                        search_s=search)


class RerouteOnly(_ChameleonFamily):
    """`decide`'s rerouting candidate (decided shares) whenever it exists."""

    name = "reroute-only"

    def choose(self, state: PolicyState, options: list[Option]) -> tuple[Option | None, str]:
        named = {o.name: o for o in options}
        if "reroute" in named:
            return named["reroute"], "reroute-only"
        return named.get("reconfigure"), "rerouting impossible: reconfigure"


class ReconfigureOnly(_ChameleonFamily):
    """`decide`'s reconfiguration candidate, always (search counted)."""

    name = "reconfigure-only"

    def choose(self, state: PolicyState, options: list[Option]) -> tuple[Option | None, str]:
        named = {o.name: o for o in options}
        if "reconfigure" in named:
            return named["reconfigure"], "reconfigure-only"
        return named.get("reroute"), "no reconfiguration found: reroute"

    def use_idle(self, state: PolicyState, plan: Plan, step: float) -> Response:
        option, new, search = self.regroup_option(state)
        if option is None or new is None:
            return Response(plan, step, 0.0, "no plan over the repaired devices", "stay")
        return Response(new, option.step_s, option.transition_s, "re-plan over the repaired devices", "reconfigure",
                        search_s=search)


# -- the paper's rule --------------------------------------------------------------------------------
class ChameleonPaper(Policy):
    """Eq. 8 with a point D (the mean) between even rerouting and the paper's enumeration."""

    name = "chameleon-paper"

    def __init__(self, time_limit_s: float = SEARCH_TIME_LIMIT_S, search_charge_s: float | None = None,
                 restart_s: float = RESTART_S, checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S) -> None:
        super().__init__()
        self.time_limit_s, self.search_charge_s = time_limit_s, search_charge_s
        self.restart_s, self.interval_s = restart_s, checkpoint_interval_s
        self.searcher = "enumerate_plans"

    def reconfigure(self, state: PolicyState,
                    previous: frozenset[int]) -> tuple[Option | None, Plan | None, float, str]:
        model = self.model(state.instance)
        try:
            result, measured = cached_search(state.instance, state.dead, self.time_limit_s, model, "enumerate")
            how = f"the paper's enumeration ({result.status.value})"
        except ImportError:
            result, measured = cached_search(state.instance, state.dead, self.time_limit_s, model)
            how = "search_plan (enumerate_plans absent)"
        self.searcher = how
        if result.solution is None:
            return None, None, 0.0, f"{how}: {result.reason}"
        search = measured if self.search_charge_s is None else self.search_charge_s
        migration = migration_lower_bound_s(model, state.layout, result.solution, previous)
        step = model.evaluate(result.solution, state.dead).iteration_time_s
        return Option("reconfigure", step, search + migration + GROUP_REBUILD_S), result.solution, search, how

    def point_d(self, state: PolicyState) -> float | None:
        survivors = state.instance.num_devices - len(state.dead)
        return mean_next_fault_s(state.instance, survivors)

    def _respond(self, state: PolicyState) -> Response:
        if state.kind == "start":
            return self.start(state)
        model = self.model(state.instance)
        batch = state.instance.spec.training.global_batch
        if lost_layers(state.instance, state.dead):
            return restart_response(self, state, "some layer lost every replica", self.restart_s,
                                    self.interval_s / 2 if state.kind == "fail" else 0.0, self.time_limit_s)
        try:
            rerouted = even_reroute(state.layout, state.dead)
            estimate = model.evaluate(rerouted, state.dead)
            stay = Option("reroute", estimate.iteration_time_s, 0.0) if estimate.memory_ok else None
        except InfeasibleError:
            rerouted, stay = None, None
        if state.kind == "repair" and state.changed & _devices(state.layout) and stay is not None:
            return Response(rerouted, stay.step_s, self.rejoin_cost_s(state, state.layout),
                            "repaired devices rejoin their slots (state copied from a replica)", "rejoin")
        option, new, search, how = self.reconfigure(state, state.previous_dead if state.kind == "repair"
                                                    else state.dead)
        options = [o for o in (stay, option) if o is not None]
        d = self.point_d(state)
        chosen, scores = select(options, batch, d, None)
        why = (f"Eq. 8 with point D = {d:.0f} s" if d is not None else "no D: steady state") + ", scores " + \
            ", ".join(f"{k} {v:.2f}" for k, v in scores.items()) + f"; reconfiguration by {how}"
        if stay is not None and option is not None:
            why += f"; break-even D {break_even_next_fault(stay.step_s, option.step_s, option.transition_s):.0f} s"
        if chosen is None and options:
            chosen = min(options, key=lambda o: o.transition_s)
        if chosen is None:
            return restart_response(self, state, "neither rerouting nor reconfiguration is feasible",
                                    self.restart_s, self.interval_s / 2, self.time_limit_s)
        if chosen.name == "reroute":
            action = "stay" if state.kind == "repair" else "reroute"
            return Response(rerouted, chosen.step_s, 0.0, why, action)
        return Response(new, chosen.step_s, chosen.transition_s, why, "reconfigure", search_s=search)


# -- checkpoint-restart -------------------------------------------------------------------------------
class CheckpointRestart(Policy):
    """Roll back to the last checkpoint and restart on the survivors (or on everything after a repair)."""

    name = "checkpoint"

    def __init__(self, checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S, restart_s: float = RESTART_S,
                 time_limit_s: float = SEARCH_TIME_LIMIT_S) -> None:
        super().__init__()
        self.interval_s, self.restart_s, self.time_limit_s = checkpoint_interval_s, restart_s, time_limit_s

    def _respond(self, state: PolicyState) -> Response:
        if state.kind == "start":
            return self.start(state)
        if state.kind == "repair":  # no restart for a repair: the devices join at the next restart
            model = self.model(state.instance)
            step = model.evaluate(state.layout, state.dead).iteration_time_s
            return Response(state.layout, step, 0.0, "repaired devices idle until the next restart", "stay")
        return restart_response(self, state, "failure", self.restart_s, self.interval_s / 2, self.time_limit_s,
                                fallback=False)


__all__ = ["Chameleon", "ChameleonPaper", "CheckpointRestart", "DecisionSource", "EvenRerouteAblation", "Hybrid",
           "Option", "Policy", "PolicyState", "ReconfigureOnly", "RedundancyAblation", "RerouteOnly", "Response",
           "TemplatesAblation", "at_state", "cached_search", "option_score", "restart_response", "select",
           "structure_key"]
