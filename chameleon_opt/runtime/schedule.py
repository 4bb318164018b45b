"""The order in which each rank runs its forward and backward work items (no torch).

A rank plan (`chameleon_opt.comm.lowering.RankPlan`) tells each rank *what* to compute: pieces of
micro-batches, including pieces rerouted from a failed peer, with the ranks that feed them and that
they feed. This module decides *when*, globally: it list-schedules the operation graph of all
ranks (forward after the pieces it receives, backward after the pieces downstream and after its own
forward) with the 1F1B rule on every rank (backward first; at most `stages - stage` forwards in
flight, the 1F1B warm-up). Every rank then runs its operations in that order. Because the order
comes from one simulated schedule that respects every dependency, and sends never block, no
rank can wait on a peer that waits on it: the runtime cannot deadlock, whatever the pipeline lengths,
micro-batch counts or rerouted pieces.

Samples: a piece [lo, hi) of micro-batch `id` covers global samples
[id x mbs + round(lo x mbs), id x mbs + round(hi x mbs)); every rank rounds the same way, so
neighbouring pieces agree on the samples they exchange and the pieces of a micro-batch partition it.

A bubble-filled rerouting comes with its order already fixed (`RankPlan.actions`, the priced
schedule of solve/bubbles.py): `planned_operations` takes it as is, with the backward split into
B (input gradient, which the previous stage waits for) and W (weight gradient, local). It cannot
deadlock either. The schedule was re-timed (`bubbles.retime`): every op starts after the ops it
receives from end, and each rank's order is by start time. Suppose ranks were stuck, and take the
stuck receive whose op o starts earliest; it waits on an op p of rank r, which ends before o
starts. Had r run p, its send would be posted (sends never block) and o would not wait; so r is
stuck at an op at or before p, which starts no later than p, before o: o was not the earliest.
W receives and sends nothing.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass

from chameleon_opt.comm.lowering import Link, RankPlan

Op = tuple[str, int]  # ("F" | "B" | "W", index into the rank plan's micro_batches)


def sample_range(mb: int, lo: float, hi: float, mbs: int) -> tuple[int, int]:
    """Global sample indices [start, stop) of a piece (round half up, the same on every rank)."""
    return mb * mbs + math.floor(lo * mbs + 0.5), mb * mbs + math.floor(hi * mbs + 0.5)


@dataclass(frozen=True)
class Message:
    """Activations (forward) or their gradients (backward) for samples [start, stop) with one peer."""

    peer: int
    start: int
    stop: int

    def tag(self, backward: bool) -> int:
        """Unique per pair of ranks and step: the first sample and the direction."""
        return 2 * self.start + int(backward)


@dataclass(frozen=True)
class WorkItem:
    """One piece a rank computes: its samples and the messages around it."""

    start: int
    stop: int
    receive_from: tuple[Message, ...]  # forward inputs (and, mirrored, where input gradients go)
    send_to: tuple[Message, ...]       # forward outputs (and, mirrored, where output gradients come from)


def work_items(rank_plan: RankPlan, mbs: int) -> list[WorkItem | None]:
    """The rank plan's pieces as sample ranges; None for a piece that rounds to no sample."""
    items: list[WorkItem | None] = []
    for piece in rank_plan.micro_batches:
        start, stop = sample_range(piece.id, piece.lo, piece.hi, mbs)

        def messages(links: tuple[Link, ...]) -> tuple[Message, ...]:
            out = []
            for link in sorted(links, key=lambda e: e.lo):
                a, b = sample_range(piece.id, link.lo, link.hi, mbs)
                if b > a:
                    out.append(Message(link.device, a, b))
            return tuple(out)

        items.append(WorkItem(start, stop, messages(piece.prev), messages(piece.next)) if stop > start else None)
    return items


def order_operations(rank_plans: Mapping[int, RankPlan], mbs: int) -> dict[int, list[Op]]:
    """Rank -> its operations in execution order (see the module docstring)."""
    trainers = {d: p for d, p in rank_plans.items() if p.role == "train"}
    items = {d: work_items(p, mbs) for d, p in trainers.items()}
    producers: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for d, its in items.items():
        for i, it in enumerate(its):
            if it is None:
                continue
            producers[(d, i)] = [(m.peer, _owner(items, m.peer, m.start)) for m in it.receive_from]
    for capped in (True, False):  # 1F1B caps first; without caps if they ever stall
        order = _list_schedule(trainers, items, producers, capped)
        if order is not None:
            return order
    raise AssertionError("the operation graph of the lowered plan has a cycle (a lowering bug)")


def planned_operations(rank_plans: Mapping[int, RankPlan]) -> dict[int, list[Op]] | None:
    """Rank -> its operations in the order the plan fixed (`RankPlan.actions`), or None when the
    plan fixes none (then `order_operations` orders them). Every train rank with work in such a
    plan has one."""
    trainers = {d: p for d, p in rank_plans.items() if p.role == "train"}
    if not any(p.actions for p in trainers.values()):
        return None
    missing = sorted(d for d, p in trainers.items() if p.micro_batches and not p.actions)
    if missing:
        raise ValueError(f"ranks {missing} have work but no action list while others have one")
    orders = {}
    for d, plan in trainers.items():
        index = {piece.id: i for i, piece in enumerate(plan.micro_batches)}
        orders[d] = [(kind, index[mb]) for kind, mb in plan.actions]
    return orders


def _owner(items: dict[int, list[WorkItem | None]], device: int, sample: int) -> int:
    """Index of the piece at `device` that contains `sample`."""
    for i, it in enumerate(items[device]):
        if it is not None and it.start <= sample < it.stop:
            return i
    raise AssertionError(f"rank {device} computes no piece holding sample {sample} (a lowering bug)")


def _list_schedule(trainers: dict[int, RankPlan], items: dict[int, list[WorkItem | None]],
                   producers: dict[tuple[int, int], list[tuple[int, int]]], capped: bool) -> dict[int, list[Op]] | None:
    """Event simulation: each idle rank starts its highest-priority ready operation. Duration of a
    piece = samples x layers (backward twice the forward). None when it stalls."""
    done_f: dict[tuple[int, int], float] = {}
    done_b: dict[tuple[int, int], float] = {}
    busy_until = {d: 0.0 for d in trainers}
    in_flight = {d: 0 for d in trainers}
    order: dict[int, list[Op]] = {d: [] for d in trainers}
    pending_f = {d: [i for i, it in enumerate(its) if it is not None] for d, its in items.items()}
    pending_b = {d: list(pending_f[d]) for d in items}
    total = sum(len(v) for v in pending_f.values()) * 2
    events: list[tuple[float, int]] = [(0.0, d) for d in trainers]
    heapq.heapify(events)
    finished = 0
    while events:
        now, d = heapq.heappop(events)
        if busy_until[d] > now:
            continue
        plan, its = trainers[d], items[d]
        assert plan.layers is not None and plan.stage is not None and plan.num_stages is not None
        layers = plan.layers[1] - plan.layers[0]
        last = plan.stage == plan.num_stages - 1
        cap = plan.num_stages - plan.stage if capped else math.inf
        op = None
        for i in pending_b[d]:
            it = its[i]
            assert it is not None
            after = [done_f.get((d, i), math.inf)]
            if not last:
                after += [done_b.get((m.peer, _owner(items, m.peer, m.start)), math.inf) for m in it.send_to]
            if max(after) <= now:
                op = ("B", i)
                break
        if op is None and in_flight[d] < cap:
            for i in pending_f[d]:
                if all(done_f.get(dep, math.inf) <= now for dep in producers[(d, i)]):
                    op = ("F", i)
                    break
        if op is None:
            continue  # woken again when a dependency finishes
        kind, i = op
        it = its[i]
        assert it is not None
        length = (it.stop - it.start) * max(layers, 1) * (2 if kind == "B" else 1)
        end = now + length
        busy_until[d] = end
        order[d].append(op)
        finished += 1
        if kind == "F":
            pending_f[d].remove(i)
            in_flight[d] += 1
            done_f[(d, i)] = end
        else:
            pending_b[d].remove(i)
            in_flight[d] -= 1
            done_b[(d, i)] = end
        heapq.heappush(events, (end, d))
        # wake everyone at `end`: a finished operation may make work ready anywhere
        for other in trainers:
            if other != d:
                heapq.heappush(events, (max(end, busy_until[other]), other))
        if finished == total:
            return order
    return order if finished == total else None


def torch_actions(rank_plan: RankPlan, ops: list[Op]) -> list[str]:
    """A rank's operation order in torch.distributed.pipelining's action notation: stage index,
    computation, micro-batch id (`0F0`, `1B3`), so that this scheduler's orders (rerouted plans run
    on it) read side by side with torch's schedules. With the backward split, B is torch's `I`
    (input gradient) and W its `W` (`1I3`, `1W3`). A piece of a micro-batch (rerouted work) keeps
    its fraction: `1F3[0.5:1]`."""
    split = any(kind == "W" for kind, _ in ops)
    out = []
    for kind, i in ops:
        entry = rank_plan.micro_batches[i]
        piece = "" if (entry.lo, entry.hi) == (0.0, 1.0) else f"[{entry.lo:g}:{entry.hi:g}]"
        out.append(f"{rank_plan.stage}{'I' if split and kind == 'B' else kind}{entry.id}{piece}")
    return out
