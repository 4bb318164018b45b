"""Layer allocation: the MILP (HiGHS, CBC), CP-SAT and the exact DP agree with each other and with
brute force; infeasibility is proven and explained; the paper's worked example gives 35 s; time
limits hold and an unfinished solve says so (FEASIBLE with a bound, or HEURISTIC)."""

from __future__ import annotations

import time
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chameleon_opt.instance.load import load_instance
from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.layers import (
    CPSAT_MEMORY_UNITS,
    CPSAT_OBJECTIVE_UNITS,
    LayerProblem,
    balanced_boundaries,
    boundaries_to_ranges,
    cpsat_scale,
    solve_layers,
    solve_layers_cpsat,
    solve_layers_exact,
    solve_layers_milp,
)
from chameleon_opt.solve.result import Status

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 5.0
MODEL_BACKENDS = ("highs", "cbc", "cpsat")


def random_problem(seed: int, stages: int, layers: int, tightness: float = 0.0, micro_batches: int | None = None,
                   device_kinds: int = 2) -> LayerProblem:
    """Heterogeneous stages (a few device speeds), integer byte counts, caps around a balanced
    share times a random factor: tightness < 0 makes many caps binding or infeasible."""
    rng = np.random.default_rng(seed)
    micro_batches = micro_batches or int(rng.integers(1, 3 * stages + 2))
    speed = rng.choice(rng.uniform(0.5, 2.0, device_kinds), stages)
    time_s = np.outer(speed, rng.uniform(0.5, 2.0, layers))
    memory_scale = rng.choice([1.0, 0.5], stages)  # e.g. TP 2 on some stages halves the bytes
    static = np.outer(memory_scale, rng.integers(1, 8, layers) * 2.0 ** 28)
    activation = np.outer(memory_scale, rng.integers(1, 4, layers) * 2.0 ** 26)
    in_flight = np.minimum(stages - np.arange(stages), micro_batches)
    transient = rng.integers(0, 3, stages) * 2.0 ** 28
    share = (static.sum(axis=1) + in_flight * activation.sum(axis=1)) / stages
    factor = rng.uniform(1.0 + tightness, max(2.5, 1.5 + tightness), stages)
    capacity = np.floor((share * factor + transient) / 1024) * 1024 + 512  # never exactly at a sum of layers
    overhead = rng.uniform(0.0, 0.2, stages)
    return LayerProblem(time_s, static, activation, in_flight, overhead, transient, capacity, micro_batches)


def brute_force(problem: LayerProblem) -> tuple[float, tuple[int, ...]] | None:
    """Every C(n-1, S-1) split, evaluated here from the raw arrays (independent of the module)."""
    stages, layers, best = problem.stages, problem.layers, None
    for cuts in combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        times, fits = [], True
        for s in range(stages):
            a, b = bounds[s], bounds[s + 1]
            times.append(sum(problem.time_s[s, a:b]) + problem.overhead_s[s])
            need = (sum(problem.static_bytes[s, a:b]) + problem.in_flight[s] * sum(problem.activation_bytes[s, a:b])
                    + problem.transient_bytes[s])
            fits = fits and need <= problem.capacity_bytes[s]
        value = sum(times) + (problem.micro_batches - 1) * max(times)
        if fits and (best is None or value < best[0]):
            best = (value, bounds)
    return best


def solve_all(problem: LayerProblem, time_limit_s: float = LIMIT_S) -> dict[str, object]:
    return {"dp": solve_layers_exact(problem),
            "highs": solve_layers_milp(problem, time_limit_s, "highs"),
            "cbc": solve_layers_milp(problem, time_limit_s, "cbc"),
            "cpsat": solve_layers_cpsat(problem, time_limit_s)}


def assert_agree(problem: LayerProblem, results: dict, rel: float = 1e-6) -> None:
    reference = results["dp"]
    for name, result in results.items():
        assert (result.status == Status.INFEASIBLE) == (reference.status == Status.INFEASIBLE), (name, result)
        if reference.status == Status.INFEASIBLE:
            assert "GiB" in result.reason or "stages for" in result.reason, (name, result.reason)
            continue
        assert result.status == Status.OPTIMAL, (name, result)
        assert problem.fits(result.solution, rtol=1e-6), (name, result.solution)
        assert result.objective == pytest.approx(problem.objective(result.solution), rel=1e-12)
        assert result.objective == pytest.approx(reference.objective, rel=rel), (name, result, reference)
        assert result.bound <= result.objective * (1 + 1e-12)
        # CP-SAT's bound is less the worst-case rounding of its integer times (~1e-6 at most).
        assert result.bound >= reference.objective * (1 - (1e-5 if name == "cpsat" else rel))


# -- agreement --------------------------------------------------------------------------------------
CASES = [(seed, 1 + seed % 6) for seed in range(30)]


@pytest.mark.parametrize(("seed", "stages"), CASES)
def test_backends_agree_on_random_problems(seed: int, stages: int) -> None:
    rng = np.random.default_rng(10_000 + seed)
    layers = int(rng.integers(stages, 21))
    problem = random_problem(seed, stages, layers, tightness=float(rng.uniform(-0.7, 0.3)))
    results = solve_all(problem)
    assert_agree(problem, results)
    found = brute_force(problem) if layers <= 14 else None
    if found is not None:
        assert results["dp"].objective == pytest.approx(found[0], rel=1e-12)


def test_random_cases_cover_feasible_binding_and_infeasible() -> None:
    """The agreement cases are not all easy: some are infeasible, some have a binding memory cap
    (the unconstrained optimum of the same times would not fit)."""
    infeasible = binding = 0
    for seed, stages in CASES:
        rng = np.random.default_rng(10_000 + seed)
        layers = int(rng.integers(stages, 21))
        problem = random_problem(seed, stages, layers, tightness=float(rng.uniform(-0.7, 0.3)))
        result = solve_layers_exact(problem)
        if result.status == Status.INFEASIBLE:
            infeasible += 1
            continue
        free = LayerProblem(problem.time_s, problem.static_bytes, problem.activation_bytes, problem.in_flight,
                            problem.overhead_s, problem.transient_bytes, np.full(stages, 1e30), problem.micro_batches)
        binding += solve_layers_exact(free).objective < result.objective * (1 - 1e-9)
    assert infeasible >= 3 and binding >= 3, (infeasible, binding)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10 ** 6), stages=st.integers(1, 4), extra=st.integers(0, 7),
       tightness=st.floats(-0.5, 0.5), micro_batches=st.integers(1, 12))
def test_exact_equals_brute_force(seed: int, stages: int, extra: int, tightness: float, micro_batches: int) -> None:
    problem = random_problem(seed, stages, stages + extra, tightness, micro_batches, device_kinds=3)
    found = brute_force(problem)
    result = solve_layers_exact(problem)
    if found is None:
        assert result.status == Status.INFEASIBLE and result.reason
    else:
        assert result.status == Status.OPTIMAL
        assert result.objective == pytest.approx(found[0], rel=1e-12)
        assert problem.fits(result.solution)


def test_brute_force_helper_counts_every_split() -> None:
    problem = random_problem(3, 3, 7, tightness=5.0)  # caps far above need: every split fits
    splits = list(combinations(range(1, 7), 2))
    best = min(problem.objective((0, *c, 7)) for c in splits)
    assert brute_force(problem)[0] == pytest.approx(best)


# -- infeasibility ------------------------------------------------------------------------------------
def test_stage_too_small_is_infeasible_for_every_backend() -> None:
    problem = random_problem(5, 4, 10)
    capacity = problem.capacity_bytes.copy()
    capacity[2] = 0.1 * GIB  # below any single layer's state
    tiny = LayerProblem(problem.time_s, problem.static_bytes, problem.activation_bytes, problem.in_flight,
                        problem.overhead_s, problem.transient_bytes, capacity, problem.micro_batches)
    for name, result in solve_all(tiny).items():
        assert result.status == Status.INFEASIBLE, name
        assert "stage 2 needs at least" in result.reason and "GiB" in result.reason, (name, result.reason)
    assert solve_layers(tiny, "cpsat", 2.0).status == Status.INFEASIBLE


def test_caps_that_cannot_hold_every_layer_are_infeasible_for_every_backend() -> None:
    problem = random_problem(6, 3, 12)
    need = problem.static_bytes.sum(axis=1) + problem.in_flight * problem.activation_bytes.sum(axis=1)
    capacity = need / 4 + problem.transient_bytes  # each stage fits a layer, together only about 3/4
    short = LayerProblem(problem.time_s, problem.static_bytes, problem.activation_bytes, problem.in_flight,
                         problem.overhead_s, problem.transient_bytes, capacity, problem.micro_batches)
    for name, result in solve_all(short).items():
        assert result.status == Status.INFEASIBLE, name
        assert "fits in memory" in result.reason and "GiB" in result.reason, (name, result.reason)


def test_more_stages_than_layers_is_infeasible() -> None:
    problem = random_problem(7, 5, 5)
    fewer = LayerProblem(problem.time_s[:, :4], problem.static_bytes[:, :4], problem.activation_bytes[:, :4],
                         problem.in_flight, problem.overhead_s, problem.transient_bytes, problem.capacity_bytes,
                         problem.micro_batches)
    for name, result in solve_all(fewer).items():
        assert result.status == Status.INFEASIBLE, name
        assert "5 stages for 4 layers" in result.reason


# -- real instances -----------------------------------------------------------------------------------
def test_paper_example_gives_35_seconds_one_block_per_stage() -> None:
    instance = load_instance(ROOT / "instances" / "paper-example.json")
    model = PerfModel(instance)
    problem = LayerProblem.from_model(model, stage_devices=[(0,), (1,), (2,)], micro_batches=5)
    for name in ("dp", *MODEL_BACKENDS):
        result = solve_layers(problem, name, LIMIT_S)
        assert result.status == Status.OPTIMAL, name
        assert result.objective == pytest.approx(35.0, rel=1e-9), name
        blocks = [sum(1 for layer in range(a, b) if problem.time_s[s, layer] > 0)
                  for s, (a, b) in enumerate(boundaries_to_ranges(result.solution))]
        assert blocks == [1, 1, 1], (name, result.solution)
    # The performance model's own 1F1B schedule (Eq. 11) of that split takes the same 35 s.
    split = solve_layers_exact(problem).solution
    stages = tuple(Stage((s,), a, b) for s, (a, b) in enumerate(boundaries_to_ranges(split)))
    assert model.evaluate(Plan(1, (Pipeline(stages, 5),))).iteration_time_s == pytest.approx(35.0)


@pytest.mark.skipif(not (ROOT / "models" / "gpt3-7.5b.json").exists(), reason="models/gpt3-7.5b.json not added yet")
def test_gpt3_7_5b_on_four_stages_of_paper_32() -> None:
    instance = load_instance(ROOT / "instances" / "paper-32.json")
    assert instance.workload.num_layers == 38  # 36 blocks + embedding + head
    model = PerfModel(instance)
    devices = [(0, 1), (2, 3), (4, 5), (6, 7)]
    problem = LayerProblem.from_model(model, devices, micro_batches=instance.plan.pipelines[0].micro_batches,
                                      replicas=4)
    assert problem.overhead_s[0] > 0 and problem.overhead_s[1] == pytest.approx(2 * problem.overhead_s[0])
    results = solve_all(problem)
    assert_agree(problem, results)
    split = results["dp"].solution
    assert all(8 <= b - a <= 11 for a, b in boundaries_to_ranges(split)), split
    # The objective counts each stage's time from the same per-layer costs the model uses.
    for s, (a, b) in enumerate(boundaries_to_ranges(split)):
        forward, backward, _, _ = model.stage_times(devices[s], a, b)
        assert problem.stage_time(s, a, b) == pytest.approx(forward + backward + problem.overhead_s[s])
        need, have = model.stage_memory(devices[s], a, b, s, 4, problem.micro_batches, replicas=4)
        # the per-stage constant (framework overhead, buffers) is taken off the layers' capacity
        constant = model.layer_costs(devices[s], replicas=4).stage_constant_bytes
        assert problem.stage_memory(s, a, b) + constant == pytest.approx(need) and need <= have


# -- time limits, fallbacks, dispatcher -----------------------------------------------------------------
@pytest.mark.parametrize("backend", MODEL_BACKENDS)
def test_time_limit_is_respected_on_a_larger_problem(backend: str) -> None:
    problem = random_problem(1, 16, 100, tightness=0.1)
    start = time.perf_counter()
    if backend == "cpsat":
        result = solve_layers_cpsat(problem, time_limit_s=1.0)
    else:
        result = solve_layers_milp(problem, time_limit_s=1.0, backend=backend)
    elapsed = time.perf_counter() - start
    assert result.wall_s <= 1.0 * 1.1 + 0.5
    assert elapsed <= 1.0 * 1.1 + 0.5 + result.build_s
    assert result.status in (Status.OPTIMAL, Status.FEASIBLE, Status.HEURISTIC), result
    assert problem.fits(result.solution, rtol=1e-6)
    if result.status == Status.FEASIBLE:
        assert result.bound is not None and result.bound <= result.objective
    optimum = solve_layers_exact(problem).objective
    assert result.objective >= optimum * (1 - 1e-9)
    if result.bound is not None:
        assert result.bound <= optimum * (1 + 1e-9)


@pytest.mark.parametrize("backend", MODEL_BACKENDS)
def test_model_that_finds_nothing_returns_the_dp_split_as_heuristic(backend: str) -> None:
    problem = random_problem(2, 64, 128, tightness=0.1)
    if backend == "cpsat":
        result = solve_layers_cpsat(problem, time_limit_s=0.0)
    else:
        result = solve_layers_milp(problem, time_limit_s=0.0, backend=backend)
    if result.status == Status.HEURISTIC:  # CBC's root may still find a split; then it reports it
        assert "no split" in result.reason and "exact DP" in result.reason
    assert result.status in (Status.HEURISTIC, Status.FEASIBLE, Status.OPTIMAL)
    assert problem.fits(result.solution, rtol=1e-6)


def test_exact_with_a_tiny_time_limit_keeps_a_valid_incumbent_and_bound() -> None:
    problem = random_problem(3, 32, 128, tightness=0.1)
    full = solve_layers_exact(problem)
    cut = solve_layers_exact(problem, time_limit_s=0.0)
    assert cut.status in (Status.FEASIBLE, Status.OPTIMAL) and problem.fits(cut.solution)
    assert cut.bound <= full.objective * (1 + 1e-12) <= cut.objective * (1 + 1e-12)


@pytest.mark.parametrize("backend", ("dp", *MODEL_BACKENDS))
def test_dispatcher_matches_exact_and_warm_starts(backend: str) -> None:
    problem = random_problem(4, 12, 60, tightness=0.0)
    exact = solve_layers_exact(problem)
    result = solve_layers(problem, backend, time_limit_s=3.0)
    assert result.status == Status.OPTIMAL, result
    assert result.objective == pytest.approx(exact.objective, rel=1e-9)
    assert result.build_s >= 0 and result.wall_s <= 3.0 * 1.1 + 0.5


def test_cpsat_scale_keeps_rounding_negligible() -> None:
    problem = random_problem(8, 16, 100)
    scale = cpsat_scale(problem)
    largest = float((problem.time_s.sum(axis=1) + problem.overhead_s).max())
    upper = (16 + problem.micro_batches - 1) * largest * scale.per_second
    assert CPSAT_OBJECTIVE_UNITS / 2 < upper <= CPSAT_OBJECTIVE_UNITS  # far from int64, fine-grained
    assert scale.rounding_units / upper < 1e-6
    biggest = problem.capacity_bytes.max()
    assert biggest <= scale.bytes_per_unit * CPSAT_MEMORY_UNITS < 2 * biggest or scale.bytes_per_unit == 1.0


def test_boundaries_helpers() -> None:
    assert boundaries_to_ranges((0, 2, 3, 5)) == [(0, 2), (2, 3), (3, 5)]
    assert balanced_boundaries(10, 4) == (0, 2, 4, 7, 10)
    problem = random_problem(9, 4, 10, tightness=5.0)
    assert problem.is_split((0, 2, 4, 7, 10)) and not problem.is_split((0, 2, 2, 7, 10))
    assert not problem.is_split((0, 2, 4, 10))
