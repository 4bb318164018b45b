"""Lowering: one executable plan per rank, the future runtime's only input.

Everything a rank needs without seeing the global plan: which modules it owns, which micro-batch
(pieces) it computes and whom it receives them from and sends them to, which all-reduce rings it
joins in which round, which state it sends or receives in which migration round (as a range of the
receiver's state, `StateShare`), and when it may free its old state. One frozen record per rank
(`RankPlan`), built here once and read by both runtimes, the API and `export-plan`; its `to_json`
is the versioned (`"format"`) JSON a trainer in another language reads.

Micro-batch ids: global ids 0..N-1, pipeline j owning the next m_j ids in pipeline order. Rerouted
work (plan.rerouted: pipeline j's micro-batches of stage s computed by pipeline k's stage s) is cut
from the front of j's ids in the order of the entries; shares may be fractional (the reroute model
cuts micro-batches into sample groups), so every work item is a piece [lo, hi) of one micro-batch
(whole ones are [0, 1)). Its `prev` / `next` list the devices (same TP rank) that compute the same
piece at the neighbouring stage of the owning pipeline, with the overlapping sample fractions.

A bubble-filled rerouting (solve/bubbles.py) also fixes *when*: each train rank gets its device's
order of the priced schedule as `actions`, (kind, micro-batch id) with the backward split into B
(input gradient) and W (weight gradient). Without one a runtime orders the work itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from chameleon_opt.comm.allreduce import allreduce_groups
from chameleon_opt.comm.transfers import Migration
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.solve.bubbles import BubbleSchedule

FORMAT = 1
EPS = 1e-9

Piece = tuple[int, float, float, tuple[int, int]]  # (micro-batch id, lo, hi, computing slot)
Action = tuple[str, int]  # (F | B | W, micro-batch id): one op of a bubble-filled schedule


@dataclass(frozen=True)
class StateShare:
    """One scheduled transfer (`nbytes` of `tensor`) as the part [lo, hi) of the receiver's state
    of `layer` (fractions of its flat parameters and both optimizer moments): the byte shares of
    the layer's sources laid end to end. `tag` is one global order, so that both ends of a
    transfer match it."""

    src: int
    dst: int
    layer: int
    round: int
    tag: int
    lo: float
    hi: float
    tensor: str
    nbytes: int

    def elements(self, count: int) -> tuple[int, int]:
        """[lo, hi) in elements of a flat state of `count` elements (both runtimes cut the same way)."""
        return round(self.lo * count), round(self.hi * count)


def state_shares(migration: Migration | None) -> list[StateShare]:
    """The migration's transfers cut into state ranges, once, for every runtime."""
    if migration is None:
        return []
    moves = sorted(migration.transfers, key=lambda t: (t.dst, t.layer, t.round, t.src))
    totals: dict[tuple[int, int], int] = {}
    for t in moves:
        totals[(t.dst, t.layer)] = totals.get((t.dst, t.layer), 0) + t.nbytes
    cursor: dict[tuple[int, int], int] = {}
    shares = []
    for tag, t in enumerate(moves):
        key = (t.dst, t.layer)
        lo = cursor.get(key, 0)
        cursor[key] = lo + t.nbytes
        shares.append(StateShare(t.src, t.dst, t.layer, t.round, tag, lo / totals[key], cursor[key] / totals[key],
                                 t.tensor, t.nbytes))
    return shares


@dataclass(frozen=True)
class Link:
    """The part [lo, hi) of a piece that `device` (same TP rank) computes at the neighbouring stage."""

    device: int
    lo: float
    hi: float

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "lo": self.lo, "hi": self.hi}


@dataclass(frozen=True)
class WorkPiece:
    """The piece [lo, hi) of micro-batch `id` (owned by `pipeline`) that a rank computes, and the
    ranks it receives it from (`prev`) and sends it to (`next`)."""

    id: int
    lo: float
    hi: float
    pipeline: int
    prev: tuple[Link, ...]
    next: tuple[Link, ...]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "lo": self.lo, "hi": self.hi, "pipeline": self.pipeline,
                "prev": [p.to_json() for p in self.prev], "next": [n.to_json() for n in self.next]}


@dataclass(frozen=True)
class Ring:
    """A gradient all-reduce group this rank joins: its devices (this rank's TP rank), the layers
    whose gradients it sums and the round it runs in."""

    round: int
    group: str
    layers: tuple[int, ...]
    ring: tuple[int, ...]
    nbytes: int

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "group": self.group, "layers": list(self.layers), "ring": list(self.ring),
                "bytes": self.nbytes}


@dataclass(frozen=True)
class RankTransfer:
    """This rank's side (`send` to or `recv` from `peer`) of one migration transfer."""

    op: Literal["send", "recv"]
    peer: int
    share: StateShare

    def to_json(self) -> dict[str, Any]:
        return {"round": self.share.round, "op": self.op, "peer": self.peer, "tensor": self.share.tensor,
                "bytes": self.share.nbytes}


Role = Literal["train", "source", "idle", "failed"]


@dataclass(frozen=True)
class RankPlan:
    """What one rank runs next: a `train` rank's slot (pipeline, stage, TP rank and group,
    layers and modules, point-to-point neighbours), its micro-batch pieces and all-reduce rings;
    for every role its migration transfers and the round after which it may free its old state.
    A `source` only sends state; an `idle` spare and a `failed` device have no work, so that every
    process of a job can ask the same question. The train-only fields are None (or empty) for the
    other roles."""

    rank: int
    node: int
    role: Role
    pipeline: int | None = None
    stage: int | None = None
    num_stages: int | None = None
    tensor_parallel: int | None = None
    tp_rank: int | None = None
    tp_group: tuple[int, ...] = ()
    layers: tuple[int, int] | None = None
    modules: tuple[str, ...] = ()
    tied_embedding: bool = False
    # The previous / next stage's device of this TP rank in this pipeline: None on the first / last
    # stage, and where that stage was lost and rerouted (its work's peers are the pieces' links).
    prev_device: int | None = None
    next_device: int | None = None
    micro_batches: tuple[WorkPiece, ...] = ()
    allreduce: tuple[Ring, ...] = ()
    transfers: tuple[RankTransfer, ...] = ()
    release_after_round: int | None = None
    # A bubble-filled rerouting's op order for this rank (F, B = input gradient, W = weight
    # gradient); empty when the plan fixes no order.
    actions: tuple[Action, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The rank plan as plain JSON types (format FORMAT; the train-only keys on train ranks only)."""
        out: dict[str, Any] = {"format": FORMAT, "rank": self.rank, "node": self.node, "role": self.role,
                               "pipeline": self.pipeline, "stage": self.stage}
        if self.role == "train":
            assert self.layers is not None
            out.update({"num_stages": self.num_stages, "tensor_parallel": self.tensor_parallel,
                        "tp_rank": self.tp_rank, "tp_group": list(self.tp_group)})
        out.update({"layers": list(self.layers) if self.layers is not None else None, "modules": list(self.modules)})
        if self.role == "train":
            out.update({"tied_embedding": self.tied_embedding, "p2p": {"prev": self.prev_device, "next": self.next_device}})
        out.update({"micro_batches": [m.to_json() for m in self.micro_batches],
                    "allreduce": [r.to_json() for r in self.allreduce],
                    "transfers": [t.to_json() for t in self.transfers],
                    "release_after_round": self.release_after_round})
        if self.actions:
            out["actions"] = self.torch_actions()
        return out

    def torch_actions(self) -> list[str]:
        """`actions` in torch pipelining's notation: stage, F, I (a split backward's B: torch's
        input gradient) or W, micro-batch id (`1F4`, `1I4`, `1W4`)."""
        split = any(kind == "W" for kind, _ in self.actions)
        return [f"{self.stage}{'I' if split and kind == 'B' else kind}{mb}" for kind, mb in self.actions]


def module_names(num_layers: int, first: int, end: int) -> list[str]:
    """`embedding`, `block1`..`blockL`, `head` for layers [first, end)."""
    return ["embedding" if layer == 0 else "head" if layer == num_layers - 1 else f"block{layer}"
            for layer in range(first, end)]


def _pieces(start: float, stop: float, offset: int, slot: tuple[int, int]) -> list[Piece]:
    """Positions [start, stop) of a pipeline's micro-batches as pieces of whole ids."""
    out: list[Piece] = []
    for i in range(int(math.floor(start + EPS)), int(math.ceil(stop - EPS))):
        lo, hi = max(start, i) - i, min(stop, i + 1) - i
        if hi - lo > EPS:
            out.append((offset + i, 0.0 if lo < EPS else lo, 1.0 if hi > 1 - EPS else hi, slot))
    return out


def stage_work(plan: Plan, failed: frozenset[int]) -> dict[tuple[int, int], list[Piece]]:
    """(owning pipeline, stage) -> the pieces of its micro-batches and the slot computing each."""
    offsets, total = [], 0
    for pipe in plan.pipelines:
        offsets.append(total)
        total += pipe.micro_batches
    work: dict[tuple[int, int], list[Piece]] = {}
    for j, pipe in enumerate(plan.pipelines):
        for s, stage in enumerate(pipe.stages):
            cursor, pieces = 0.0, []
            for r in plan.rerouted:
                if (r.from_pipeline, r.stage) == (j, s) and r.micro_batches > EPS:
                    stop = min(cursor + r.micro_batches, pipe.micro_batches)
                    pieces += _pieces(cursor, stop, offsets[j], (r.to_pipeline, s))
                    cursor = stop
            if pipe.micro_batches - cursor > EPS:
                if failed.intersection(stage.devices):
                    raise ValueError(f"pipeline {j} stage {s} has failed devices and un-rerouted micro-batches")
                pieces += _pieces(cursor, pipe.micro_batches, offsets[j], (j, s))
            work[(j, s)] = pieces
    return work


def _neighbours(index: dict[tuple[int, int], dict[int, list[Piece]]], owner: int, stage: int, mb: int,
                lo: float, hi: float) -> list[tuple[tuple[int, int], float, float]]:
    """Slots computing the overlapping part of micro-batch `mb` at `stage` of pipeline `owner`."""
    return [(slot, max(lo, olo), min(hi, ohi)) for _, olo, ohi, slot in index.get((owner, stage), {}).get(mb, ())
            if min(hi, ohi) - max(lo, olo) > EPS]


def _device(plan: Plan, slot: tuple[int, int], rank: int) -> int:
    return plan.pipelines[slot[0]].stages[slot[1]].devices[rank]


class LoweredPlan(Mapping[int, RankPlan]):
    """Rank -> its executable plan, built per rank on first access.

    The shared indexes (pieces per slot, all-reduce groups and rounds, transfers per device) are
    built once, on the first access; a rank's plan only when asked for. A trainer process asks
    for its own rank only, and a decision at 16,384 devices need not lower every rank."""

    def __init__(self, instance: Instance, plan: Plan, migration: Migration | None,
                 allreduce_rounds: list[list[str]], failed: frozenset[int] | None = None,
                 schedule: BubbleSchedule | None = None) -> None:
        self.instance, self.plan, self.migration, self.rounds = instance, plan, migration, allreduce_rounds
        self.schedule = schedule
        self.failed = instance.failed_devices if failed is None else failed
        self.slot_of = {d: (j, s) for j, pipe in enumerate(plan.pipelines) for s, stage in enumerate(pipe.stages)
                        if not self.failed.intersection(stage.devices) for d in stage.devices}
        self.sources = sorted({t.src for t in migration.transfers} - self.slot_of.keys()) if migration else []
        self._index: dict[str, Any] | None = None
        self._cache: dict[int, RankPlan] = {}
        self._slot_items: dict[tuple[int, int], tuple[list, list]] = {}

    def __len__(self) -> int:
        return len(self.slot_of) + len(self.sources)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted([*self.slot_of, *self.sources]))

    def __contains__(self, device: object) -> bool:
        return device in self.slot_of or device in self.sources

    def _shared(self) -> dict[str, Any]:
        if self._index is not None:
            return self._index
        plan, failed = self.plan, self.failed
        groups = allreduce_groups(PerfModel(self.instance), plan, failed)
        unknown = [name for names in self.rounds for name in names if name not in groups]
        if unknown:
            raise ValueError(f"all-reduce groups {unknown[:5]} are not groups of this plan")
        round_of = {name: k for k, names in enumerate(self.rounds) for name in names}
        index: dict[tuple[int, int], dict[int, list[Piece]]] = {}
        by_slot: dict[tuple[int, int], list[tuple[Piece, int]]] = {}
        for (owner, s), pieces in stage_work(plan, failed).items():
            for piece in pieces:
                index.setdefault((owner, s), {}).setdefault(piece[0], []).append(piece)
                by_slot.setdefault(piece[3], []).append((piece, owner))
        groups_of: dict[tuple[int, int], list[str]] = {}
        for g in groups.values():
            if g.name in round_of:
                for slot in g.slots:
                    groups_of.setdefault(slot, []).append(g.name)
        transfers: dict[int, list[RankTransfer]] = {}
        for share in state_shares(self.migration):
            transfers.setdefault(share.src, []).append(RankTransfer("send", share.dst, share))
            transfers.setdefault(share.dst, []).append(RankTransfer("recv", share.src, share))
        self._index = {"groups": groups, "round_of": round_of, "index": index, "by_slot": by_slot,
                       "groups_of": groups_of, "transfers": transfers,
                       "release": self.migration.release_after_round if self.migration is not None else {}}
        return self._index

    def _slot(self, slot: tuple[int, int]) -> tuple[list, list]:
        """The slot's work items with their neighbours' slots, and its all-reduce groups (once per
        slot, instantiated per TP rank)."""
        if slot not in self._slot_items:
            shared = self._shared()
            j, s = slot
            mine = []
            for (mb, lo, hi, _), owner in sorted(shared["by_slot"].get(slot, []), key=lambda e: (e[0][0], e[0][1])):
                mine.append((mb, lo, hi, owner, _neighbours(shared["index"], owner, s - 1, mb, lo, hi),
                             _neighbours(shared["index"], owner, s + 1, mb, lo, hi)))
            names = sorted(shared["groups_of"].get(slot, []), key=lambda n: (shared["round_of"][n], n))
            self._slot_items[slot] = (mine, names)
        return self._slot_items[slot]

    def _neighbour(self, slot: tuple[int, int], rank: int) -> int | None:
        """The device of TP rank `rank` at `slot`, if that stage exists and is live (a lost stage's
        surviving devices are idle, not peers)."""
        j, s = slot
        if not 0 <= s < len(self.plan.pipelines[j].stages):
            return None
        device = _device(self.plan, slot, rank)
        return device if self.slot_of.get(device) == slot else None

    def __getitem__(self, d: int) -> RankPlan:
        if d in self._cache:
            return self._cache[d]
        if d not in self:
            raise KeyError(d)
        shared, plan, instance = self._shared(), self.plan, self.instance
        moves = tuple(sorted(shared["transfers"].get(d, []), key=lambda t: (t.share.round, t.op, t.peer)))
        release = shared["release"].get(d)
        if d not in self.slot_of:
            self._cache[d] = RankPlan(d, instance.node_of(d), "source", transfers=moves, release_after_round=release)
            return self._cache[d]
        j, s = self.slot_of[d]
        pipe, stage = plan.pipelines[j], plan.pipelines[j].stages[s]
        rank = stage.devices.index(d)
        mine, names = self._slot((j, s))
        groups, round_of = shared["groups"], shared["round_of"]
        num_layers = instance.workload.num_layers
        tied = instance.workload.architecture is not None and instance.workload.architecture.tied_embeddings
        items = tuple(WorkPiece(mb, lo, hi, owner, tuple(Link(_device(plan, slot, rank), a, b) for slot, a, b in prev),
                                tuple(Link(_device(plan, slot, rank), a, b) for slot, a, b in nxt))
                      for mb, lo, hi, owner, prev, nxt in mine)
        rings = tuple(Ring(round_of[name], name, tuple(groups[name].layers),
                           tuple(_device(plan, slot, rank) for slot in groups[name].slots), groups[name].nbytes)
                      for name in names)
        self._cache[d] = RankPlan(
            d, instance.node_of(d), "train", pipeline=j, stage=s, num_stages=len(pipe.stages),
            tensor_parallel=plan.tensor_parallel, tp_rank=rank, tp_group=tuple(stage.devices),
            layers=(stage.first, stage.end), modules=tuple(module_names(num_layers, stage.first, stage.end)),
            tied_embedding=bool(tied and (stage.first == 0 or stage.end == num_layers)),
            prev_device=self._neighbour((j, s - 1), rank), next_device=self._neighbour((j, s + 1), rank),
            micro_batches=items, allreduce=rings, transfers=moves, release_after_round=release,
            actions=self._actions((j, s), items))
        return self._cache[d]

    def _actions(self, slot: tuple[int, int], items: tuple[WorkPiece, ...]) -> tuple[Action, ...]:
        """The schedule's order of `slot` in global micro-batch ids, checked against the slot's
        pieces: every piece whole and run once per kind (the rerouted plan must be the one the
        schedule placed, `bubbles.whole_reroutes`)."""
        if self.schedule is None:
            return ()
        offsets = [0]
        for pipe in self.plan.pipelines:
            offsets.append(offsets[-1] + pipe.micro_batches)
        actions = tuple((kind, offsets[j] + k) for kind, j, k, _ in self.schedule.orders.get(slot, ()))
        kinds = sorted({kind for kind, _ in actions})
        expected = sorted((kind, piece.id) for piece in items for kind in kinds)
        if any((piece.lo, piece.hi) != (0.0, 1.0) for piece in items) or sorted(actions) != expected:
            raise ValueError(f"slot {slot}: the bubble schedule's operations are not the plan's micro-batches")
        return actions


def absent_rank_plan(instance: Instance, device: int, role: Literal["idle", "failed"]) -> RankPlan:
    """The executable plan of a device with no part in the plan (`failed`, or an `idle` spare):
    no work, so that every process of a job can ask the same question."""
    return RankPlan(device, instance.node_of(device), role)


def lower_plan(instance: Instance, plan: Plan, migration: Migration | None, allreduce_rounds: list[list[str]],
               failed: frozenset[int] | None = None) -> dict[int, RankPlan]:
    """Rank -> its executable plan, every rank at once: every live device of
    `plan` and every device that only sources migration transfers (see `LoweredPlan`)."""
    lowered = LoweredPlan(instance, plan, migration, allreduce_rounds, failed)
    return {d: lowered[d] for d in lowered}
