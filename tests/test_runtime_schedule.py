"""The runtime's operation order (no torch): every lowered plan runs to completion with blocking
receives and non-blocking sends, forward before backward, and 1F1B's in-flight limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from chameleon_opt.comm.allreduce import schedule_allreduce
from chameleon_opt.comm.lowering import lower_plan
from chameleon_opt.instance.load import load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.decision import decide
from chameleon_opt.runtime.schedule import order_operations, sample_range, work_items
from chameleon_opt.solve.deadline import Deadline

ROOT = Path(__file__).resolve().parent.parent


def run_blocking(rank_plans: dict, orders: dict, mbs: int) -> None:
    """Execute every rank's order: a receive waits until the sender has run the operation that
    sends it. Fails on a deadlock (no rank can move)."""
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
                needs = it.receive_from if kind == "F" else it.send_to
                if not all(sent(m.peer, kind, m.start) for m in needs):
                    break
                if kind == "B":
                    assert (d, "F", it.start) in done, "backward before its forward"
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
