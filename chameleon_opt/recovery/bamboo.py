"""Bamboo (NSDI'23) as a baseline policy, from its code (uclasystem/bamboo) and the Bamboo model in
Oobleck's simulator (SymbioticLab/Oobleck, sosp23-artifact, tools/simulator/bamboo_simulator.py).

- Redundant computation: each stage holds a copy of its successor stage (s + 1 mod S)
  (`deepspeed/runtime/pipe/redundancy.py`, redundancy level 1); with failures absent the
  redundant work costs throughput: Oobleck's Bamboo model keeps 1 - 0.1971 of the time useful
  (`redundant_ratio`), i.e. a step 1 / 0.8029 = 1.245x the plain one.
- Failover: the failed stage's predecessor takes over its coordinate and runs both stages'
  commands with one optimizer step (`engine.py` check_preemptions, NextStageFailoverSchedule);
  steps then run `fallback_slowdown` = 1.5x slower (Bamboo's simulator.py) until reconfiguration.
- Costs: a local rendezvous per failover (Bamboo's simulator: 20 s for GPT-2/BERT-sized models;
  Oobleck's Bamboo model: 76-450 s by size, the larger of the two is not assumed: 20 s is used,
  the cost least favourable to us) and one lost iteration.
- Consecutive failures (a stage and its replica holder) are fatal in Bamboo (FIXME in
  engine.py; simulator.py: a global rendezvous, 30 s): a fresh plan over the survivors (our
  search, as the stand-in for Bamboo's re-planning), 30 s + the state copy.
- Repairs: a node joins at the next reconfiguration (provisioning 45 s in both simulators); here
  the repaired devices take their stages back (state copied), ending the fallback slowdown.
"""

from __future__ import annotations

from chameleon_opt.recovery.interface import SEARCH_TIME_LIMIT_S, Policy, PolicyState, Response, cached_search, \
    restart_response
from chameleon_opt.decision import lost_layers, migration_lower_bound_s

USEFUL_FRACTION = 1 - 0.1971
FALLBACK_SLOWDOWN = 1.5
LOCAL_RENDEZVOUS_S = 20.0
GLOBAL_RENDEZVOUS_S = 30.0


class Bamboo(Policy):
    """Redundant computation always; predecessor takeover at 1.5x; global rendezvous when fatal."""

    name = "bamboo"

    def __init__(self, time_limit_s: float = SEARCH_TIME_LIMIT_S) -> None:
        super().__init__()
        self.time_limit_s = time_limit_s

    def plain_step(self, state: PolicyState, plan, dead: frozenset[int]) -> float:
        return self.model(state.instance).evaluate(plan, dead).iteration_time_s

    @staticmethod
    def fatal(model, layout, dead: frozenset[int]) -> bool:
        """A failed stage whose predecessor (its replica holder) failed too, or a whole pipeline."""
        failed = model.failed_slots(layout, dead)
        for j, s in failed:
            stages = len(layout.pipelines[j].stages)
            if stages == 1 or (j, (s - 1) % stages) in failed:
                return True
        return False

    def _respond(self, state: PolicyState) -> Response:
        model = self.model(state.instance)
        layout = state.layout
        redundant = 1 / USEFUL_FRACTION
        if state.kind == "start":
            step = self.plain_step(state, layout, state.dead) * redundant
            return Response(layout, step, 0.0, f"redundant successor stages: {100 * (redundant - 1):.1f}% over "
                            "failure-free (Oobleck's Bamboo model)", "start")
        failed = model.failed_slots(layout, state.dead)
        healthy = self.plain_step(state, layout, frozenset()) * redundant
        if state.kind == "repair":
            step = healthy if not failed else healthy * FALLBACK_SLOWDOWN
            return Response(layout, step, self.rejoin_cost_s(state, layout), "repaired devices take their stages "
                            "back (state copied)", "rejoin")
        lost_iteration = healthy
        if not self.fatal(model, layout, state.dead):
            return Response(layout, healthy * FALLBACK_SLOWDOWN, LOCAL_RENDEZVOUS_S + lost_iteration,
                            f"predecessor takes over: {FALLBACK_SLOWDOWN}x slower steps (Bamboo's fallback_slowdown), "
                            f"local rendezvous {LOCAL_RENDEZVOUS_S:.0f} s + one lost iteration", "takeover")
        if lost_layers(state.instance, state.dead):
            return restart_response(self, state, "some layer lost every replica")
        result, _ = cached_search(state.instance, state.dead, self.time_limit_s, model, options=self.solver)
        if result.solution is None:
            return restart_response(self, state, f"Bamboo cannot re-plan ({result.reason})")
        step = model.evaluate(result.solution, state.dead).iteration_time_s * redundant
        copy = migration_lower_bound_s(model, layout, result.solution, state.dead)
        return Response(result.solution, step, GLOBAL_RENDEZVOUS_S + copy + lost_iteration,
                        f"a stage and its replica holder are both down: global rendezvous {GLOBAL_RENDEZVOUS_S:.0f} s "
                        f"+ state copy {copy:.2f} s + one lost iteration, fresh plan", "reconfigure", fallback=True)


__all__ = ["Bamboo"]
