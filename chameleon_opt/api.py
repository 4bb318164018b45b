"""The planner as a library, for trainers that handle their own processes (torchrun, a scheduler).

    planner = Planner("instances/paper-32.json")      # the job as it runs now
    decision = planner.on_failure([13])               # devices that just failed
    work = decision.for_rank(my_device)               # what this device runs next

`on_failure` builds the recovery candidates (rerouting, reconfiguration and their hybrid), picks
one by Eq. 8, schedules its communication and lowers the chosen plan to one executable plan per
rank; every plan it returns has passed the independent checker. The planner keeps the state a
trainer would otherwise have to carry: the devices failed so far and the layout running now, so
a later failure is planned from the result of the earlier ones.

State carried forward (as the simulator does, `recovery/simulate.py`): after a rerouting decision
the layout stays the old one, failed devices and all, and `current_plan` is that layout with its
`rerouted` entries; the next failure is planned from the layout (rerouting stripped) with every
device failed so far, so the rerouting is re-derived for all of them together rather than stacked.
After a reconfiguration (or a hybrid) the new plan over the survivors is the layout.
`on_join` brings failed devices back (a restarted process, a repaired accelerator) without any
model state: keep running without them, give them back their rerouted slots, or scale up over every
live device, by Eq. 8 (`chameleon_opt/rejoin.py`); they receive their state by migration.

The instance's own `failures.events` are not applied: failures come only from `on_failure`; its
fault statistics (`next_fault_s`, `mtbf_hours_per_device`) score the candidates.

This module never imports torch: trainers import it before (or without) their framework.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from numbers import Integral
from pathlib import Path
from typing import Any

from chameleon_opt.errors import InputError, UnrecoverableError
from chameleon_opt.instance.load import Instance, build_instance, load_instance
from chameleon_opt.perf.model import Estimate, PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.planning import POLICIES, PlanningOptions, RecoveryDecision, plan_recovery
from chameleon_opt.decision import RecoveryOption, check_tp_degrees, refuse_context_parallel, with_stale_copies
from chameleon_opt.rejoin import plan_join
from chameleon_opt.solve.backends import SolverOptions

__all__ = ["POLICIES", "Planner", "PlanningOptions", "RecoveryDecision", "RecoveryOption"]


class Planner:
    """Recovery planning for one job across its failures (see the module docstring).

    `instance` is an Instance, the path of an instance file, or a parsed instance document (a
    trainer building the instance for its own world size). `policy` is `auto` (Eq. 8 among
    rerouting, reconfiguration and the hybrid), `reroute` or `reconfigure`; `time_limit_s`,
    `threads` and `seed` go to the solvers. `tp_degrees`: TP degrees a reconfiguration may move
    to besides the job's own (each must divide the devices per node and the model's heads, KV
    heads and MLP size); the trainer then restores such a plan from its last checkpoint, as the
    planner prices it."""

    def __init__(self, instance: Instance | str | Path | Mapping[str, Any], policy: str = "auto",
                 time_limit_s: float = 10.0, threads: int = 1, seed: int = 0, target: str = "any",
                 tp_degrees: Iterable[int] = ()) -> None:
        if policy not in POLICIES:
            raise InputError(None, "policy", f"unknown policy {policy!r}", f"use one of {', '.join(POLICIES)}")
        if not time_limit_s > 0:
            raise InputError(None, "time_limit_s", f"got {time_limit_s!r}", "give a positive number of seconds")
        if threads < 1:
            raise InputError(None, "threads", f"got {threads!r}", "use at least 1")
        given = tuple(tp_degrees)
        wrong = next((tp for tp in given if isinstance(tp, bool) or not isinstance(tp, Integral)), None)
        if wrong is not None:
            raise InputError(None, "tp_degrees", f"{wrong!r} is not a TP degree", "give integers, e.g. (1, 2)")
        degrees = tuple(int(tp) for tp in given)
        if isinstance(instance, Instance):
            base = instance
        elif isinstance(instance, Mapping):
            base = build_instance(dict(instance))
        else:
            base = load_instance(instance)
        self.policy, self.time_limit_s, self.threads, self.seed = policy, time_limit_s, threads, seed
        refuse_context_parallel(base)
        check_tp_degrees(base, degrees)
        self.options = PlanningOptions(policy, time_limit_s, SolverOptions(threads=threads, seed=seed), target=target,
                                       tp_degrees=degrees)
        self._base = dataclasses.replace(base, failed_devices=frozenset())
        self._layout = base.plan
        self._layouts = [base.plan]   # every layout so far: who held what, to explain stale copies
        self._current = base.plan
        self._failed: frozenset[int] = frozenset()

    @property
    def instance(self) -> Instance:
        """The instance as it stands: the layout running now and every device failed so far."""
        return dataclasses.replace(self._base, plan=self._layout, failed_devices=self._failed)

    @property
    def current_plan(self) -> Plan:
        """The plan running now (after a rerouting: the layout with its `rerouted` entries)."""
        return self._current

    @property
    def failed(self) -> frozenset[int]:
        """Every device reported failed so far."""
        return self._failed

    def estimate(self) -> Estimate:
        """Predicted step time, throughput and memory of the current plan."""
        return PerfModel(self._base).evaluate(self._current, self._failed)

    def on_failure(self, devices: Iterable[int], next_fault_s: float | None = None) -> RecoveryDecision:
        """Plan the recovery from `devices` failing, on top of all earlier failures, and make the
        chosen plan the current one. `next_fault_s` (the time to the next fault, D) overrides
        the instance's fault statistics.

        Raises InputError for devices that do not exist or have already failed,
        UnrecoverableError when some layer lost every replica (restart from a checkpoint; the
        error names live devices whose copy is stale because an earlier decision took them off
        those layers, which is why failures reported one at a time can end the job where the
        same failures reported together do not) and
        InfeasibleError when no candidate is usable (each one's reason is given). On an error
        the planner's state is unchanged."""
        given, n = list(devices), self._base.num_devices
        if not given:
            raise InputError(None, "devices", "no failed device given", "pass the ids of the devices that failed")
        wrong = next((d for d in given if isinstance(d, bool) or not isinstance(d, Integral) or not 0 <= d < n), None)
        if wrong is not None:
            raise InputError(None, "devices", f"{wrong!r} is not a device of the instance", f"use 0..{n - 1}")
        new = frozenset(int(d) for d in given)
        again = sorted(new & self._failed)
        if again:
            raise InputError(None, "devices", f"device {again[0]} has already failed",
                             "report each failure once (Planner.failed lists them)")
        if next_fault_s is not None and not next_fault_s > 0:
            raise InputError(None, "next_fault_s", f"got {next_fault_s!r}", "give a positive number of seconds")
        failed = self._failed | new
        state = dataclasses.replace(self._base, plan=self._layout, failed_devices=failed)
        try:
            result = plan_recovery(state, failed, dataclasses.replace(self.options, next_fault_s=next_fault_s))
        except UnrecoverableError as error:
            raise with_stale_copies(error, self._layouts, state, failed) from None
        self._failed = failed
        self._current = result.plan
        self._layout = dataclasses.replace(result.plan, rerouted=())
        self._layouts.append(self._layout)
        return result

    def on_join(self, devices: Iterable[int], next_fault_s: float | None = None) -> RecoveryDecision:
        """Failed `devices` are back in service, holding no model state (a restarted process, a
        repaired or replaced accelerator). The decision (`rejoin.plan_join`, Eq. 8 like a failure's)
        is among keep-running (they idle and still count as out of the plan: a later on_join may
        bring them in), taking back the slots whose work is rerouted (their state copied), and
        scaling up over every live device (state migrated to them from its live holders).

        Raises InputError for a device that has not failed and InfeasibleError when no candidate is
        usable. On an error the planner's state is unchanged."""
        given = list(devices)
        if not given:
            raise InputError(None, "devices", "no joining device given", "pass the ids of the devices that came back")
        wrong = next((d for d in given if isinstance(d, bool) or not isinstance(d, Integral) or d not in self._failed),
                     None)
        if wrong is not None:
            raise InputError(None, "devices", f"{wrong!r} has not failed", f"pass failed devices ({sorted(self._failed)})")
        if next_fault_s is not None and not next_fault_s > 0:
            raise InputError(None, "next_fault_s", f"got {next_fault_s!r}", "give a positive number of seconds")
        joined = frozenset(int(d) for d in given)
        state = dataclasses.replace(self._base, plan=self._layout, failed_devices=self._failed)
        decision = plan_join(state, self._current, self._failed, joined,
                             dataclasses.replace(self.options, next_fault_s=next_fault_s))
        if decision.policy == "keep-running":
            return decision
        self._failed = decision.failed
        self._current = decision.plan
        self._layout = dataclasses.replace(decision.plan, rerouted=())
        self._layouts.append(self._layout)
        return decision
