"""Micro-batch allocation and the CP-SAT plan search against brute force over their own spaces."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chameleon_opt.check import check_plan
from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.solve.backends import SolverOptions
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.microbatch import allocate_greedy, pipeline_time
from chameleon_opt.solve.result import Status
from chameleon_opt.solve.constructive import Mix, heuristic_mix, modelled_time
from chameleon_opt.solve.levels import level_model, lp_lower_bound, solve_level_model
from chameleon_opt.solve.search import _template_plan, search_plan
from chameleon_opt.solve.templates import build_templates
from tests.helpers import tiny_instance


def brute_force_allocation(fill, per, total):
    best = None
    for shares in itertools.product(range(1, total + 1), repeat=len(fill)):
        if sum(shares) == total:
            value = max(pipeline_time(f, p, m) for f, p, m in zip(fill, per, shares))
            best = value if best is None else min(best, value)
    return best


@given(pipes=st.lists(st.tuples(st.floats(0.1, 10), st.floats(0.1, 5)), min_size=1, max_size=4),
       total=st.integers(1, 9))
@settings(max_examples=80, deadline=None)
def test_micro_batch_allocation_is_exact(pipes, total):
    fill, per = [p[0] for p in pipes], [p[1] for p in pipes]
    greedy = allocate_greedy(fill, per, total)
    if total < len(pipes):
        assert greedy.status is Status.INFEASIBLE and "at least one" in greedy.reason
        return
    exact = brute_force_allocation(fill, per, total)
    assert sum(greedy.solution) == total
    assert greedy.objective == pytest.approx(exact, rel=1e-12)


def brute_force_mix(templates, budget, total):
    """Every count vector within the group budget, micro-batches balanced exactly per count vector."""
    ranges = [range(0, budget[t.device_type] // t.stages + 1) for t in templates]
    best = None
    for counts in itertools.product(*ranges):
        if not any(counts):
            continue
        if any(sum(t.stages * c for t, c in zip(templates, counts) if t.device_type == name) > groups
               for name, groups in budget.items()):
            continue
        pipes = [(k, t) for k, t in enumerate(templates) for _ in range(counts[k])]
        if len(pipes) > total or any(c and len(pipes) < t.min_pipelines for t, c in zip(templates, counts)):
            continue
        result = allocate_greedy([t.fill_s for _, t in pipes], [t.per_micro_batch_s for _, t in pipes], total,
                                 [t.max_level for _, t in pipes])
        if result.solution is None:
            continue
        shares = [[] for _ in templates]
        for (k, _), m in zip(pipes, result.solution):
            shares[k].append(m)
        mix = Mix(tuple(counts), tuple(tuple(s) for s in shares))
        value = modelled_time(templates, mix)
        best = value if best is None else min(best, value)
    return best


@given(seed=st.integers(0, 10_000), failed=st.sets(st.integers(0, 5), max_size=3),
       micro=st.integers(2, 8), memory=st.sampled_from([100.0, 1.5, 0.9]))
@settings(max_examples=25, deadline=None)
def test_template_path_matches_brute_force_over_the_template_space(seed, failed, micro, memory):
    """The scale path's level model over its own (template) space; the search as a whole is
    checked against the whole plan space in test_search_exact.py."""
    instance = build_instance(tiny_instance(seed, micro_batches=micro, memory_gib=memory), "<tiny>")
    failed = frozenset(failed)
    model = PerfModel(instance)
    result = _template_plan(instance, failed, Deadline.after(5), SolverOptions("cpsat"), model)
    groups = survivor_groups(instance, failed, 1)
    templates = build_templates(model, groups)
    if not templates:
        assert result.status is Status.INFEASIBLE and "GiB" in result.reason
        return
    budget = {"toy": len(groups)}
    exact = brute_force_mix(templates, budget, instance.global_micro_batches)
    if exact is None:
        assert result.status is Status.INFEASIBLE and "micro-batches" in result.reason
        return
    assert result.status is Status.OPTIMAL
    assert result.objective == pytest.approx(exact, abs=1e-4)
    assert result.bound <= exact + 1e-9
    assert check_plan(instance, result.solution, failed).ok
    assert not failed.intersection(result.solution.devices)
    # The level model on its own, by both backends (the bound often proves the incumbent without it):
    total = instance.global_micro_batches
    assert lp_lower_bound(templates, budget, total) <= exact + 1e-9
    lm = level_model(templates, budget, total, heuristic_mix(templates, budget, total), 0.0)
    for backend in ("cpsat", "highs"):
        status, mix, bound, _, _ = solve_level_model(lm, Deadline.after(5.0), SolverOptions(backend))
        assert status is Status.OPTIMAL, backend
        assert mix is not None and modelled_time(templates, mix) == pytest.approx(exact, abs=1e-4), backend
        assert bound <= exact + 1e-6, backend


def test_search_reports_memory_infeasibility_with_sizes():
    instance = build_instance(tiny_instance(1, memory_gib=0.5), "<tiny>")
    result = search_plan(instance, frozenset({0, 1, 2}), Deadline.after(2))
    assert result.status is Status.INFEASIBLE
    assert "GiB" in result.reason and "layer 0 alone needs" in result.reason


def test_search_without_survivors_is_infeasible():
    instance = build_instance(tiny_instance(2), "<tiny>")
    result = search_plan(instance, frozenset(range(6)), Deadline.after(2))
    assert result.status is Status.INFEASIBLE and "no surviving TP group" in result.reason


def test_min_max_split_meets_the_best_split_of_every_small_case():
    """The template split's slowest stage is the least over every contiguous split that fits memory
    (its bisection snaps to the stage times it meets: integer times make ties on every side)."""
    import numpy as np

    from chameleon_opt.perf.model import LayerCosts
    from chameleon_opt.solve.templates import min_max_split

    rng = np.random.default_rng(7)
    for case in range(300):
        layers, stages = int(rng.integers(1, 8)), int(rng.integers(1, 5))
        times = rng.integers(1, 4, layers).astype(float) if case % 2 else rng.random(layers) + 0.1
        static, act = rng.random(layers), rng.random(layers) * 0.3
        costs = LayerCosts(times, static, act, 0.05, float(rng.random() * (static.sum() + stages * act.sum()) + 0.3))
        overhead = np.full(stages, 0.2)
        in_flight = [stages - s for s in range(stages)]
        best = np.inf
        for cuts in itertools.combinations(range(1, layers), stages - 1):
            bounds = (0, *cuts, layers)
            spans = list(zip(bounds, bounds[1:]))
            if all(static[a:b].sum() + in_flight[s] * act[a:b].sum() <= costs.capacity_bytes - costs.transient_bytes
                   for s, (a, b) in enumerate(spans)):
                best = min(best, max(times[a:b].sum() + overhead[s] for s, (a, b) in enumerate(spans)))
        found = min_max_split(costs, overhead)
        if found is None:
            assert best == np.inf
        else:
            assert max(times[a:b].sum() + overhead[s] for s, (a, b) in enumerate(zip(found, found[1:]))) \
                == pytest.approx(best, rel=1e-12)
