"""The rerouting MILP: the paper's numbers, beating the even split, infeasibility and memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chameleon_opt.check import check_plan
from chameleon_opt.instance.load import build_instance, load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.reroute import reroute_plan
from chameleon_opt.solve.result import Status

INSTANCES = Path(__file__).resolve().parents[1] / "instances"


def test_one_failure_matches_eq12():
    instance = load_instance(INSTANCES / "paper-example.json")
    result = reroute_plan(instance, frozenset({4}), Deadline.after(5.0))
    assert result.status is Status.OPTIMAL
    assert PerfModel(instance).evaluate(result.solution, frozenset({4})).iteration_time_s == pytest.approx(35 + 25 / 3)


@pytest.mark.parametrize("name,failed", [("paper-example", {4, 5}), ("paper-32", {6, 13})])
def test_decided_shares_beat_the_even_split_when_failures_hit_different_stages(name, failed):
    instance = load_instance(INSTANCES / f"{name}.json")
    failed = frozenset(failed)
    model = PerfModel(instance)
    result = reroute_plan(instance, failed, Deadline.after(5.0), model=model)
    assert result.status is Status.OPTIMAL
    assert check_plan(instance, result.solution, failed, require_tp_in_node=False).ok
    mine = model.evaluate(result.solution, failed).iteration_time_s
    even = model.evaluate(even_reroute(instance.plan, failed), failed).iteration_time_s
    assert mine < even * 0.95


def test_stage_without_replica_is_infeasible_with_reason():
    instance = load_instance(INSTANCES / "paper-example.json")
    result = reroute_plan(instance, frozenset({1, 4, 7, 10}), Deadline.after(5.0))
    assert result.status is Status.INFEASIBLE and "lost every replica" in result.reason


def test_peer_memory_limits_the_shares():
    """Block 2 keeps 0.4 GiB per in-flight micro-batch on 1 GiB devices: a peer can hold 2 in flight
    at stage 1, so it may not take rerouted work beyond its own; the failed pipeline's micro-batches
    must move to other pipelines instead, and the plan must fit."""
    data = json.loads((INSTANCES / "paper-example.json").read_text())
    data["workload"]["inline"]["layer_bytes"]["activation_bytes_per_sample"] = [0, 0, 430_000_000, 0, 0]
    instance = build_instance(data, "<tight>")
    failed = frozenset({4})
    result = reroute_plan(instance, failed, Deadline.after(5.0))
    assert result.status is Status.OPTIMAL
    estimate = PerfModel(instance).evaluate(result.solution, failed)
    assert estimate.memory_ok
    assert not PerfModel(instance).evaluate(even_reroute(instance.plan, failed), failed).memory_ok
