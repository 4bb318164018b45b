"""The demo's JSON: exactly-once per step (not one boolean) and the final parameters' largest
difference from the failure-free run."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from chameleon_opt.runtime.controller import RunReport  # noqa: E402
from chameleon_opt.runtime.report import report_json  # noqa: E402


def run(once: list[bool], weight: float) -> RunReport:
    return RunReport(losses=[2.0, 1.5, 1.0], step_times_s=[0.1] * 3, recoveries=[], generations=[], events=[],
                     samples_exactly_once=once, final_layers={0: {"w": [1.0, weight]}, 1: {"b": [0.5]}},
                     replica_max_diff=0.0, dead=())


def test_exactly_once_per_step_and_final_parameters_against_failure_free() -> None:
    payload = report_json(run([True, False, True], 2.25), run([True] * 3, 2.0), global_batch=16)
    assert payload["samples_exactly_once"] == [True, False, True]   # the step that broke it is visible
    assert payload["final_parameters_max_difference"] == pytest.approx(0.25)
    alone = report_json(run([True] * 3, 2.0), None, global_batch=16)
    assert alone["final_parameters_max_difference"] is None and alone["max_relative_loss_difference"] is None
