"""Checkpoint-restart: on a failure, lose the work since the last checkpoint (expected half an
interval, `checkpoint_interval_s` = 30 min, counted as dead time: that work is redone) plus a
restart (`restart_s` = 10 min: rescheduling, container start, loading the checkpoint), then train
on the survivors with a fresh plan (`search_plan`, inside the restart time). A repair costs no
restart: the devices join at the next one."""

from __future__ import annotations

from chameleon_opt.recovery.interface import (CHECKPOINT_INTERVAL_S, RESTART_S, SEARCH_TIME_LIMIT_S, Policy,
                                              PolicyState, Response, restart_response)


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
