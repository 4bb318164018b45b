"""Bubble-filling rerouting (CP-SAT) against a brute force over every device order and host."""

from __future__ import annotations

import functools
import itertools
import math
import time
from pathlib import Path

import pytest

from chameleon_opt.instance.load import load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.solve.backends import SolverOptions, Stall
from chameleon_opt.solve.bubbles import (BubbleProblem, device_of, even_hosts, list_schedule, one_f_one_b_orders,
                                         problem_for, retime, serial_schedule, solve_bubbles)
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.result import Status

ROOT = Path(__file__).resolve().parents[1]


def _orders(ops):
    """Every order of `ops` keeping each micro-batch's F before B before W (one device)."""
    for perm in itertools.permutations(ops):
        seen = {}
        ok = True
        for kind, j, k, s in perm:
            rank = "FBW".index(kind)
            if seen.get((j, k), -1) > rank:
                ok = False
                break
            seen[(j, k)] = rank
        if ok:
            yield perm


@functools.lru_cache(maxsize=None)
def brute_force(problem: BubbleProblem) -> float:
    """The least makespan over every host of the lost ops and every order on every device (once
    per case: two tests compare against it, and the first case takes seconds)."""
    failed_ops = [(j, k, s) for j, s in problem.failed for k in range(problem.micro_batches[j])]
    best = math.inf
    for choice in itertools.product(*(problem.peers(s) for _, _, s in failed_ops)):
        hosts = dict(zip(failed_ops, choice))
        by_device = {}
        for op in problem.ops():
            if op[2] is not None and problem.duration(op) == 0 and op[0] == "W":
                pass
            by_device.setdefault(device_of(op, hosts), []).append(op)
        slots = sorted(by_device)
        for combo in itertools.product(*(list(_orders(by_device[slot])) for slot in slots)):
            timed = retime(problem, dict(zip(slots, combo)))
            if timed is not None:
                best = min(best, timed[0])
    return best


CASES = [
    # two pipelines of two stages, two micro-batches each, stage 1 of pipeline 1 lost; no W split
    BubbleProblem((1.0, 1.5), (2.0, 3.0), (0.0, 0.0), (2, 2), frozenset({(1, 1)})),
    # the same with the backward split in half (Zero Bubble's B / W), one micro-batch each
    BubbleProblem((1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (1, 1), frozenset({(1, 1)})),
    # three pipelines, the failed stage's work shared between two peers, memory of one in flight
    BubbleProblem((1.0, 2.0), (1.5, 2.5), (0.5, 1.0), (1, 1, 1), frozenset({(2, 1)}),
                  in_flight=((2, 1), (2, 1), (2, 1))),
]


@pytest.mark.parametrize("problem", CASES)
def test_bubble_filling_equals_brute_force(problem):
    exact = brute_force(problem)
    result = solve_bubbles(problem, Deadline.after(20))
    assert result.status is Status.OPTIMAL
    assert result.objective == pytest.approx(exact, rel=1e-3)
    assert result.objective >= exact - 1e-9  # a real schedule: never below the true optimum
    assert result.bound <= exact + 1e-9
    assert retime(problem, result.solution.orders)[0] == pytest.approx(result.objective)


def test_bubble_filling_beats_the_serial_step_when_the_backward_splits():
    """Four stages, four micro-batches per pipeline, one failure: the rerouted work interleaved
    into the peer's schedule (W deferred into its bubbles) beats Eq. 12/13's serial accounting."""
    problem = BubbleProblem((1.0,) * 4, (1.0,) * 4, (1.0,) * 4, (4, 4), frozenset({(1, 2)}),
                            in_flight=((4, 3, 2, 1), (4, 3, 2, 1)))
    appended = retime(problem, one_f_one_b_orders(problem, even_hosts(problem), interleave=False))[0]
    assert appended == pytest.approx(32.0)  # Eq. 12/13: 4 x 2 own + 4 x 3 hosted ... after the peer's own work
    result = solve_bubbles(problem, Deadline.after(3))  # both reached within 1 s (CP-SAT does not close the gap)
    assert result.status.has_solution
    assert result.objective <= 29.0 + 1e-9 < appended * 0.95
    assert 25.9 <= result.bound <= result.objective  # CP-SAT proves 26 less the one-tick-per-op rounding
    assert result.bound <= result.objective
    lists = result.solution.action_lists()
    assert any(entry.startswith("p1:") for entry in lists[(0, 2)])


def test_stage_without_peers_cannot_reroute():
    problem = BubbleProblem((1.0,), (1.0,), (0.0,), (1, 1), frozenset({(0, 0), (1, 0)}))
    with pytest.raises(ValueError, match="lost every replica"):
        solve_bubbles(problem, Deadline.after(10.0))


@pytest.mark.parametrize("problem", CASES)
def test_list_schedule_is_a_valid_schedule_no_shorter_than_the_optimum(problem):
    greedy = list_schedule(problem)
    assert greedy is not None
    assert retime(problem, greedy.orders)[0] == pytest.approx(greedy.makespan_s)
    assert greedy.makespan_s >= brute_force(problem) - 1e-9


def test_list_schedule_reaches_the_optimum_where_the_serial_orders_do_not():
    """paper-example losing devices 1 and 3 (the schedule CP-SAT could not prove optimal: it ran
    out the 5 s limit at 37.5 s): the greedy list schedule is at the best known step at once."""
    instance = load_instance(ROOT / "instances" / "paper-example.json")
    problem = problem_for(PerfModel(instance), instance.plan, frozenset({1, 3}))
    assert serial_schedule(problem).makespan_s == pytest.approx(53.5)
    assert list_schedule(problem).makespan_s == pytest.approx(37.0)


def test_a_stalled_search_stops_long_before_its_deadline():
    """The rerouting's stopping rule: CP-SAT stops once its incumbent stops improving, and the
    answer is never worse than the constructive schedule it started from."""
    instance = load_instance(ROOT / "instances" / "paper-example.json")
    problem = problem_for(PerfModel(instance), instance.plan, frozenset({1, 3}))
    start = time.perf_counter()
    result = solve_bubbles(problem, Deadline.after(30.0), stall=Stall(least_s=0.1, ratio=1.0))
    assert time.perf_counter() - start < 10.0  # 0.3 s quiet; without the rule it runs all 30 s
    assert result.objective <= list_schedule(problem).makespan_s + 1e-9
    assert "no improvement" in result.reason or result.status is Status.OPTIMAL


def test_a_deterministic_run_ignores_the_stall_rule():
    """The stall rule reads the wall clock: `--deterministic` runs stop on CP-SAT's work alone
    (a quarter of a deterministic second: still a search with incumbents, 0.5 s of CPU a run)."""
    instance = load_instance(ROOT / "instances" / "paper-example.json")
    problem = problem_for(PerfModel(instance), instance.plan, frozenset({1, 3}))
    runs = [solve_bubbles(problem, Deadline.after(0.25, deterministic=True), SolverOptions(deterministic=True),
                          stall=Stall(least_s=0.0, ratio=0.0)) for _ in range(2)]
    assert runs[0].objective == runs[1].objective and runs[0].solution.orders == runs[1].solution.orders
    assert "no improvement" not in runs[0].reason


def test_list_schedule_gives_up_when_its_deadline_passes():
    """The greedy schedule is the fallback, not a stage of its own: on a large DP group (8
    pipelines of 4 stages, 8 micro-batches each, one slot lost: 768 operations) it returns None
    once the deadline has passed, and the same problem without a deadline is scheduled validly."""
    problem = BubbleProblem((1.0, 1.2, 1.1, 1.3), (1.0, 1.1, 1.0, 1.2), (0.8, 0.9, 0.8, 0.9), (8,) * 8,
                            frozenset({(3, 2)}))
    assert list_schedule(problem, Deadline.after(0.0)) is None
    greedy = list_schedule(problem)
    assert greedy is not None and retime(problem, greedy.orders)[0] == pytest.approx(greedy.makespan_s)
