"""Eq. 8 selection, the unrecoverable case, and the independent checker rejecting broken plans."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from chameleon_opt.check import PlanRejected, assert_sound, check_plan
from chameleon_opt.errors import UnrecoverableError
from chameleon_opt.instance.load import load_instance
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.decision import break_even_next_fault, decide, eq8_score, expected_score
from chameleon_opt.solve.deadline import Deadline

EXAMPLE = Path(__file__).resolve().parents[1] / "instances" / "paper-example.json"


def test_eq8_break_even_example():
    """B=10; reroute 2 s/step, no transition; dynamic 1 s/step after 10 s: break-even D = 20 s."""
    assert break_even_next_fault(2.0, 1.0, 10.0) == pytest.approx(20.0)
    assert eq8_score(10, 2.0, 0.0, 20.0) == pytest.approx(eq8_score(10, 1.0, 10.0, 20.0))
    assert eq8_score(10, 2.0, 0.0, 15.0) > eq8_score(10, 1.0, 10.0, 15.0)   # D=15: rerouting
    assert eq8_score(10, 2.0, 0.0, 40.0) < eq8_score(10, 1.0, 10.0, 40.0)   # D=40: reconfiguration
    assert eq8_score(10, 1.0, 10.0, 10.0) == 0.0                           # D <= transition: unusable


def test_expected_score_is_the_mean_of_eq8_over_exponential_d():
    import numpy as np
    rng = np.random.default_rng(0)
    mean, tau = 100.0, 30.0
    draws = rng.exponential(mean, 400_000)
    empirical = np.maximum(draws - tau, 0).mean() / draws.mean() * 10 / 1.0
    assert expected_score(10, 1.0, tau, mean) == pytest.approx(empirical, rel=0.01)


def test_decide_picks_by_next_fault_time():
    instance = load_instance(EXAMPLE)
    # With a fault due before the switch could even complete, rerouting (no transition) wins; the
    # reconfiguration's transition is its search, migration and the rebuild of the groups it changes.
    short = decide(instance, instance.failed_devices, deadline=Deadline.after(10.0), next_fault_s=0.5)
    long = decide(instance, instance.failed_devices, deadline=Deadline.after(10.0), next_fault_s=7200.0)
    assert short.policy == "reroute"
    assert long.policy == "hybrid"  # the reconfigured plan, reached while rerouting in the meantime
    assert all(c.feasible for c in long.candidates)
    scores = {c.policy: c.score for c in long.candidates}
    assert scores["hybrid"] >= scores["reconfigure"]


def test_hybrid_rate_closed_forms():
    from chameleon_opt.decision import hybrid_samples_per_s
    # Point D: 10 s rerouted at 5 samples/s, 5 s pause, 25 s at 10 samples/s over D = 40 s.
    assert hybrid_samples_per_s(10, 2.0, 1.0, 10.0, 5.0, 40.0, None) == pytest.approx((50 + 250) / 40)
    import numpy as np
    draws = np.random.default_rng(1).exponential(60.0, 400_000)
    empirical = (5 * np.minimum(draws, 10) + 10 * np.maximum(draws - 15, 0)).mean() / draws.mean()
    assert hybrid_samples_per_s(10, 2.0, 1.0, 10.0, 5.0, None, 60.0) == pytest.approx(empirical, rel=0.01)


def test_layer_without_surviving_replica_is_unrecoverable():
    instance = load_instance(EXAMPLE)
    with pytest.raises(UnrecoverableError, match="checkpoint"):
        decide(instance, frozenset({1, 4, 7, 10}), deadline=Deadline.after(10.0))


def test_rerouting_infeasible_when_a_stage_lost_every_replica_reason():
    instance = load_instance(EXAMPLE)
    decision = decide(instance, frozenset({1, 4, 7}), policy="reroute", deadline=Deadline.after(10.0))
    assert decision.candidates[0].feasible  # one replica of stage 1 survives


def _broken(plan: Plan, **changes) -> Plan:
    return dataclasses.replace(plan, **changes)


def test_checker_accepts_the_instance_plan_and_rejects_broken_ones():
    instance = load_instance(EXAMPLE)
    plan = instance.plan
    assert check_plan(instance, plan).ok
    first = plan.pipelines[0]
    gap = Pipeline((Stage((0,), 0, 2), Stage((1,), 3, 5)), first.micro_batches)         # layer 2 unowned
    twice = Pipeline((Stage((0,), 0, 2), Stage((3,), 2, 3), Stage((2,), 3, 5)), first.micro_batches)
    cases = {
        "do not follow": _broken(plan, pipelines=(gap,) + plan.pipelines[1:]),
        "used twice": _broken(plan, pipelines=(twice,) + plan.pipelines[1:]),
        "micro-batches assigned": _broken(plan, pipelines=(dataclasses.replace(first, micro_batches=4),)
                                          + plan.pipelines[1:]),
        "does not exist": _broken(plan, pipelines=(Pipeline((Stage((99,), 0, 2), Stage((1,), 2, 3),
                                                            Stage((2,), 3, 5)), 5),) + plan.pipelines[1:]),
    }
    for expected, broken in cases.items():
        report = check_plan(instance, broken)
        assert not report.ok and any(expected in v for v in report.violations), (expected, report)
        with pytest.raises(PlanRejected):
            assert_sound(instance, broken)
    # a failed device left in the plan without rerouting its work
    assert not check_plan(instance, plan, frozenset({4})).ok


def test_checker_rejects_memory_overflow():
    instance = load_instance(Path(__file__).resolve().parents[1] / "instances" / "paper-example.json")
    data = instance.spec.model_dump()
    inline = data["workload"]["inline"]
    inline["layer_bytes"]["params"] = [0, 10 ** 9, 10 ** 9, 10 ** 9, 0]  # 16 GB of state per block
    from chameleon_opt.instance.load import build_instance
    heavy = build_instance(data, "<heavy>")
    report = check_plan(heavy, heavy.plan)
    assert not report.ok and "GiB >" in report.violations[0]
