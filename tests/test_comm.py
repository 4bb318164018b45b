"""Communication after reconfiguration: slot assignment, migration, rounds, all-reduce colouring,
release safety and the per-rank lowering."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from chameleon_opt.check import check_plan
from chameleon_opt.comm import (allreduce_groups, assign_slots, check_release_safety, colour_bipartite_edges,
                                communication_plan, figure3_example, lower_plan, min_cost_assignment,
                                schedule_allreduce, schedule_migration)
from chameleon_opt.comm import migration as migration_module
from chameleon_opt.comm.allreduce import Group, cpsat_colouring, dsatur_colouring
from chameleon_opt.comm.assignment import FIGURE3_COSTS, _slot_state
from chameleon_opt.comm.lowering import RankPlan, absent_rank_plan
from chameleon_opt.comm.migration import fluid_makespan, transfer_time
from chameleon_opt.comm.state import old_holdings, tensor_bytes
from chameleon_opt.errors import UnrecoverableError
from chameleon_opt.instance.load import build_instance, load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.search import search_plan
from tests.helpers import tiny_instance, bundled_recovery

ROOT = Path(__file__).resolve().parents[1]


# -- slot assignment -----------------------------------------------------------------------------
def test_figure3_example_costs_two() -> None:
    assignment, cost = figure3_example()
    assert cost == 2
    assert sorted(assignment) == [0, 1, 2, 3]
    assert sum(FIGURE3_COSTS[i][j] for i, j in enumerate(assignment)) == 2


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5).flatmap(lambda n: st.lists(st.lists(st.integers(0, 50), min_size=n, max_size=n),
                                                    min_size=n, max_size=n)))
def test_min_cost_assignment_matches_brute_force(matrix: list[list[int]]) -> None:
    n = len(matrix)
    best = min(sum(matrix[i][p[i]] for i in range(n)) for p in itertools.permutations(range(n)))
    assignment, cost = min_cost_assignment(matrix)
    assert cost == best == sum(matrix[i][assignment[i]] for i in range(n))


def _search(seed: int, tp: int, failures: int, memory_gib: float = 100.0):
    inst = build_instance(tiny_instance(seed, nodes=3, per_node=4, blocks=6, micro_batches=8, memory_gib=memory_gib,
                                       tp=tp), "<tiny>")
    rng = random.Random(seed)
    failed = frozenset(rng.sample(range(inst.num_devices), failures))
    result = search_plan(inst, failed, Deadline.after(2.0))
    assert result.solution is not None, result.reason
    return inst, failed, result.solution


def _brute_force_bytes(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int]) -> int:
    """Least state to move over every placement of the live groups (and idle live groups) on the slots."""
    from chameleon_opt.solve.groups import survivor_groups
    slots = [(j, s) for j, p in enumerate(new.pipelines) for s in range(len(p.stages))]
    groups = [new.pipelines[j].stages[s].devices for j, s in slots]
    groups += [g for g in survivor_groups(model.instance, failed, new.tensor_parallel) if set(new.devices).isdisjoint(g)]
    best = None
    for chosen in itertools.permutations(range(len(groups)), len(slots)):
        pipes = []
        for j, p in enumerate(new.pipelines):
            stages = tuple(Stage(groups[chosen[slots.index((j, s))]], st_.first, st_.end) for s, st_ in enumerate(p.stages))
            pipes.append(Pipeline(stages, p.micro_batches))
        cost = _slot_state(model, old, Plan(new.tensor_parallel, tuple(pipes)), failed)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed,tp,memory", [(0, 1, 12.0), (3, 2, 12.0), (4, 1, 100.0), (6, 1, 8.0)])
def test_assignment_is_optimal_and_keeps_the_plan(seed: int, tp: int, memory: float) -> None:
    inst, failed, new = _search(seed, tp, 1 + seed % 2, memory)
    model = PerfModel(inst)
    plan, result = assign_slots(model, inst.plan, new, failed)
    assert check_plan(inst, plan, failed, model=model).ok
    for p, q in zip(plan.pipelines, new.pipelines):
        assert p.micro_batches == q.micro_batches
        assert [(s.first, s.end) for s in p.stages] == [(s.first, s.end) for s in q.stages]
        for stage in p.stages:
            assert len({inst.node_of(d) for d in stage.devices}) == 1
    assert result.status.value == "OPTIMAL"
    assert result.objective == _slot_state(model, inst.plan, plan, failed) <= _slot_state(model, inst.plan, new, failed)
    if len(plan.devices) // tp <= 7:  # small enough to enumerate every placement
        assert result.objective == _brute_force_bytes(model, inst.plan, new, failed)


# -- rounds: Koenig edge colouring ---------------------------------------------------------------
edges_strategy = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(edges_strategy, st.lists(st.floats(0.0, 10.0), min_size=60, max_size=60), st.booleans())
def test_rounds_equal_max_degree(edges: list[tuple[int, int]], weights: list[float], weighted: bool) -> None:
    colours = colour_bipartite_edges(edges, weights[:len(edges)] if weighted else None)
    degree = Counter(("s", u) for u, _ in edges) + Counter(("r", v) for _, v in edges)
    assert len(set(colours)) == max(degree.values(), default=0)
    assert set(colours) == set(range(len(set(colours))))
    seen = set()
    for (u, v), c in zip(edges, colours):
        assert ("s", u, c) not in seen and ("r", v, c) not in seen  # nobody sends or receives twice a round
        seen |= {("s", u, c), ("r", v, c)}


# -- all-reduce colouring ------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.lists(st.sets(st.integers(0, 9), min_size=2, max_size=5), min_size=1, max_size=9))
def test_allreduce_colouring_has_no_shared_device_and_cpsat_beats_dsatur(slot_sets: list[set[int]]) -> None:
    groups = {f"g{i}": Group(f"g{i}", (i,), tuple((0, s) for s in sorted(slots)), 1.0, 1.0)
              for i, slots in enumerate(slot_sets)}
    greedy = dsatur_colouring(groups)
    k = max(greedy.values()) + 1
    status, exact, bound, _ = cpsat_colouring(groups, k, Deadline.after(5.0), hint=greedy)
    assert exact is not None and status.value == "OPTIMAL"
    assert max(exact.values()) + 1 <= k
    for colouring in (greedy, exact):
        for c in set(colouring.values()):
            members = [groups[g].slots for g in groups if colouring[g] == c]
            flat = [slot for slots in members for slot in slots]
            assert len(flat) == len(set(flat))
    largest = max(Counter(s for slots in slot_sets for s in slots).values())
    assert bound >= largest and max(exact.values()) + 1 >= largest


def test_allreduce_rounds_on_uneven_pipelines() -> None:
    inst = load_instance(ROOT / "instances" / "paper-32.json")
    model = PerfModel(inst)
    plan = Plan(2, (Pipeline((Stage((0, 1), 0, 13), Stage((2, 3), 13, 25), Stage((4, 5), 25, 40)), 128),
                    Pipeline((Stage((8, 9), 0, 10), Stage((10, 11), 10, 20), Stage((12, 14), 20, 30),
                              Stage((16, 17), 30, 40)), 128),
                    Pipeline((Stage((18, 19), 0, 20), Stage((20, 21), 20, 40)), 256)))
    failed = frozenset({13})
    schedule = schedule_allreduce(model, plan, failed, Deadline.after(2.0))
    names = [n for r in schedule.rounds for n in r]
    assert sorted(names) == sorted(schedule.groups) and len(names) == len(set(names))
    covered = Counter(layer for g in schedule.groups.values() if g.name != "tied_embedding" for layer in g.layers)
    assert set(covered) == set(range(inst.workload.num_layers)) and set(covered.values()) == {1}
    assert "tied_embedding" in schedule.groups  # GPT ties the head to the embedding
    for names_ in schedule.rounds:
        devices = [d for n in names_ for j, s in schedule.groups[n].slots for d in plan.pipelines[j].stages[s].devices]
        assert len(devices) == len(set(devices))
    assert schedule.colours <= schedule.dsatur_colours and schedule.colours >= schedule.clique_bound
    assert schedule.estimated_s > 0


# -- migration on real searches ------------------------------------------------------------------
def _check_migration(inst, failed: frozenset[int], old: Plan, migration) -> None:
    model = PerfModel(inst)
    new = migration.plan
    sizes = tensor_bytes(model, new.tensor_parallel)
    held = old_holdings(old, failed)
    got: dict[tuple[int, str], int] = defaultdict(int)
    for t in migration.transfers:
        h = held[t.src]  # sources are live old holders of the same layer and TP rank
        assert t.src not in failed and h.rank == t.tp_rank and h.first <= t.layer < h.end
        assert t.tensor == f"layer{t.layer}.tp{t.tp_rank}" and t.nbytes > 0
        got[(t.dst, t.tensor)] += t.nbytes
    wanted: dict[tuple[int, str], int] = {}
    for pipe in new.pipelines:
        for stage in pipe.stages:
            if failed.intersection(stage.devices):
                continue
            for rank, d in enumerate(stage.devices):
                h = held.get(d)
                for layer in range(stage.first, stage.end):
                    if not (h and h.rank == rank and h.first <= layer < h.end) and sizes[layer] > 0:
                        wanted[(d, f"layer{layer}.tp{rank}")] = int(sizes[layer])
    assert dict(got) == wanted  # every missing tensor delivered exactly, nothing else sent
    assert migration.fluid_makespan_s >= migration.lower_bound_s - 1e-9
    assert migration.makespan_s >= migration.fluid_makespan_s - 1e-9
    assert migration.makespan_s >= migration.async_makespan_s - 1e-9 >= migration.lower_bound_s - 2e-9
    assert abs(migration.fluid_makespan_s - fluid_makespan(model, migration.transfers)) < 1e-9
    assert migration.rounds == migration.max_degree
    per_round = Counter((t.round, "send", t.src) for t in migration.transfers)
    per_round += Counter((t.round, "recv", t.dst) for t in migration.transfers)
    assert max(per_round.values(), default=1) == 1
    assert abs(migration.makespan_s - sum(max((transfer_time(model, t) for t in migration.transfers if t.round == k),
                                              default=0.0) for k in range(migration.rounds))) < 1e-9
    assert check_release_safety(old, new, failed, migration) == []
    contract = migration.to_json()
    assert set(contract) == {"transfers", "rounds", "makespan_s", "lower_bound_s"}
    assert all(set(t) == {"tensor", "src", "dst", "bytes", "round"} for t in contract["transfers"])
    json.dumps(contract)


@pytest.mark.parametrize("seed,tp,failures,memory", [(0, 1, 1, 12.0), (1, 2, 2, 12.0), (2, 1, 1, 100.0),
                                                     (3, 2, 1, 12.0), (5, 2, 2, 100.0), (6, 1, 2, 8.0)])
def test_migration_on_random_tiny_instances(seed: int, tp: int, failures: int, memory: float) -> None:
    inst, failed, new = _search(seed, tp, failures, memory)
    migration, rounds, info = communication_plan(inst, inst.plan, new, failed, Deadline.after(2.0))
    assert migration.plan is info.plan
    _check_migration(inst, failed, inst.plan, migration)
    assert migration.solve.status.value == "OPTIMAL"  # the full LP: its optimum is the bound
    assert migration.solve.bound <= migration.fluid_makespan_s + 1e-9
    json.dumps(info.to_json())


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([1, 2]), st.integers(1, 3), st.sampled_from([4.0, 6.0, 8.0, 100.0]),
       st.sampled_from([2, 3]))
def test_random_failures_end_to_end(seed: int, tp: int, failures: int, memory: float, nodes: int) -> None:
    """Random failures, uneven pipelines (small memories force several stages), lost shards."""
    inst = build_instance(tiny_instance(seed, nodes=nodes, per_node=4, blocks=6, micro_batches=8, memory_gib=memory,
                                       tp=tp), "<tiny>")
    failed = frozenset(random.Random(seed).sample(range(inst.num_devices), failures))
    result = search_plan(inst, failed, Deadline.after(2.0))
    assume(result.solution is not None)
    try:
        migration, rounds, info = communication_plan(inst, inst.plan, result.solution, failed, Deadline.after(2.0))
    except UnrecoverableError:  # only when some shard lost every replica
        held = old_holdings(inst.plan, failed)
        alive = {(layer, h.rank) for h in held.values() for layer in range(h.first, h.end)}
        assert any((layer, rank) not in alive for layer in range(inst.workload.num_layers) for rank in range(tp))
        return
    _check_migration(inst, failed, inst.plan, migration)
    _check_lowered(inst, info.plan, lower_plan(inst, info.plan, migration, rounds, failed), failed)


def test_migration_paper_32_both_backends_and_restricted(monkeypatch: pytest.MonkeyPatch) -> None:
    inst, model, found = bundled_recovery("paper-32")  # the search test_search_scale checks
    failed = frozenset({13})
    assert inst.failed_devices == failed
    new = found.solution
    plan, _ = assign_slots(model, inst.plan, new, failed)
    highs = schedule_migration(model, inst.plan, plan, failed, Deadline.after(5.0))
    cbc = schedule_migration(model, inst.plan, plan, failed, Deadline.after(5.0), backend="cbc")
    assert highs.solve.backend == "highs" and cbc.solve.backend == "cbc"
    assert abs(highs.fluid_makespan_s - cbc.fluid_makespan_s) <= 1e-6 * highs.fluid_makespan_s
    monkeypatch.setattr(migration_module, "FULL_VARIABLES", 10)
    monkeypatch.setattr(migration_module, "INTER_CANDIDATES", 1)
    restricted = schedule_migration(model, inst.plan, plan, failed, Deadline.after(5.0))
    assert "restricted" in restricted.solve.reason
    assert restricted.fluid_makespan_s >= highs.fluid_makespan_s - 1e-9
    for m in (highs, cbc, restricted):
        _check_migration(inst, failed, inst.plan, m)


def test_paper_example_device_4() -> None:
    inst = load_instance(ROOT / "instances" / "paper-example.json")
    failed = frozenset({4})
    new = search_plan(inst, failed, Deadline.after(5.0)).solution
    migration, rounds, info = communication_plan(inst, inst.plan, new, failed, Deadline.after(2.0))
    _check_migration(inst, failed, inst.plan, migration)
    assert migration.transfers == () and migration.makespan_s == 0.0  # its layers carry no bytes
    # the rerouted plan keeps the layout: nothing to migrate, the failed slot drops out of the groups
    rerouted = even_reroute(inst.plan, failed)
    migration, rounds, info = communication_plan(inst, inst.plan, rerouted, failed, Deadline.after(2.0))
    assert migration.transfers == () and info.plan.pipelines == rerouted.pipelines
    ranks = lower_plan(inst, info.plan, migration, rounds, failed)
    _check_lowered(inst, info.plan, ranks, failed)


def test_release_safety_detects_early_release() -> None:
    inst, failed, new = _search(0, 1, 1, 12.0)
    migration, _, info = communication_plan(inst, inst.plan, new, failed, Deadline.after(2.0))
    assert migration.transfers
    src = migration.transfers[-1].src
    early = dataclasses.replace(migration, release_after_round={**migration.release_after_round, src: -1})
    assert check_release_safety(inst.plan, info.plan, failed, early)
    short = dataclasses.replace(migration, transfers=migration.transfers[:-1])
    assert any("gets" in p for p in check_release_safety(inst.plan, info.plan, failed, short))


def test_lost_layer_is_unrecoverable() -> None:
    inst = build_instance(tiny_instance(1, nodes=2, per_node=3, tp=1), "<tiny>")
    stage0 = frozenset(p.stages[0].devices[0] for p in inst.plan.pipelines)
    survivors = [d for d in range(inst.num_devices) if d not in stage0]
    end = inst.plan.pipelines[0].stages[0].end
    new = Plan(1, (Pipeline((Stage((survivors[0],), 0, end), Stage((survivors[1],), end, inst.workload.num_layers)),
                            inst.global_micro_batches),))
    with pytest.raises(UnrecoverableError, match="checkpoint"):
        schedule_migration(PerfModel(inst), inst.plan, new, stage0, Deadline.after(5.0))
    with pytest.raises(UnrecoverableError):
        communication_plan(inst, inst.plan, new, stage0, Deadline.after(5.0))
    # with TP 2, losing one TP rank of every replica loses those shards even though rank 0 survives
    inst = build_instance(tiny_instance(2, nodes=2, per_node=4, tp=2), "<tiny>")
    rank1 = frozenset(p.stages[0].devices[1] for p in inst.plan.pipelines)
    new = Plan(2, (Pipeline((Stage((2, 3), 0, inst.workload.num_layers),), inst.global_micro_batches),))
    with pytest.raises(UnrecoverableError, match=r"TP ranks \[1\]"):
        schedule_migration(PerfModel(inst), inst.plan, new, rank1, Deadline.after(5.0))


# -- lowering ------------------------------------------------------------------------------------
def _check_lowered(inst, plan: Plan, lowered: dict[int, RankPlan], failed: frozenset[int]) -> None:
    ranks = {d: r.to_json() for d, r in lowered.items()}
    json.dumps(ranks)
    assert all(r["format"] == 1 for r in ranks.values())
    share: dict[tuple[int, int], float] = defaultdict(float)
    for rank in ranks.values():
        if rank["role"] != "train" or rank["tp_rank"] != 0:
            continue
        first, end = rank["layers"]
        assert len(rank["modules"]) == end - first
        for item in rank["micro_batches"]:
            for layer in range(first, end):
                share[(layer, item["id"])] += item["hi"] - item["lo"]
            for nxt in item["next"]:  # p2p symmetry: the next device lists this one as its prev
                peer = ranks[nxt["device"]]
                assert any(other["id"] == item["id"] and any(p["device"] == rank["rank"] for p in other["prev"])
                           for other in peer["micro_batches"])
    ids = range(inst.global_micro_batches)
    for layer in range(inst.workload.num_layers):
        for mb in ids:  # every micro-batch passes every layer exactly once
            assert abs(share[(layer, mb)] - 1.0) < 1e-9, (layer, mb, share[(layer, mb)])


@pytest.mark.parametrize("seed,tp,memory", [(0, 1, 12.0), (3, 2, 12.0)])
def test_lowered_plans(seed: int, tp: int, memory: float) -> None:
    inst, failed, new = _search(seed, tp, 1, memory)
    migration, rounds, info = communication_plan(inst, inst.plan, new, failed, Deadline.after(2.0))
    lowered = lower_plan(inst, info.plan, migration, rounds, failed)
    _check_lowered(inst, info.plan, lowered, failed)
    ranks = {d: r.to_json() for d, r in lowered.items()}
    sends = sum(1 for r in ranks.values() for t in r["transfers"] if t["op"] == "send")
    recvs = sum(1 for r in ranks.values() for t in r["transfers"] if t["op"] == "recv")
    assert sends == recvs == len(migration.transfers)
    in_rounds = {n for names in rounds for n in names}
    for r in ranks.values():
        assert {e["group"] for e in r["allreduce"]} <= in_rounds
        if r["role"] == "train":
            slot = (r["pipeline"], r["stage"])
            mine = {g.name for g in allreduce_groups(PerfModel(inst), info.plan, failed).values() if slot in g.slots}
            assert {e["group"] for e in r["allreduce"]} == mine
    absent = ["format", "rank", "node", "role", "pipeline", "stage", "layers", "modules", "micro_batches",
              "allreduce", "transfers", "release_after_round"]
    train = absent[:6] + ["num_stages", "tensor_parallel", "tp_rank", "tp_group", "layers", "modules",
                          "tied_embedding", "p2p"] + absent[8:]
    for r in ranks.values():  # the JSON's keys, in order, per role
        assert list(r) == (train if r["role"] == "train" else absent)
        assert all(list(t) == ["round", "op", "peer", "tensor", "bytes"] for t in r["transfers"])
    assert list(absent_rank_plan(inst, next(iter(failed)), "failed").to_json()) == absent
    with pytest.raises(ValueError):
        lower_plan(inst, info.plan, migration, [["no-such-group"]], failed)
