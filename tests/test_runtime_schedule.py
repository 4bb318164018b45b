"""The runtime's operation order (no torch): every lowered plan runs to completion with blocking
receives and non-blocking sends, forward before backward, and 1F1B's in-flight limit; a
bubble-filled rerouting's action lists (split backward: B, then W) too."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from chameleon_opt.comm.allreduce import schedule_allreduce
from chameleon_opt.comm.lowering import lower_plan
from chameleon_opt.instance.load import Instance, build_instance, load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.decision import decide
from chameleon_opt.planning import PlanningOptions, plan_recovery
from chameleon_opt.runtime.schedule import order_operations, planned_operations, sample_range, work_items
from chameleon_opt.solve.deadline import Deadline

ROOT = Path(__file__).resolve().parent.parent


def run_blocking(rank_plans: dict, orders: dict, mbs: int) -> None:
    """Execute every rank's order: a receive waits until the sender has run the operation that
    sends it (F and B communicate; a split backward's W is local). Fails on a deadlock (no rank
    can move)."""
    items = {d: work_items(p, mbs) for d, p in rank_plans.items() if p.role == "train"}
    done: set[tuple[int, str, int]] = set()  # (rank, kind, first sample of the piece)

    def sent(peer: int, kind: str, sample: int) -> bool:
        return any(it is not None and it.start <= sample < it.stop and (peer, kind, it.start) in done
                   for it in items[peer])

    cursor = {d: 0 for d in orders}
    while any(cursor[d] < len(orders[d]) for d in orders):
        moved = False
        for d, ops in orders.items():
            while cursor[d] < len(ops):
                kind, i = ops[cursor[d]]
                it = items[d][i]
                needs = {"F": it.receive_from, "B": it.send_to, "W": ()}[kind]
                if not all(sent(m.peer, kind, m.start) for m in needs):
                    break
                if kind == "B":
                    assert (d, "F", it.start) in done, "backward before its forward"
                if kind == "W":
                    assert (d, "B", it.start) in done, "weight gradient before the input gradient"
                done.add((d, kind, it.start))
                cursor[d] += 1
                moved = True
        assert moved, f"deadlock: ranks stuck at {cursor}"


def lowered(instance, plan, failed, migration=None, rounds=None):
    model = PerfModel(instance)
    rounds = rounds if rounds is not None else schedule_allreduce(model, plan, failed, Deadline.after(1.0)).rounds
    return lower_plan(instance, plan, migration, rounds, failed)


CASES = [("paper-example.json", (4,)), ("paper-example.json", (1, 6)), ("paper-32.json", (6, 13)),
         ("runtime-cpu-6.json", (1,)), ("runtime-cpu-4.json", (2,))]


@pytest.mark.parametrize("name,dead", CASES)
@pytest.mark.parametrize("policy", ["reroute", "reconfigure"])
def test_every_decided_plan_runs_without_deadlock(name: str, dead: tuple[int, ...], policy: str) -> None:
    instance = load_instance(ROOT / "instances" / name)
    failed = frozenset(dead)
    decision = decide(instance, failed, policy, deadline=Deadline.after(5.0))
    chosen = decision.chosen
    assert chosen is not None and chosen.plan is not None, decision.reason
    if chosen.communication is not None:
        migration, rounds, info = chosen.communication
        plans = lowered(instance, info.plan, failed, migration, rounds)
    else:
        plans = lowered(instance, chosen.plan, failed)
    mbs = instance.micro_batch_size
    orders = order_operations(plans, mbs)
    run_blocking(plans, orders, mbs)
    # each of its pieces runs forward and backward once
    for d, ops in orders.items():
        its = work_items(plans[d], mbs)
        assert sorted(ops) == sorted([(k, i) for i, it in enumerate(its) if it is not None for k in "FB"])
        in_flight, cap = 0, plans[d].num_stages - plans[d].stage
        for kind, _ in ops:
            in_flight += 1 if kind == "F" else -1
            assert in_flight <= cap  # 1F1B: at most stages - stage forwards in flight


def three_pipelines() -> Instance:
    """runtime-cpu-6's devices as PP2 x DP3: a lost stage's micro-batches go to two peers."""
    data = json.loads((ROOT / "instances" / "runtime-cpu-6.json").read_text())
    data["plan"]["layout"] = {"pipeline_parallel": 2, "data_parallel": 3}
    data["training"]["global_batch"] = 24
    return build_instance(data, "<runtime-cpu-6 as PP2 x DP3>")


@pytest.mark.parametrize("name,dead", [("runtime-cpu-4.json", (1,)), ("runtime-cpu-6.json", (1,)),
                                       ("runtime-cpu-6.json", (0, 5)),  # the two pipelines host each other
                                       ("PP2 x DP3", (1,))])            # one lost stage, two hosts
def test_a_bubble_filled_rerouting_runs_its_schedule_without_deadlock(name: str, dead: tuple[int, ...]) -> None:
    """The decision carries the priced schedule; each rank's action list is its device's order
    in it (every whole micro-batch F, B, W once), the rerouted micro-batches sit on the peers the
    schedule chose, and the lists run to completion with blocking receives."""
    instance = three_pipelines() if name == "PP2 x DP3" else load_instance(ROOT / "instances" / name)
    failed = frozenset(dead)
    decision = plan_recovery(dataclasses.replace(instance, failed_devices=failed), failed,
                             PlanningOptions("reroute", time_limit_s=1.0))
    schedule = decision.schedule
    assert schedule is not None, decision.candidates[0].reason
    plans = dict(decision.rank_plans)
    orders = planned_operations(plans)
    assert orders is not None
    run_blocking(plans, orders, instance.micro_batch_size)
    offsets = [0]
    for pipe in decision.plan.pipelines:
        offsets.append(offsets[-1] + pipe.micro_batches)
    if name == "PP2 x DP3":
        assert set(schedule.hosts.values()) == {1, 2}
    for d, plan in plans.items():
        slot = (plan.pipeline, plan.stage)
        assert plan.actions == tuple((kind, offsets[j] + k) for kind, j, k, _ in schedule.orders[slot])
        assert sorted(plan.actions) == sorted((kind, piece.id) for piece in plan.micro_batches for kind in "BFW")
        for piece in plan.micro_batches:  # rerouted work on the schedule's host, the rest at home
            k = piece.id - offsets[piece.pipeline]
            assert schedule.hosts.get((piece.pipeline, k, plan.stage), piece.pipeline) == plan.pipeline


@pytest.mark.parametrize("name,dead", [("runtime-cpu-6.json", (1,)), ("runtime-cpu-6.json", (0, 5)),
                                       ("PP2 x DP3", (1,)), ("paper-example.json", (1, 3))])
def test_the_greedy_list_schedule_runs_without_deadlock(monkeypatch, name: str, dead: tuple[int, ...]) -> None:
    """When CP-SAT finds nothing (stopped by the stall rule or the deadline) the rerouting runs
    the fallback schedule; where that is the greedy list schedule its action lists run to
    completion with blocking receives too."""
    import chameleon_opt.solve.bubbles as bubbles
    from chameleon_opt.solve.backends import Outcome
    from chameleon_opt.solve.result import Status

    monkeypatch.setattr(bubbles, "solve_cpsat", lambda *args, **kwargs: (
        None, Outcome(Status.NO_SOLUTION, None, None, 0.0, "UNKNOWN (stubbed)")))
    instance = three_pipelines() if name == "PP2 x DP3" else load_instance(ROOT / "instances" / name)
    failed = frozenset(dead)
    decision = plan_recovery(dataclasses.replace(instance, failed_devices=failed), failed,
                             PlanningOptions("reroute", time_limit_s=1.0))
    problem = bubbles.problem_for(PerfModel(instance), instance.plan, failed)
    greedy = bubbles.list_schedule(problem)
    assert decision.schedule is not None and decision.schedule.orders == greedy.orders
    plans = dict(decision.rank_plans)
    orders = planned_operations(plans)
    assert orders is not None
    run_blocking(plans, orders, instance.micro_batch_size)


def test_initial_plan_is_1f1b() -> None:
    instance = load_instance(ROOT / "instances" / "paper-example.json")
    plans = lowered(instance, instance.plan, frozenset())
    orders = order_operations(plans, 1)
    run_blocking(plans, orders, 1)
    first_stage = next(d for d, p in plans.items() if p.stage == 0)
    kinds = "".join(k for k, _ in orders[first_stage])
    assert kinds == "FFF" + "BF" * 2 + "BBB"  # 3-stage warm-up, steady 1F1B, cool-down


def test_pieces_partition_micro_batches() -> None:
    for mbs in (1, 2, 3, 4, 7):
        cuts = [0.0, 1 / 3, 0.5, 2 / 3, 1.0]
        ranges = [sample_range(5, a, b, mbs) for a, b in zip(cuts, cuts[1:])]
        assert ranges[0][0] == 5 * mbs and ranges[-1][1] == 6 * mbs
        assert all(r[1] == s[0] for r, s in zip(ranges, ranges[1:]))
