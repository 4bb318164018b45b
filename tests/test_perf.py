"""The performance model against method.md's worked numbers and against its own closed forms."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chameleon_opt.errors import InfeasibleError
from chameleon_opt.instance.load import load_instance
from chameleon_opt.perf.comm import Link, ring_allreduce_time
from chameleon_opt.perf.memory import in_flight_micro_batches, stage_memory_eq14
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.pipeline import (one_f_one_b_floors, one_f_one_b_order, one_f_one_b_time,
                                         reroute_eq12_time, uniform_1f1b_time)
from chameleon_opt.perf.reroute import even_reroute

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "instances" / "paper-example.json"


@pytest.fixture(scope="module")
def example():
    instance = load_instance(EXAMPLE)
    return instance, PerfModel(instance)


def test_worked_example_failure_free_is_35(example):
    instance, model = example
    assert model.evaluate(instance.plan).iteration_time_s == pytest.approx(35.0, abs=1e-12)
    assert uniform_1f1b_time(3, 5, 2, 3) == 35


def test_worked_example_one_failure_is_35_plus_25_thirds(example):
    instance, model = example
    failed = frozenset({4})  # pipeline 1, stage 1
    estimate = model.evaluate(even_reroute(instance.plan, failed), failed)
    assert estimate.iteration_time_s == pytest.approx(35 + 25 / 3, abs=1e-12)
    assert reroute_eq12_time(3, 5, [0, 1, 0], 4, 2, 3) == pytest.approx(35 + 25 / 3)


def test_worked_example_two_failures_in_one_stage_is_60(example):
    instance, model = example
    failed = frozenset({4, 7})  # stage 1 of pipelines 1 and 2
    estimate = model.evaluate(even_reroute(instance.plan, failed), failed)
    assert estimate.iteration_time_s == pytest.approx(60.0, abs=1e-12)
    assert reroute_eq12_time(3, 5, [0, 2, 0], 4, 2, 3) == pytest.approx(60.0)


def test_rerouting_is_infeasible_when_a_stage_lost_every_replica(example):
    instance, _ = example
    with pytest.raises(InfeasibleError, match="lost every replica"):
        even_reroute(instance.plan, frozenset({1, 4, 7, 10}))
    assert math.isinf(reroute_eq12_time(3, 5, [0, 4, 0], 4, 2, 3))


def test_eq14_memory_example():
    """layers (2,1,2), m_p = m_g = 10, m_o = 24, m_a = 5: static 88/44/88, activations 30/10/10."""
    results = [stage_memory_eq14(i, 3, layers, 10, 10, 24, 5) for i, layers in enumerate((2, 1, 2))]
    assert [r[0] for r in results] == [88, 44, 88]
    assert [r[1] for r in results] == [30, 10, 10]


def test_in_flight_is_capped_by_micro_batches_and_grows_with_rerouted_work():
    assert in_flight_micro_batches(0, 4, 10) == 4
    assert in_flight_micro_batches(0, 4, 2) == 2
    assert in_flight_micro_batches(3, 4, 10) == 1
    assert in_flight_micro_batches(0, 4, 10, extra=5) == pytest.approx(6.0)


@given(stages=st.integers(1, 6), micro=st.integers(1, 12),
       fwd=st.floats(0.1, 10), bwd=st.floats(0.1, 10))
@settings(max_examples=60, deadline=None)
def test_longest_path_equals_eq9_for_uniform_stages(stages, micro, fwd, bwd):
    assert one_f_one_b_time([fwd] * stages, [bwd] * stages, micro) == pytest.approx(
        uniform_1f1b_time(stages, micro, fwd, bwd))


@given(times=st.lists(st.tuples(st.floats(0.1, 5), st.floats(0.1, 5)), min_size=1, max_size=6),
       micro=st.integers(1, 10))
@settings(max_examples=60, deadline=None)
def test_longest_path_bounds(times, micro):
    """Non-uniform stages: at least one micro-batch's full trip and the busiest stage's work; at most
    all work done serially (a path visits each operation once). Sailor's straggler form
    trip + (M-1) x bottleneck is *not* an upper bound: (1,4),(4,1),(1,1) with M=2 takes 18 > 17."""
    fwd, bwd = [t[0] for t in times], [t[1] for t in times]
    total = one_f_one_b_time(fwd, bwd, micro)
    trip = sum(fwd) + sum(bwd)
    busiest = max(f + b for f, b in times) * micro
    assert total >= max(trip, busiest) - 1e-9
    assert total <= micro * trip + 1e-9


def test_longest_path_exceeds_the_straggler_approximation():
    assert one_f_one_b_time([1, 4, 1], [4, 1, 1], 2) == pytest.approx(18.0)


def test_1f1b_floors_meet_a_slow_first_stage_and_never_pass_the_schedule():
    """Two stages, f = (6, 2), b = (6, 3), two micro-batches, by hand: stage 0 runs F0 [0, 6], F1 [6, 12],
    B0 [12, 18] (stage 1's B0 ended at 11), B1 [18, 24] (stage 1's F1 [12, 14], B1 [14, 17]): 24, its
    own 2 (6 + 6). The path bound W + (m - 1) b_s + max(m - 1 - k_s, 0) f_s gives only 23 (stage 0) and
    22; the busy stage reaches 24. And on random pipelines (every stage count up to 6, zero times
    included) no floor passes the exact schedule."""
    import numpy as np

    assert one_f_one_b_time([6, 2], [6, 3], 2) == pytest.approx(24.0)
    assert one_f_one_b_floors(np.array([[6.0, 2.0]]), np.array([[6.0, 3.0]]), np.array([1, 2]))[0] \
        == pytest.approx([17.0, 24.0])
    rng = np.random.default_rng(7)
    for stages in range(1, 7):
        forward = rng.choice([0.0, 0.3, 1.0, 4.0], size=(40, stages)) * rng.random((40, stages))
        backward = rng.choice([0.0, 0.3, 1.0, 4.0], size=(40, stages)) * rng.random((40, stages))
        floors = one_f_one_b_floors(forward, backward, np.arange(1, 8))
        for c in range(40):
            for m in range(1, 8):
                assert floors[c, m - 1] <= one_f_one_b_time(forward[c].tolist(), backward[c].tolist(), m) * (1 + 1e-12) + 1e-12


def test_1f1b_order_keeps_at_most_stages_minus_s_forwards_in_flight():
    for stages in range(1, 6):
        for s in range(stages):
            in_flight = peak = 0
            for forward, _ in one_f_one_b_order(s, stages, 9):
                in_flight += 1 if forward else -1
                peak = max(peak, in_flight)
            assert peak == min(stages - s, 9)


def test_ring_allreduce_cost():
    link = Link(bandwidth=10e9, latency=0.0)
    assert ring_allreduce_time(1e9, 1, link) == 0.0
    assert ring_allreduce_time(1e9, 4, link) == pytest.approx(2 * 3 / 4 * 1e9 / 10e9)
    assert ring_allreduce_time(1e9, 2, Link(10e9, 1e-3)) == pytest.approx(2e-3 + 0.1)
