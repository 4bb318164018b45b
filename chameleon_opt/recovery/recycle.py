"""ReCycle (SOSP'24) as a baseline policy. Its code is not public; the mechanisms follow the paper's
abstract and overview (arXiv 2405.14009): each is marked with what it rests on.

- Uniform start: the job's own uniform layout; ReCycle never re-plans it (overview: it "keeps
  the parallel configuration").
- Rerouting to data-parallel peers: a failed stage's micro-batches run on the same stage of the
  other pipelines, which hold the same parameters (abstract), as whole micro-batches (the unit
  its schedules move).
- Bubble filling: the backward is split into input- and weight-gradient phases and rerouted work
  is placed into the pipeline bubbles by a MILP schedule (abstract: "decoupled back-propagation",
  "MILP-based schedule generation"); here the CP-SAT model of `solve/bubbles.py` with each
  peer's activation memory as a limit, or, past its size, the floor no filling can beat (which
  never undersells ReCycle).
- A stage that lost every replica cannot be rerouted: checkpoint-restart (not described in what
  is public; the configurable restart of `CheckpointRestart`).
- Transition ~ 0: the peers pick the work up in the next iteration (the in-flight one is redone:
  one lost iteration, as Oobleck's simulator charges its own reconfigurations).
- Repaired devices rejoin their own slot (the overview says ReCycle handles re-joining): their
  stage's state is copied from a peer.
"""

from __future__ import annotations

from chameleon_opt.errors import InfeasibleError
from chameleon_opt.recovery.interface import (CHECKPOINT_INTERVAL_S, RESTART_S, SEARCH_TIME_LIMIT_S, Policy,
                                              PolicyState, Response, restart_response)
from chameleon_opt.solve.bubbles import rerouted_step


class ReCycle(Policy):
    """Bubble-filled rerouting of whole micro-batches on the uniform layout; restart otherwise."""

    name = "recycle"

    def __init__(self, restart_s: float = RESTART_S, checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
                 time_limit_s: float = SEARCH_TIME_LIMIT_S) -> None:
        super().__init__()
        self.restart_s, self.interval_s, self.time_limit_s = restart_s, checkpoint_interval_s, time_limit_s

    def _respond(self, state: PolicyState) -> Response:
        if state.kind == "start":
            return self.start(state)
        model = self.model(state.instance)
        try:
            rerouted = rerouted_step(model, state.layout, state.dead, self.deadline(self.time_limit_s), self.solver)
        except (InfeasibleError, ValueError) as error:
            return restart_response(self, state, f"ReCycle cannot reroute ({error})", self.restart_s,
                                    self.interval_s / 2, self.time_limit_s)
        lost_iteration = model.evaluate(state.layout).iteration_time_s
        if state.kind == "repair":
            return Response(rerouted.plan, rerouted.step_s, self.rejoin_cost_s(state, state.layout),
                            "repaired devices rejoin their slots (state copied from a peer)", "rejoin")
        return Response(rerouted.plan, rerouted.step_s, lost_iteration,
                        f"rerouted to data-parallel peers: {rerouted.how}; one lost iteration",
                        "reroute")
