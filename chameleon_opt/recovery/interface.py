"""What a recovery policy is, for the failure-trace simulator: the state it sees, the response it
gives, the response cache and the pieces every policy shares (the failure-free start, the
rejoin cost, checkpoint-restart on the survivors).

A policy sees a `PolicyState` (the instance whose `plan` is the layout running now, the devices
down now, what just happened) and answers a `Response`: the plan to run, its step time, the time
with no training before it runs (`transition_s`) and, for the hybrid, a phase of training at an
interim step while the reconfiguration proceeds in the background (`interim_s`). Responses are
cached per (layout, dead devices, event): plan search can take seconds, and traces revisit states.
The policies themselves: recovery/chameleon.py (ours, deciding through `decision.decide`),
recovery/ablations.py, recovery/checkpoint.py and the published baselines (oobleck.py,
recycle.py, bamboo.py); recovery/registry.py names them all.
"""

from __future__ import annotations

import dataclasses
import math
import time

from dataclasses import dataclass

from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.decision import GROUP_REBUILD_S, migration_lower_bound_s
from chameleon_opt.solve.backends import DEFAULT, SolverOptions
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.search import search_plan

CHECKPOINT_INTERVAL_S = 1800.0
RESTART_S = 600.0
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
                  how: str = "search", options: SolverOptions = DEFAULT) -> tuple[object, float]:
    """(SolveResult, measured seconds) of `search_plan` (how='search') or the paper's
    `enumerate_plans` (how='enumerate'), memoised per (structure, layout, dead, limit, options): a
    trace revisits states and several policies search the same one. The measured time is the first
    run's. With `options.deterministic` the search's deadline is a deterministic one."""
    key = (structure_key(instance), instance.plan, dead, time_limit_s, how, options.backend, options.threads,
           options.seed, tuple(sorted(options.params.items())), options.deterministic)
    if key not in _SEARCHES:
        start = time.perf_counter()
        deadline = Deadline.after(time_limit_s, deterministic=options.deterministic)
        if how == "enumerate":
            from chameleon_opt.solve.enumerator import enumerate_plans  # lazily: may be absent
            result = enumerate_plans(instance, dead, deadline, model=model)
        else:
            result = search_plan(instance, dead, deadline, options, model=model)
        _SEARCHES[key] = (result, time.perf_counter() - start)
    return _SEARCHES[key]


def at_state(instance: Instance, layout: Plan, dead: frozenset[int]) -> Instance:
    """The instance with `layout` as its running plan and `dead` as its failed devices."""
    return dataclasses.replace(instance, plan=layout, failed_devices=frozenset(dead))


class Policy:
    """Base class: `respond` caches `_respond` per (instance, layout, dead, event)."""

    name = "policy"
    solver: SolverOptions = DEFAULT
    """The options of every solver call the policy makes (`registry.make_policy` sets them);
    `solver.deterministic` also makes its deadlines deterministic (`deadline`)."""

    def deadline(self, time_limit_s: float) -> Deadline:
        """A deadline `time_limit_s` from now for one of this policy's decisions."""
        return Deadline.after(time_limit_s, deterministic=self.solver.deterministic)

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
    result, _ = cached_search(instance, state.dead, time_limit_s, model, options=policy.solver)
    if result.solution is None:
        return Response(None, math.inf, restart_s + lost_s, f"{why}; checkpoint-restart finds no plan on the "
                        f"survivors ({result.reason})", "restart", layout=state.layout, fallback=fallback)
    step = model.evaluate(result.solution, state.dead).iteration_time_s
    notes = (f"{why}; checkpoint-restart: {restart_s:.0f} s restart + {lost_s:.0f} s of lost work redone, "
             f"fresh plan of {len(result.solution.pipelines)} pipelines on {instance.num_devices - len(state.dead)} "
             "live devices")
    return Response(result.solution, step, restart_s + lost_s, notes, "restart", fallback=fallback)
