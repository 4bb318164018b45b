"""Failure-trace simulator and recovery baselines on the paper's 32-GPU instance (GPT-3 7.5B, TP 2 x
PP 4 x DP 4 on 4 x 8 A100-40): reproducibility, accounting, cascades, fallbacks, Eq. 8."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chameleon_opt.instance.load import load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.recovery.ablations import EvenRerouteAblation, RedundancyAblation, TemplatesAblation
from chameleon_opt.recovery.chameleon import Chameleon, Choice, DecisionSource, best_choice
from chameleon_opt.recovery.checkpoint import CheckpointRestart
from chameleon_opt.recovery.interface import Policy, PolicyState, Response
from chameleon_opt.recovery.registry import POLICIES, make_policy
from chameleon_opt.decision import GROUP_REBUILD_S, break_even_next_fault
from chameleon_opt.recovery.simulate import (PUBLISHED_RATES, fixed_trace, load_trace, parse_trace, plot_timeline,
                                             published_rate_trace, simulate, simulate_policies, synthetic_trace,
                                             trace_to_json, with_failure_rate)

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 1.0      # limit of each whole decision inside the tests (reroute, search, communication)
CHARGE = 0.5     # fixed search charge: makes runs reproducible (the measured time varies)


@pytest.fixture(scope="module")
def paper32():
    return with_failure_rate(load_instance(ROOT / "instances" / "paper-32.json"), 40.0)


@pytest.fixture(scope="module")
def source():
    """decide() results shared by the Chameleon family across the module's tests."""
    return DecisionSource(LIMIT)


def family(source, name):
    return make_policy(name, time_limit_s=LIMIT, search_charge_s=CHARGE, source=source)


def free_step(instance) -> float:
    return PerfModel(instance).evaluate(instance.plan).iteration_time_s


def slot_devices(pipeline: int, stage: int) -> tuple[int, int]:
    """paper-32's regular layout: TP innermost, then 4 stages, then 4 pipelines."""
    first = 8 * pipeline + 2 * stage
    return first, first + 1


# -- traces ------------------------------------------------------------------------------------------
def test_synthetic_trace_is_seeded_and_well_formed():
    a = synthetic_trace(32, 40.0, 8 * 3600, seed=7, repair_hours=1.0)
    assert a == synthetic_trace(32, 40.0, 8 * 3600, seed=7, repair_hours=1.0)
    assert a != synthetic_trace(32, 40.0, 8 * 3600, seed=8, repair_hours=1.0)
    assert [e.time_s for e in a] == sorted(e.time_s for e in a)
    dead: set[int] = set()
    for e in a:  # failures hit live devices; repairs come back an hour later
        if e.kind == "fail":
            assert not dead & set(e.devices)
            dead |= set(e.devices)
        else:
            assert set(e.devices) <= dead
            dead -= set(e.devices)
            assert any(f.kind == "fail" and f.devices == e.devices and abs(f.time_s + 3600 - e.time_s) < 1e-6
                       for f in a)


def test_published_rates_match_the_reports():
    llama = published_rate_trace("llama3", 16384, 54 * 86400, seed=1)
    assert abs(len(llama) - 419) < 4 * math.sqrt(419)  # Poisson: 419 expected
    opt = published_rate_trace("opt175b", 1024, 20 * 86400, seed=2)
    assert abs(len(opt) - 40) < 4 * math.sqrt(40) and all(len(e.devices) == 8 for e in opt)
    assert PUBLISHED_RATES["llama3"].mtbf_hours_per_unit == pytest.approx(50677, rel=1e-4)  # the instances' MTBF


def test_trace_json_round_trip(tmp_path, paper32):
    trace = fixed_trace([100.0, 200.0], [13, (4, 5)], repairs=[(300.0, (13,))])
    path = tmp_path / "trace.json"
    import json
    path.write_text(json.dumps(trace_to_json(trace)))
    assert load_trace(path) == trace
    loaded, _ = parse_trace(str(path), paper32, 1000.0)
    assert loaded == trace
    synthetic, mtbf = parse_trace("synthetic:mtbf_hours=10,seed=3", paper32, 3600.0)
    assert mtbf == 10.0 and synthetic == synthetic_trace(32, 10.0, 3600.0, 3)


# -- accounting --------------------------------------------------------------------------------------
def test_no_failure_equals_failure_free_except_bamboo(paper32, source):
    free = paper32.spec.training.global_batch / free_step(paper32)
    for name in POLICIES:
        result = simulate(paper32, [], family(source, name), 3600.0)
        if name in ("bamboo", "redundancy-ablation"):
            assert result.average_throughput < free * 0.95  # the redundant forward costs even with no failure
        elif name == "oobleck":  # starts on its own node-unit instantiation, not on the instance's layout
            assert result.average_throughput == pytest.approx(
                paper32.spec.training.global_batch / result.start_step_s, rel=1e-12)
        else:
            assert result.average_throughput == pytest.approx(free, rel=1e-12), name
        assert result.num_transitions == 0 and result.time_in_transition_s == 0
    zero = simulate(paper32, [], RedundancyAblation(redundancy=0.0), 3600.0)
    assert zero.average_throughput == pytest.approx(free, rel=1e-12)


def test_samples_equal_the_integral_of_throughput(paper32, source):
    batch, horizon, t = paper32.spec.training.global_batch, 3000.0, 1000.0
    failed = frozenset({13})
    model = PerfModel(paper32)
    s0 = free_step(paper32)
    s1 = model.evaluate(even_reroute(paper32.plan, failed), failed).iteration_time_s
    recycle = simulate(paper32, fixed_trace([t], [13]), EvenRerouteAblation(), horizon)
    assert recycle.samples == pytest.approx(batch / s0 * t + batch / s1 * (horizon - t), rel=1e-12)
    hybrid = simulate(paper32, fixed_trace([t], [13]), family(source, "hybrid"), horizon)
    record = hybrid.transitions[0]
    decision = source.decision(dataclasses.replace(paper32, failed_devices=failed), failed)
    rr, rc = (next(c for c in decision.candidates if c.policy == name) for name in ("reroute", "reconfigure"))
    # the switch pauses for the rebuild of the process groups the reconfiguration changes
    assert record.action == "hybrid" and record.transition_s == pytest.approx(rc.rebuild_s)
    assert 0 < rc.rebuild_s <= GROUP_REBUILD_S
    expected = (batch / s0 * t + batch / rr.iteration_time_s * record.interim_s
                + batch / rc.iteration_time_s * (horizon - t - record.interim_s - rc.rebuild_s))
    assert hybrid.samples == pytest.approx(expected, rel=1e-12)
    for result in (recycle, hybrid):  # segments tile [0, horizon]; the rate integral is the sample count
        assert result.segments[0].start_s == 0 and result.segments[-1].end_s == horizon
        assert all(a.end_s == b.start_s for a, b in zip(result.segments, result.segments[1:]))
        grid = sorted({s.start_s for s in result.segments} | {horizon})
        integral = sum(result.throughput_at((a + b) / 2) * (b - a) for a, b in zip(grid, grid[1:]))
        assert integral == pytest.approx(result.samples, rel=1e-12)
        assert result.average_throughput == pytest.approx(result.samples / horizon)


class Fixed(Policy):
    """A stub: step grows with the dead count; fixed transition (exercises the simulator alone)."""

    name = "fixed"

    def __init__(self, transition_s: float) -> None:
        super().__init__()
        self.transition_s = transition_s

    def _respond(self, state: PolicyState) -> Response:
        step = 1.0 + len(state.dead)
        return Response(state.layout, step, 0.0 if state.kind == "start" else self.transition_s, "stub",
                        "start" if state.kind == "start" else "reconfigure")


@settings(max_examples=30, deadline=None)
@given(times=st.lists(st.floats(0, 1000), max_size=6), transition=st.floats(0, 200),
       devices=st.lists(st.integers(0, 31), min_size=6, max_size=6))
def test_simulator_invariants(paper32, times, transition, devices):
    trace = fixed_trace(times, devices[:len(times)])
    result = simulate(paper32, trace, Fixed(transition), 1000.0)
    batch = paper32.spec.training.global_batch
    assert result.segments[0].start_s == 0 and result.segments[-1].end_s == 1000.0
    assert all(a.end_s == b.start_s for a, b in zip(result.segments, result.segments[1:]))
    assert 0 <= result.samples <= batch * 1000.0 + 1e-6
    assert result.time_in_transition_s <= 1000.0 + 1e-9
    assert result.samples == pytest.approx(sum(s.samples_per_s * (s.end_s - s.start_s) for s in result.segments))


def test_seeded_trace_gives_reproducible_results(paper32):
    """Reproducible on a busy machine too: each run's decisions on deterministic deadlines (a fresh
    source, so no cache is shared); with wall-clock ones a loaded CI box may cut a search elsewhere."""
    from chameleon_opt.recovery.chameleon import DecisionSource
    from chameleon_opt.solve.backends import SolverOptions

    trace = synthetic_trace(32, 40.0, 4 * 3600, seed=1)
    assert len(trace) >= 2
    for name in ("chameleon", "recycle", "oobleck", "bamboo"):
        runs = [simulate(paper32, trace, make_policy(name, time_limit_s=LIMIT, search_charge_s=CHARGE,
                                                     source=DecisionSource(LIMIT, SolverOptions(deterministic=True))),
                         4 * 3600)
                for _ in range(2)]
        assert runs[0].samples == runs[1].samples, name
        assert [t.to_json() for t in runs[0].transitions] == [t.to_json() for t in runs[1].transitions], name


# -- cascades, repairs, fallbacks --------------------------------------------------------------------
def test_failure_during_a_transition_is_handled(paper32):
    batch = paper32.spec.training.global_batch
    policy = CheckpointRestart(checkpoint_interval_s=1800, restart_s=600, time_limit_s=LIMIT)
    result = simulate(paper32, fixed_trace([1000.0, 1500.0], [13, 5]), policy, 5000.0)
    first, second = result.transitions
    assert first.interrupted and not second.interrupted and result.cascades == 1
    assert first.transition_s == second.transition_s == 600 + 900
    # no training from the first failure until the second restart ends, at 1500 + 1500
    assert result.throughput_at(1200) == result.throughput_at(2999) == 0.0
    assert result.time_in_transition_s == pytest.approx(2000.0)
    assert result.samples == pytest.approx(batch / free_step(paper32) * 1000 + batch / second.step_s * 2000)


def test_cascade_restarts_the_decision_from_the_committed_layout(paper32, source):
    policy = family(source, "reconfigure-only")
    result = simulate(paper32, fixed_trace([100.0, 102.0], [13, 5]), policy, 600.0)
    first, second = result.transitions
    assert first.interrupted and second.action == "reconfigure"
    direct = source.decision(dataclasses.replace(paper32, failed_devices=frozenset({5, 13})), frozenset({5, 13}))
    rc = next(c for c in direct.candidates if c.policy == "reconfigure")
    assert second.step_s == rc.iteration_time_s  # decided from the original layout, both devices down


def test_repair_during_a_transition_is_deferred(paper32):
    policy = CheckpointRestart(restart_s=600, checkpoint_interval_s=0, time_limit_s=LIMIT)
    trace = fixed_trace([100.0], [13], repairs=[(200.0, (13,))])
    result = simulate(paper32, trace, policy, 3000.0)
    fail, repair = result.transitions
    assert repair.trigger == "repair" and repair.time_s == pytest.approx(700.0)  # after the 600 s restart
    assert not fail.interrupted


def test_repair_rejoins_the_layout(paper32):
    trace = fixed_trace([100.0], [13], repairs=[(1000.0, (13,))])
    result = simulate(paper32, trace, EvenRerouteAblation(), 3000.0)
    fail, repair = result.transitions
    assert fail.action == "reroute" and repair.action == "rejoin" and repair.transition_s > GROUP_REBUILD_S
    assert result.final_step_s == pytest.approx(free_step(paper32))


def test_chameleon_decides_a_repair_by_the_join_candidates(paper32, source):
    """The adaptive policy weighs what `plan_join` weighs (keep-running, rejoin-slots, scale-up) and
    counts the transition it picks."""
    trace = fixed_trace([100.0], [13], repairs=[(1000.0, (13,))])
    result = simulate(paper32, trace, family(source, "chameleon"), 3000.0)
    fail, repair = result.transitions
    assert "keep-running" in repair.notes and "scale-up" in repair.notes
    assert repair.action in ("rejoin", "reconfigure") and repair.transition_s > GROUP_REBUILD_S
    assert result.final_step_s < fail.step_s


def test_a_repaired_device_kept_out_is_offered_again(paper32, source):
    """With the next fault 4 s away no transition pays (the group rebuild alone takes 5 s): the
    repaired device stays idle and down, and the next repair brings it back with its own."""
    failures = paper32.spec.failures.model_copy(update={"next_fault_s": 4.0})
    soon = dataclasses.replace(paper32, spec=paper32.spec.model_copy(update={"failures": failures}))
    trace = fixed_trace([100.0, 200.0], [13, 5], repairs=[(1000.0, (13,)), (2000.0, (5,))])
    result = simulate(soon, trace, family(source, "chameleon"), 3000.0)
    repairs = [t for t in result.transitions if t.trigger == "repair"]
    assert [(t.devices, t.action, t.transition_s) for t in repairs] == [((13,), "stay", 0.0), ((5, 13), "stay", 0.0)]


def test_recycle_falls_back_when_a_stage_loses_every_replica(paper32):
    stage2 = tuple(slot_devices(j, 2)[0] for j in range(4))  # stage 2 of every pipeline, at once
    result = simulate(paper32, fixed_trace([100.0], [stage2]), EvenRerouteAblation(time_limit_s=LIMIT), 6000.0)
    (last,) = result.transitions
    assert last.action == "restart" and last.fallback and result.fallbacks == 1
    assert "ReCycle cannot reroute" in last.notes and "lost every replica" in last.notes
    assert last.transition_s == 600 + 900
    assert math.isfinite(last.step_s) and result.final_step_s == last.step_s  # restarted on the survivors
    # one at a time, the third loss already overflows the last peer's memory: also a reported fallback
    one_by_one = simulate(paper32, fixed_trace([100.0, 200.0, 300.0], stage2[:3]), EvenRerouteAblation(time_limit_s=LIMIT),
                          6000.0)
    assert [t.action for t in one_by_one.transitions] == ["reroute", "reroute", "restart"]
    assert "overflows" in one_by_one.transitions[-1].notes and one_by_one.fallbacks == 1


# -- policies ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 2])
def test_hybrid_never_loses_to_both_pure_policies(paper32, source, seed):
    """Seed 0's trace has four failures (the hybrid reconfigures at one, reroute-only falls back to
    reconfiguring at two), seed 2's three (the hybrid reconfigures at the third). Seeds 1 and 3
    (two failures, each policy's own action at both) took the same paths: they added 4 s, no case."""
    horizon = 2 * 3600.0
    trace = synthetic_trace(32, 24.0, horizon, seed=seed)
    averages = {name: simulate(paper32, trace, family(source, name), horizon).average_throughput
                for name in ("hybrid", "reroute-only", "reconfigure-only")}
    assert averages["hybrid"] >= min(averages["reroute-only"], averages["reconfigure-only"]) * (1 - 1e-9), averages
    assert averages["hybrid"] >= averages["reconfigure-only"] * (1 - 1e-9), averages


def _choices(reroute_step: float, reconfigure_step: float, transition: float) -> list[Choice]:
    from chameleon_opt.decision import RecoveryOption
    return [Choice("reroute", RecoveryOption("reroute", True, ""), reroute_step, 0.0),
            Choice("reconfigure", RecoveryOption("reconfigure", True, ""), reconfigure_step, transition)]


def test_eq8_break_even_example():
    """B = 10; rerouting 2 s/step with no transition, reconfiguration 1 s/step after 10 s."""
    choices = _choices(2.0, 1.0, 10.0)
    assert break_even_next_fault(2.0, 1.0, 10.0) == pytest.approx(20.0)
    assert best_choice(choices, 10, 15.0, None)[0].name == "reroute"
    assert best_choice(choices, 10, 40.0, None)[0].name == "reconfigure"
    _, scores = best_choice(choices, 10, 20.0, None)
    assert scores["reroute"] == pytest.approx(scores["reconfigure"]) == pytest.approx(5.0)


def test_chameleon_policy_applies_eq8_to_those_numbers(paper32):
    choices = _choices(2.0, 1.0, 10.0)
    policy = Chameleon()
    for d, expected in ((15.0, "reroute"), (40.0, "reconfigure")):
        failures = paper32.spec.failures.model_copy(update={"next_fault_s": d})
        instance = dataclasses.replace(paper32, spec=paper32.spec.model_copy(update={"failures": failures}))
        chosen, _ = policy.choose(PolicyState(instance, frozenset({13}), "fail", frozenset({13})), choices)
        assert chosen.name == expected


@pytest.mark.parametrize("failed", [frozenset({13}), frozenset({24, 25}), frozenset({0, 8, 16})])
def test_chameleon_decides_as_the_product(paper32, failed):
    """With the instance's fault statistics and the measured search charged, the simulated policy
    takes decide()'s own choice, at decide()'s step and transition: the bench measures what ships."""
    policy = Chameleon(source=DecisionSource(LIMIT))
    state = PolicyState(dataclasses.replace(paper32, failed_devices=failed), failed, "fail", failed)
    response = policy.respond(state)
    decision = policy.source.decision(state.instance, failed)
    assert decision.chosen is not None and response.action == decision.policy
    assert response.plan == decision.chosen.plan
    assert response.step_s == decision.chosen.iteration_time_s
    assert response.transition_s == pytest.approx(decision.chosen.transition_s, abs=1e-9)


def test_a_checker_rejection_propagates(paper32, monkeypatch):
    """A plan the checker rejects is a bug: the simulator reports it, it does not swap in another plan."""
    from chameleon_opt.check import PlanRejected
    from chameleon_opt.recovery import chameleon

    def rejected(*args, **kwargs):
        raise PlanRejected("reroute", ("stage 0 over memory",))

    monkeypatch.setattr(chameleon, "decide", rejected)
    failed = frozenset({13})
    state = PolicyState(dataclasses.replace(paper32, failed_devices=failed), failed, "fail", failed)
    with pytest.raises(PlanRejected):
        Chameleon(source=DecisionSource(LIMIT)).respond(state)


def test_oobleck_and_bamboo_shapes(paper32):
    oobleck = TemplatesAblation()
    shares = oobleck.proportional_shares([1.0, 2.0, 1.0], 10)
    assert sum(shares) == 10 and shares[1] >= shares[0]
    plan, step = oobleck.instantiate(paper32, frozenset({13}))
    assert 13 not in plan.devices and plan.total_micro_batches == paper32.global_micro_batches
    assert len(plan.devices) == 30  # every surviving TP group is used
    bamboo = RedundancyAblation()
    base = bamboo.step(paper32, paper32.plan, frozenset())
    after = bamboo.step(paper32, paper32.plan, frozenset({13}))
    assert free_step(paper32) < base < after
    assert bamboo.step(paper32, paper32.plan, frozenset({13, slot_devices(1, 1)[0]})) is None  # holder down too


def test_simulate_policies_and_plot(tmp_path, paper32):
    trace = fixed_trace([600.0], [13])
    calls = []
    results = simulate_policies(paper32, trace, ["recycle", "oobleck"], 1800.0, mtbf_hours_per_device=100.0,
                                progress=lambda name, done, total: calls.append((name, done, total)))
    assert set(results) == {"recycle", "oobleck"} and calls == [("recycle", 1, 1), ("oobleck", 1, 1)]
    assert results["oobleck"].transitions[0].action == "reconfigure"
    path = plot_timeline(results, tmp_path / "timeline.png")
    assert path.stat().st_size > 1000
    json_ready = results["recycle"].to_json()
    assert json_ready["average_throughput"] == results["recycle"].average_throughput
