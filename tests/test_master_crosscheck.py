"""bench/master_crosscheck.py on tiny instances (issue 21): the master MILP, written out as MPS and
solved from the file by HiGHS and by CBC, agrees between the solvers, with PerfModel.evaluate and
with the exact search; and its linearised data-parallel term prices plans with unequal layer splits
and intra- or inter-node rings exactly as PerfModel.evaluate does."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

from chameleon_opt.instance.load import build_instance
from chameleon_opt.perf.model import PerfModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from master_crosscheck import (DEVICES, LAYERS, MICRO, MS, Space, build_master, check_instance,  # noqa: E402
                               random_instance, solve_cbc, solve_highs)

SEEDS = [5, 12, 34]
"""Instances of bench/master_crosscheck.py's default ranges whose optimum has two pipelines (5: 12
devices, TP 2, two device types; 12: TP 2, two types, binding memory; 34: one type, binding memory);
each solves in well under a second."""


@pytest.mark.parametrize("seed", SEEDS)
def test_master_agrees_with_solvers_model_and_search(seed):
    row = check_instance(seed, time_limit_s=5.0, solver_limit_s=30.0)
    assert row["outcome"] == "agree", row["notes"]
    optimum = row["milp_s"]
    assert optimum is not None and optimum > 0
    for solver in ("highs", "cbc"):
        answer = row[solver]
        # (a) each solver proved its optimum on the exported file, the same one
        assert answer["status"].startswith("Optimal"), answer
        assert math.isclose(answer["objective_ms"] / MS, optimum, rel_tol=1e-6)
        # (c) its solution, as a plan, evaluates to what the MILP priced, fits and passes the checker
        assert math.isclose(answer["evaluated_s"], answer["recomputed_s"], rel_tol=1e-9)
        assert answer["memory_ok"] and answer["checker_ok"]
        assert answer["pipelines"] >= 2  # the data-parallel term is part of the optimum
    # (b) the exact search: OPTIMAL at the MILP's optimum, its bound not above it
    assert row["search_status"] == "OPTIMAL"
    assert math.isclose(row["search_s"], optimum, rel_tol=1e-9)
    assert row["search_bound_s"] <= optimum * (1 + 1e-9)


def test_infeasible_master_is_proven_by_both_solvers_and_the_search():
    """Seed 118 of the wider ranges (10 devices, 5 layers, 6 micro-batches, binding memory): 440
    columns fit, but no choice of them runs the 6 micro-batches; HiGHS and CBC both prove the
    exported MILP infeasible and the search answers INFEASIBLE."""
    row = check_instance(118, (8, 12), (3, 5), (4, 8), time_limit_s=5.0, solver_limit_s=30.0)
    assert row["outcome"] == "agree", row["notes"]
    assert row["columns"] > 0 and row["milp_s"] is None
    assert row["highs"]["status"] == "Infeasible"
    assert row["cbc"]["status"].startswith("Infeasible"), row["cbc"]
    assert row["search_status"] == "INFEASIBLE"


def _fixed_plans(space: Space, count: int, rng: random.Random) -> list[dict[int, int]]:
    """Distinct pairs of pipelines that fit together (groups, memory, micro-batches sum to N)."""
    by_m: dict[int, list[int]] = {}
    for c, col in enumerate(space.columns):
        if col.shared:
            by_m.setdefault(col.m, []).append(c)
    found: list[dict[int, int]] = []
    for _ in range(20_000):
        if len(found) == count:
            break
        m = rng.randint(1, space.total - 1)
        if m not in by_m or space.total - m not in by_m:
            continue
        a, b = rng.choice(by_m[m]), rng.choice(by_m[space.total - m])
        demand: dict[int, dict[str, int]] = {}
        for c in (a, b):
            for cls in space.columns[c].seq:
                node, t = space.classes[cls]
                demand.setdefault(node, {}).setdefault(t, 0)
                demand[node][t] += 1
        counts = {a: 1, b: 1} if a != b else {a: 2}
        if space.hostable(demand) and counts not in found:
            found.append(counts)
    return found


def test_data_parallel_term_is_priced_as_the_model_does(tmp_path):
    """Pairs of pipelines fixed in the MILP (x bounds), solved from the MPS file: the MILP's step
    equals PerfModel.evaluate of the pair's plan, among them pairs with unequal layer splits (rings
    over parts of stages) and pairs whose rings stay inside one node."""
    data, failed = random_instance(0, DEVICES, LAYERS, MICRO)  # 16 devices, TP 2, 8 nodes, 3 layers, N = 5
    instance = build_instance(data)
    model = PerfModel(instance)
    space = Space(instance, failed, model)
    master = build_master(space)
    variables = master.problem.variablesDict()
    pairs = _fixed_plans(space, 12, random.Random(7))
    unequal = intra = 0
    for k, counts in enumerate(pairs):
        for c, name in master.x.items():
            variables[name].lowBound = variables[name].upBound = counts.get(c, 0)
        path = tmp_path / f"fixed{k}.mps"
        master.problem.writeMPS(str(path))
        solved = [solve_highs(path, 30.0)] + ([solve_cbc(path, 30.0, tmp_path)] if k < 3 else [])
        cut = {}
        for n in space.nodes:  # any cut that holds the pair's groups
            need: dict[str, int] = {}
            for c, x in counts.items():
                for cls in space.columns[c].seq:
                    if space.classes[cls][0] == n:
                        need[space.classes[cls][1]] = need.get(space.classes[cls][1], 0) + x
            cut[n] = next(i for i, o in enumerate(space.options[n]) if all(o.get(t, 0) >= v for t, v in need.items()))
        plan = space.plan(counts, cut)
        estimate = model.evaluate(plan, failed)
        assert estimate.data_parallel_s > 0
        for s in solved:
            assert s.optimal, s.status
            assert math.isclose(s.objective / MS, estimate.iteration_time_s, rel_tol=1e-9), (counts, s.solver)
        splits = {tuple((st.first, st.end) for st in p.stages) for p in plan.pipelines}
        unequal += len(splits) > 1
        nodes = [{instance.node_of(st.devices[0]) for p in plan.pipelines for st in p.stages
                  if st.first <= layer < st.end} for layer in range(space.layers)]
        intra += any(len(held) == 1 for held in nodes)
    assert len(pairs) == 12 and unequal >= 3 and intra >= 2, (len(pairs), unequal, intra)
