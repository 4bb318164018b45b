"""Our policy in the failure-trace simulator, deciding as the product does.

`DecisionSource` asks `decision.decide(policy="auto")` (what `planning.plan_recovery`, the
CLI, the API and the runtime call) for each state, once, and keeps its candidates: the
rerouting, the searched reconfiguration and their hybrid, exactly as built. Every policy here
scores them with the product's one Eq. 8 scorer, `decision.score_option`; only two things
may differ from `decide`'s own choice, and both on purpose:

- the fault statistics: the told policy reads the instance's, the blind one estimates them from
  the history, hindsight is told the next event (recovery/compare.py);
- the search time charged: measured (as `decide` charges it), or a fixed `search_charge_s` so that
  runs are reproducible; the hybrid's background phase and the reconfiguration's transition are
  re-derived with it.

With the instance's statistics and the measured search, `Chameleon` chooses what `decide` chose
(tests/test_simulate.py checks it). A checker rejection (`check.PlanRejected`) is a bug and
propagates: the simulator never swaps in another plan behind the decision's back.

Policies: `Chameleon` (Eq. 8 in expectation over an exponential D with mean MTBF / survivors, or
a point D when the instance gives one), `Hybrid` (reroute now, reconfigure in the background,
switch when faster), `RerouteOnly` / `ReconfigureOnly` (one candidate whenever it exists) and
`ChameleonPaper` (the paper's rule: even rerouting vs the paper's Algorithm 1 enumeration, Eq. 8
with a point D, no hybrid).

Repairs. Chameleon decides them as `rejoin.plan_join` does, on the same candidates
(`rejoin.join_candidates`, cached in the `DecisionSource`): keep running with the repaired
devices idle (`Response.idle`), take back their rerouted slots, or scale up over every live
device; Eq. 8 under its fault statistics. The rest of the family: a repaired device in the running
layout rejoins its own slot (migration bound + group rebuild); one outside it joins the idle pool,
which ReconfigureOnly always re-plans over and the Hybrid re-plans over in the background when
that is faster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from chameleon_opt.errors import InfeasibleError, UnrecoverableError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.plan import Plan
from chameleon_opt.planning import PlanningOptions
from chameleon_opt.recovery.interface import (CHECKPOINT_INTERVAL_S, RESTART_S, SEARCH_TIME_LIMIT_S, Policy,
                                              PolicyState, Response, at_state, cached_search, restart_response,
                                              structure_key)
from chameleon_opt.decision import (GROUP_REBUILD_S, Decision, RecoveryOption, break_even_next_fault, decide,
                                           lost_layers, mean_next_fault_s, migration_lower_bound_s,
                                           reroute_candidate, score_option)
from chameleon_opt.rejoin import join_candidates
from chameleon_opt.solve.backends import DEFAULT, SolverOptions
from chameleon_opt.solve.deadline import Deadline


@dataclass(frozen=True)
class Choice:
    """One candidate as this policy charges it: `decide`'s option (or `join_candidates`'), its
    step, its transition with the search charged as the policy says and, for the hybrid, the
    background phase (search + migration) at the interim (rerouted) step."""

    name: str
    option: RecoveryOption
    step_s: float
    transition_s: float
    search_s: float = 0.0
    background_s: float = 0.0
    interim_step_s: float | None = None

    def score(self, global_batch: int, next_fault_s: float | None, mean_next_fault: float | None) -> float:
        """The product's Eq. 8 (`score_option`) under the given fault statistics."""
        return score_option(global_batch, self.step_s, self.transition_s, next_fault_s, mean_next_fault,
                            self.interim_step_s, self.background_s)


def best_choice(choices: list[Choice], global_batch: int, next_fault_s: float | None,
                mean_next_fault: float | None) -> tuple[Choice | None, dict[str, float]]:
    """The highest score (the first on ties, as `decide` breaks them) and every score; None when
    no choice scores above 0 (each transition outlasts D)."""
    scores = {c.name: c.score(global_batch, next_fault_s, mean_next_fault) for c in choices}
    usable = [c for c in choices if scores[c.name] > 0]
    return (max(usable, key=lambda c: scores[c.name]) if usable else None), scores


@dataclass
class DecisionSource:
    """`decide(policy="auto")` per (instance structure, layout, dead), cached and shared by the
    policies built on its candidates; `believed` gives the model decisions use (default: the true
    one), `solver` the options every decision it makes runs with. Fault statistics are not part
    of the key: they only change the scores."""

    time_limit_s: float = SEARCH_TIME_LIMIT_S
    solver: SolverOptions = DEFAULT
    cache: dict = field(default_factory=dict)
    join_cache: dict = field(default_factory=dict)
    calls: int = 0
    believed: Callable[[Instance], PerfModel] | None = None

    def deadline(self) -> Deadline:
        """A decision's deadline: deterministic when `solver.deterministic` asks for reproducible runs."""
        return Deadline.after(self.time_limit_s, deterministic=self.solver.deterministic)

    def decision(self, instance: Instance, dead: frozenset[int]) -> Decision:
        """The product's decision for `dead` on `instance.plan`. Raises UnrecoverableError (cached)."""
        key = (structure_key(instance), instance.plan, dead)
        if key not in self.cache:
            self.calls += 1
            try:
                self.cache[key] = decide(instance, dead, "auto", deadline=self.deadline(),
                                         options=self.solver,
                                         model=self.believed(instance) if self.believed else None)
            except UnrecoverableError as error:
                self.cache[key] = error
        value = self.cache[key]
        if isinstance(value, Exception):
            raise value
        return value

    def join_candidates(self, instance: Instance, current: Plan, before: frozenset[int], joined: frozenset[int],
                        model: PerfModel) -> tuple[RecoveryOption, ...]:
        """`rejoin.join_candidates` (what `plan_join` weighs), cached per (structure, layout, running
        plan, down, joined); its search through `cached_search`, so the measured time is the first run's."""
        key = (structure_key(instance), instance.plan, current, before, joined)
        if key not in self.join_cache:
            options = PlanningOptions("auto", self.time_limit_s, self.solver)
            self.join_cache[key], _ = join_candidates(
                instance, current, before, joined, options, model=model,
                search=lambda state, failed, _deadline: cached_search(state, failed, self.time_limit_s, model,
                                                                     options=self.solver))
        return self.join_cache[key]


def _usable(decision: Decision, name: str) -> RecoveryOption | None:
    return next((c for c in decision.candidates if c.policy == name and c.feasible and c.estimate is not None), None)


class _ChameleonFamily(Policy):
    """Responses built from `decide`'s candidates (`choices`); repairs as the module says."""

    def __init__(self, time_limit_s: float = SEARCH_TIME_LIMIT_S, search_charge_s: float | None = None,
                 source: DecisionSource | None = None, restart_s: float = RESTART_S,
                 checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S) -> None:
        super().__init__()
        self.source = source or DecisionSource(time_limit_s)
        self.search_charge_s = search_charge_s
        self.restart_s, self.interval_s = restart_s, checkpoint_interval_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}(search_charge_s={self.search_charge_s})"

    def charged(self, measured_s: float) -> float:
        return measured_s if self.search_charge_s is None else self.search_charge_s

    def choices(self, decision: Decision) -> list[Choice]:
        """`decide`'s usable candidates with the search charged as this policy says. `decide`
        charges a reconfiguration search + migration + its rebuild (`rebuild_s`) and its hybrid
        the rebuild after a background of search + migration: the same terms, the search replaced."""
        rr, rc, hybrid = _usable(decision, "reroute"), _usable(decision, "reconfigure"), _usable(decision, "hybrid")
        found = []
        if rr is not None:
            found.append(Choice("reroute", rr, rr.iteration_time_s, rr.transition_s))
        if rc is not None:
            migration = rc.communication[0].makespan_s if rc.communication else 0.0
            search = self.charged(max(rc.transition_s - migration - rc.rebuild_s, 0.0))
            background = search + migration
            found.append(Choice("reconfigure", rc, rc.iteration_time_s, background + rc.rebuild_s, search))
            if hybrid is not None and hybrid.interim is not None:
                found.append(Choice("hybrid", hybrid, hybrid.iteration_time_s, hybrid.transition_s, search, background,
                                    hybrid.interim.iteration_time_s))
        return found

    def respond_choice(self, choice: Choice, why: str) -> Response:
        option = choice.option
        if choice.name == "reroute":
            return Response(option.plan, choice.step_s, 0.0, f"reroute: {option.reason}; {why}", "reroute")
        if choice.name == "reconfigure":
            return Response(option.plan, choice.step_s, choice.transition_s,
                            f"reconfigure: {option.reason}; charged search {choice.search_s:.2f} s + migration and "
                            f"rebuild {choice.transition_s - choice.search_s:.2f} s; {why}", "reconfigure",
                            search_s=choice.search_s)
        return Response(option.plan, choice.step_s, choice.transition_s,
                        f"hybrid: rerouted at {choice.interim_step_s:.3f} s/step for {choice.background_s:.2f} s of "
                        f"background search and migration, then {choice.transition_s:.0f} s switch; {why}", "hybrid",
                        interim_step_s=choice.interim_step_s, interim_s=choice.background_s, search_s=choice.search_s)

    def choose(self, state: PolicyState, choices: list[Choice]) -> tuple[Choice | None, str]:
        raise NotImplementedError

    # Failures ------------------------------------------------------------------------------------
    def on_failure(self, state: PolicyState) -> Response:
        try:
            decision = self.source.decision(state.instance, state.dead)
        except UnrecoverableError as error:
            return restart_response(self, state, str(error), self.restart_s, self.interval_s / 2,
                                    self.source.time_limit_s)
        choices = self.choices(decision)
        choice, why = self.choose(state, choices)
        if choice is None:
            if not choices:
                return restart_response(self, state, f"no usable candidate ({decision.reason})", self.restart_s,
                                        self.interval_s / 2, self.source.time_limit_s)
            choice, why = min(choices, key=lambda c: c.transition_s), why + "; none usable, least transition taken"
        return self.respond_choice(choice, why)

    # Repairs -------------------------------------------------------------------------------------
    def steady(self, state: PolicyState) -> tuple[Plan, float]:
        """The current layout with its own dead devices rerouted around (the product's rerouting;
        the even split where it finds none)."""
        model = self.model(state.instance)
        if not state.dead & set(state.layout.devices):
            return state.layout, model.evaluate(state.layout, state.dead).iteration_time_s
        rr = reroute_candidate(state.instance, state.dead, model, self.source.deadline(), self.source.solver)
        if rr.feasible and rr.plan is not None:
            return rr.plan, rr.iteration_time_s
        plan = even_reroute(state.layout, state.dead)
        return plan, model.evaluate(plan, state.dead).iteration_time_s

    def regroup(self, state: PolicyState) -> tuple[Plan, float, float, float] | None:
        """(plan, step, transition, charged search) of a reconfiguration over every live device,
        the repaired ones included (they hold no state); None when the search finds none."""
        model = self.model(state.instance)
        result, measured = cached_search(state.instance, state.dead, self.source.time_limit_s, model,
                                         options=self.source.solver)
        if result.solution is None:
            return None
        search = self.charged(measured)
        migration = migration_lower_bound_s(model, state.layout, result.solution, state.previous_dead)
        step = model.evaluate(result.solution, state.dead).iteration_time_s
        return result.solution, step, search + migration + GROUP_REBUILD_S, search

    def on_repair(self, state: PolicyState) -> Response:
        if lost_layers(state.instance, state.dead):
            return restart_response(self, state, "some layer lost every replica", self.restart_s, 0.0,
                                    self.source.time_limit_s)
        plan, step = self.steady(state)
        if state.changed & set(state.layout.devices):
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
    """Ours, as shipped: Eq. 8 among `decide`'s reroute, reconfigure and hybrid (point D when the
    instance gives one, else its expectation with mean MTBF / survivors)."""

    name = "chameleon"

    def fault_statistics(self, state: PolicyState) -> tuple[float | None, float | None]:
        """(explicit D, mean D) as `decide` reads them from the instance."""
        explicit = state.instance.spec.failures.next_fault_s
        survivors = state.instance.num_devices - len(state.dead)
        return explicit, (explicit if explicit is not None else mean_next_fault_s(state.instance, survivors))

    def scored(self, state: PolicyState, choices: list[Choice]) -> tuple[Choice | None, str]:
        explicit, mean = self.fault_statistics(state)
        choice, scores = best_choice(choices, state.instance.spec.training.global_batch, explicit, mean)
        basis = (f"D = {explicit:.0f} s" if explicit is not None else
                 f"expected D = {mean:.0f} s (MTBF / survivors)" if mean is not None else "no fault statistics")
        return choice, basis + ", scores " + ", ".join(f"{k} {v:.2f}" for k, v in scores.items())

    def choose(self, state: PolicyState, choices: list[Choice]) -> tuple[Choice | None, str]:
        return self.scored(state, choices)

    def running(self, state: PolicyState) -> Plan:
        """The plan that ran before the repair: the layout with the devices then down rerouted
        around by `decide`'s rerouting (cached at that failure). Raises InfeasibleError when that
        state had no rerouting (nothing was running on this layout)."""
        before = state.previous_dead
        if not before & set(state.layout.devices):
            return state.layout
        try:
            rr = _usable(self.source.decision(at_state(state.instance, state.layout, before), before), "reroute")
        except UnrecoverableError:
            rr = None
        if rr is None or rr.plan is None:
            raise InfeasibleError("no rerouting of the layout ran before the repair")
        return rr.plan

    def on_repair(self, state: PolicyState) -> Response:
        """The repaired devices come back as `rejoin.plan_join` decides: keep running (they stay
        idle and out of later decisions until the next repair offers them again), take back their
        rerouted slots or scale up over every live device (search charged as for a failure)."""
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
        choices = []
        for c in candidates:
            if not c.feasible or c.estimate is None:
                continue
            if c.policy == "scale-up":  # the search's share of the transition, charged as for a failure
                rest = c.communication[0].makespan_s + GROUP_REBUILD_S if c.communication else GROUP_REBUILD_S
                search = self.charged(max(c.transition_s - rest, 0.0))
                choices.append(Choice(c.policy, c, c.iteration_time_s, search + rest, search))
            else:
                choices.append(Choice(c.policy, c, c.iteration_time_s, c.transition_s))
        chosen, why = self.scored(state, choices)
        if chosen is None or chosen.name == "keep-running":
            keep = next(c for c in candidates if c.policy == "keep-running")
            return Response(keep.plan, keep.iteration_time_s, 0.0, f"keep running, devices {sorted(state.changed)} "
                            f"idle ({why})", "stay", idle=state.changed)
        if chosen.name == "rejoin-slots":
            return Response(chosen.option.plan, chosen.step_s, chosen.transition_s, f"{chosen.option.reason} ({why})",
                            "rejoin")
        return Response(chosen.option.plan, chosen.step_s, chosen.transition_s, f"scale-up: {chosen.option.reason}; "
                        f"charged search {chosen.search_s:.2f} s ({why})", "reconfigure", search_s=chosen.search_s)


class Hybrid(_ChameleonFamily):
    """Reroute now, reconfigure in the background, switch when ready (if the new plan is faster)."""

    name = "hybrid"

    def choose(self, state: PolicyState, choices: list[Choice]) -> tuple[Choice | None, str]:
        named = {c.name: c for c in choices}
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
        found = self.regroup(state)
        if found is None or found[1] >= step:
            return Response(plan, step, 0.0, "repaired devices stay idle (no faster plan uses them)", "stay")
        new, new_step, transition, search = found
        background = transition - GROUP_REBUILD_S
        return Response(new, new_step, GROUP_REBUILD_S, f"re-plan over the repaired devices in the background "
                        f"({background:.2f} s), then switch", "hybrid", interim_step_s=step, interim_s=background,
                        search_s=search)


def _prefer(choices: list[Choice], first: str, fallback: str, why_fallback: str) -> tuple[Choice | None, str]:
    """The `first` candidate when `decide` built one, else the `fallback` (the single-option policies)."""
    named = {c.name: c for c in choices}
    if first in named:
        return named[first], f"{first}-only"
    return named.get(fallback), why_fallback


class RerouteOnly(_ChameleonFamily):
    """`decide`'s rerouting candidate whenever it exists."""

    name = "reroute-only"

    def choose(self, state: PolicyState, choices: list[Choice]) -> tuple[Choice | None, str]:
        return _prefer(choices, "reroute", "reconfigure", "rerouting impossible: reconfigure")


class ReconfigureOnly(_ChameleonFamily):
    """`decide`'s reconfiguration candidate, always (search counted)."""

    name = "reconfigure-only"

    def choose(self, state: PolicyState, choices: list[Choice]) -> tuple[Choice | None, str]:
        return _prefer(choices, "reconfigure", "reroute", "no reconfiguration found: reroute")

    def use_idle(self, state: PolicyState, plan: Plan, step: float) -> Response:
        found = self.regroup(state)
        if found is None:
            return Response(plan, step, 0.0, "no plan over the repaired devices", "stay")
        new, new_step, transition, search = found
        return Response(new, new_step, transition, "re-plan over the repaired devices", "reconfigure", search_s=search)


class ChameleonPaper(Policy):
    """The paper's rule: Eq. 8 (`score_option`) with a point D (the mean) between the even split
    and the paper's enumeration (`search_plan` when it is absent); transition = enumeration time
    + migration bound + rebuild."""

    name = "chameleon-paper"

    def __init__(self, time_limit_s: float = SEARCH_TIME_LIMIT_S, search_charge_s: float | None = None,
                 restart_s: float = RESTART_S, checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S) -> None:
        super().__init__()
        self.time_limit_s, self.search_charge_s = time_limit_s, search_charge_s
        self.restart_s, self.interval_s = restart_s, checkpoint_interval_s
        self.searcher = "enumerate_plans"

    def reconfigure(self, state: PolicyState, previous: frozenset[int]) -> tuple[Choice | None, str]:
        model = self.model(state.instance)
        try:
            result, measured = cached_search(state.instance, state.dead, self.time_limit_s, model, "enumerate",
                                             self.solver)
            how = f"the paper's enumeration ({result.status.value})"
        except ImportError:
            result, measured = cached_search(state.instance, state.dead, self.time_limit_s, model,
                                             options=self.solver)
            how = "search_plan (enumerate_plans absent)"
        self.searcher = how
        if result.solution is None:
            return None, f"{how}: {result.reason}"
        search = measured if self.search_charge_s is None else self.search_charge_s
        migration = migration_lower_bound_s(model, state.layout, result.solution, previous)
        estimate = model.evaluate(result.solution, state.dead)
        option = RecoveryOption("reconfigure", True, how, result.solution, estimate)
        return Choice("reconfigure", option, estimate.iteration_time_s, search + migration + GROUP_REBUILD_S,
                      search), how

    def _respond(self, state: PolicyState) -> Response:
        if state.kind == "start":
            return self.start(state)
        model = self.model(state.instance)
        if lost_layers(state.instance, state.dead):
            return restart_response(self, state, "some layer lost every replica", self.restart_s,
                                    self.interval_s / 2 if state.kind == "fail" else 0.0, self.time_limit_s)
        try:
            rerouted = even_reroute(state.layout, state.dead)
            estimate = model.evaluate(rerouted, state.dead)
            stay = Choice("reroute", RecoveryOption("reroute", True, "even split", rerouted, estimate),
                          estimate.iteration_time_s, 0.0) if estimate.memory_ok else None
        except InfeasibleError:
            stay = None
        if state.kind == "repair" and state.changed & set(state.layout.devices) and stay is not None:
            return Response(stay.option.plan, stay.step_s, self.rejoin_cost_s(state, state.layout),
                            "repaired devices rejoin their slots (state copied from a replica)", "rejoin")
        change, how = self.reconfigure(state, state.previous_dead if state.kind == "repair" else state.dead)
        choices = [c for c in (stay, change) if c is not None]
        survivors = state.instance.num_devices - len(state.dead)
        d = mean_next_fault_s(state.instance, survivors)
        chosen, scores = best_choice(choices, state.instance.spec.training.global_batch, d, None)
        why = (f"Eq. 8 with point D = {d:.0f} s" if d is not None else "no D: steady state") + ", scores " + \
            ", ".join(f"{k} {v:.2f}" for k, v in scores.items()) + f"; reconfiguration by {how}"
        if stay is not None and change is not None:
            why += f"; break-even D {break_even_next_fault(stay.step_s, change.step_s, change.transition_s):.0f} s"
        if chosen is None and choices:
            chosen = min(choices, key=lambda c: c.transition_s)
        if chosen is None:
            return restart_response(self, state, "neither rerouting nor reconfiguration is feasible",
                                    self.restart_s, self.interval_s / 2, self.time_limit_s)
        if chosen.name == "reroute":
            return Response(chosen.option.plan, chosen.step_s, 0.0, why, "stay" if state.kind == "repair" else "reroute")
        return Response(chosen.option.plan, chosen.step_s, chosen.transition_s, why, "reconfigure",
                        search_s=chosen.search_s)
