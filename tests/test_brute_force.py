"""bench/brute_force.py's reduced brute force against the naive one, and the search against it.

The reduced brute force (symmetry classes of devices and nodes, pipelines in canonical order, branch
and bound) must find the same optimum as tests/test_search_exact.py's naive enumeration of every
labelled plan, with and without its bounds; then the search must never claim more than it proves:
no OPTIMAL above the brute optimum, no bound above it (issue 21).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.result import Status
from chameleon_opt.solve.search import search_plan
from tests.test_search_exact import all_plans
from tests.test_search_exact import brute_force as naive_brute_force

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from brute_force import brute_force, brute_force_result, random_instance  # noqa: E402 (the bench folder is not a package)

TINY = dict(devices_range=(3, 6), layers_range=(2, 4), micro_range=(1, 3))
TINY_SEEDS = [1, 3, 5, 8, 10, 12, 14, 16, 20, 22, 29, 31, 35, 37, 43, 46, 54, 58, 77, 79]
"""Seeds of tiny instances (2-6 nodes, 3-6 devices) with a feasible plan: 13 with several pipelines in
their optimum, 13 heterogeneous, 5 with TP 2."""


def _same(a: float, b: float) -> bool:
    return (math.isinf(a) and math.isinf(b)) or math.isclose(a, b, rel_tol=1e-9)


@pytest.mark.parametrize("seed", TINY_SEEDS)
def test_reduced_equals_naive(seed):
    data, failed = random_instance(seed, **TINY)
    instance = build_instance(data)
    naive, _ = naive_brute_force(instance, failed)
    best, plan, _, complete = brute_force(instance, failed)
    assert complete and _same(best, naive), (best, naive)
    # The symmetry reductions alone (every canonical plan priced), each priced plan checked against
    # PerfModel.evaluate: the reduced pricing is the model's.
    unbounded, _, _, _ = brute_force(instance, failed, verify=True, bound=False)
    assert _same(unbounded, naive), (unbounded, naive)
    if plan is not None:
        assert _same(PerfModel(instance).evaluate(plan, failed).iteration_time_s, best)


@pytest.mark.parametrize("seed", [1, 8, 20])
def test_reduced_equals_naive_with_reliefs(seed):
    """With several supported reliefs the space has every relief on every stage."""
    data, failed = random_instance(seed, **TINY)
    data["training"]["reliefs"] = ["none", "full"]
    instance = build_instance(data)
    model = PerfModel(instance)
    naive = math.inf
    for plan in all_plans(instance, failed, tuple(model.relief_options)):
        estimate = model.evaluate(plan, failed)
        if estimate.memory_ok:
            naive = min(naive, estimate.iteration_time_s)
    best, _, _, complete = brute_force(instance, failed)
    assert complete and _same(best, naive), (best, naive)


@pytest.mark.parametrize("seed", [3, 10, 12, 14])
def test_search_claims_no_more_than_the_brute_force(seed):
    """8-12 devices: OPTIMAL only at the optimum, the bound never above it, the objective never
    below it (that would be a plan the brute force missed)."""
    data, failed = random_instance(seed, (8, 12), (3, 5), (1, 4))
    instance = build_instance(data)
    best, _, _, complete = brute_force(instance, failed, deadline_s=30)
    assert complete
    result = search_plan(instance, failed, Deadline.after(3))
    if math.isinf(best):
        assert result.status is Status.INFEASIBLE, result.status
        return
    assert result.status is not Status.INFEASIBLE, result.reason
    if result.objective is not None:
        assert result.objective >= best * (1 - 1e-9), (result.objective, best)
    if result.status is Status.OPTIMAL:
        assert result.objective <= best * (1 + 1e-6), (result.objective, best)
    if result.bound is not None:
        assert result.bound <= best * (1 + 1e-9), (result.bound, best)


def test_brute_force_prices_the_gradient_ring_as_the_model_under_overlap_param_gather():
    """With zero_stage 2 and overlap_param_gather the model charges each ring's reduce-scatter half;
    the brute force's pruning bound charged the whole all-reduce, so it pruned plans better than the
    one it reported (8-16-device seed 7: 11.5137, where the exact search proves 11.5122). Its optimum
    now equals the exact search's proven one."""
    from chameleon_opt.solve.exact import exact_search

    data, failed = random_instance(7, (8, 16))
    data["training"].update({"zero_stage": 2, "overlap_param_gather": True})
    instance = build_instance(data)
    found = brute_force_result(instance, failed, 60.0)
    outcome = exact_search(instance, PerfModel(instance), failed, math.inf, Deadline.after(20.0))
    assert outcome.bound <= found.best * (1 + 1e-9) and found.best <= outcome.objective * (1 + 1e-9)
    assert outcome.objective == pytest.approx(outcome.bound, rel=1e-6)  # proven: the two agree exactly


@pytest.mark.parametrize("seed", [1, 8, 20])
def test_reduced_equals_naive_interleaved(seed):
    """Under interleaved 1F1B (virtual_stages 2) the brute force's shapes leave out the pipelines the
    model refuses (fewer micro-batches than stages), as PerfModel.evaluate does."""
    data, failed = random_instance(seed, **TINY)
    data["training"]["virtual_stages"] = 2
    instance = build_instance(data)
    naive, _ = naive_brute_force(instance, failed)
    best, plan, _, complete = brute_force(instance, failed)
    unbounded, _, _, _ = brute_force(instance, failed, verify=True, bound=False)
    assert complete and _same(best, naive) and _same(unbounded, naive), (best, unbounded, naive)
    assert plan is None or all(p.micro_batches >= len(p.stages) for p in plan.pipelines)


@pytest.mark.parametrize("seed", [5, 29])
def test_interleaved_search_meets_the_brute_force(seed):
    """virtual_stages 2, 8-12 devices: the search answered OPTIMAL above the brute force (seed 5: one
    pipeline of 5 stages and 4 micro-batches, which interleaving cannot run, against two of 2 stages;
    seed 29: three pipelines pruned by floors of plain 1F1B's closed form, which exceeds the
    interleaved time). It now proves the brute force's optimum with a bound below it."""
    data, failed = random_instance(seed, (8, 12))
    data["training"]["virtual_stages"] = 2
    instance = build_instance(data)
    best, _, _, complete = brute_force(instance, failed)
    assert complete and math.isfinite(best)
    result = search_plan(instance, failed, Deadline.after(10))
    assert result.status is Status.OPTIMAL, result.reason
    assert result.objective == pytest.approx(best, rel=1e-6)
    assert result.bound <= best * (1 + 1e-9)


def test_interleaving_refuses_fewer_micro_batches_than_stages():
    """Megatron-LM's interleaved schedule needs at least as many micro-batches as stages: the model
    prices such a pipeline at an infinite step and the checker names the setting."""
    from chameleon_opt.check import check_plan
    from chameleon_opt.plan import Pipeline, Plan, Stage
    from chameleon_opt.solve.groups import survivor_groups

    data, failed = random_instance(5, (8, 12))
    data["training"]["virtual_stages"] = 2
    instance = build_instance(data)
    groups = survivor_groups(instance, failed, instance.plan.tensor_parallel)
    layers, total = instance.workload.num_layers, instance.global_micro_batches
    stages = total + 1  # one more stage than micro-batches
    bounds = [round(layers * s / stages) for s in range(stages + 1)]
    plan = Plan(instance.plan.tensor_parallel, (Pipeline(tuple(
        Stage(groups[s], bounds[s], bounds[s + 1]) for s in range(stages)), total),))
    assert math.isinf(PerfModel(instance).evaluate(plan, failed).iteration_time_s)
    report = check_plan(instance, plan, failed)
    assert any("training.virtual_stages" in v and "micro-batches" in v for v in report.violations), report.violations
