"""Who holds which model state: the bookkeeping every communication model starts from.

A *tensor* is one TP shard of one layer's model state: `layer{l}.tp{r}` holds the parameters and
optimizer state of layer l's shard r, `params[l] / TP x (param_bytes + optimizer_bytes)` bytes
(gradients are recomputed in the next step, so they never move). A live device holds, from the old
plan, the shards of its old stage's layers at its old TP rank; a device of the new plan needs the
shards of its new stage's layers at its new TP rank. With TP > 1 a shard is not interchangeable with
another rank's shard, so a source must have held the same layer *and* the same rank.

Under ZeRO (`training.zero_stage` >= 1, Megatron's distributed optimizer, FSDP) part of a tensor is
*sharded* over the layer's data-parallel group, the slots holding the layer in plan order (as the
memory model divides it, perf/memory.py `zero_shards`): the optimizer state from stage 1, the
parameters too at stage 3 (stage 2's gradients never move). The slot in position k of the D
holding layer l keeps bytes [floor(k S / D), floor((k + 1) S / D)) of its S sharded bytes, the
whole of the rest (`state_bytes`). So a device holds its shard before and after: in the new plan
it needs its new range minus the part of its old range it keeps, each missing byte from the one
old holder whose range covers it (FSDP2 shards every parameter this way, dim 0 over the group;
Megatron's distributed optimizer cuts its buffer in contiguous ranges, which this even split per
layer matches in bytes per device, not in which bytes). There is one copy of each range: when
its holder failed the bytes are gone and only a checkpoint has them (UnrecoverableError, exit 5).

Layers are grouped into *segments*: maximal runs of layers covered by the same set of old slots.
Every layer of a segment has the same holders, so one solver variable per (receiver, segment,
source) is exact and much smaller than one per (receiver, layer, source).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from chameleon_opt.errors import UnrecoverableError
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Plan


def tensor_name(layer: int, rank: int) -> str:
    return f"layer{layer}.tp{rank}"


def tensor_bytes(model: PerfModel, tp: int) -> np.ndarray:
    """Integer bytes of one TP shard of every layer's parameters + optimizer state (rounded to the
    byte: transfers carry whole bytes and must sum exactly to the tensor)."""
    per_param = model.param_bytes + model.optimizer_bytes
    return np.rint(model.workload.params / tp * per_param).astype(np.int64)


def state_bytes(model: PerfModel, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """(replicated, sharded) integer bytes per layer of one TP shard's state, summing to
    `tensor_bytes`: under ZeRO stage >= 1 the optimizer state, at stage 3 the parameters too, are
    sharded over the layer's data-parallel group; every replica holds the rest whole."""
    whole = tensor_bytes(model, tp)
    per_param = (model.optimizer_bytes if model.zero_stage >= 1 else 0.0) + \
        (model.param_bytes if model.zero_stage >= 3 else 0.0)
    sharded = np.minimum(np.rint(model.workload.params / tp * per_param).astype(np.int64), whole)
    return whole - sharded, sharded


def shard_range(sharded: int, position: int, group: int) -> tuple[int, int]:
    """Bytes [lo, hi) of a layer's `sharded` bytes kept by the slot in `position` of the `group`
    slots holding it (in plan order)."""
    return sharded * position // group, sharded * (position + 1) // group


def data_parallel_groups(plan: Plan, slots: list[tuple[int, int]] | None = None) -> dict[int, list[tuple[int, int]]]:
    """Layer -> the (pipeline, stage) slots holding it, in plan order: the group its ZeRO-sharded
    state is divided over (all slots, or `slots`)."""
    chosen = None if slots is None else set(slots)
    groups: dict[int, list[tuple[int, int]]] = {}
    for j, pipe in enumerate(plan.pipelines):
        for s, stage in enumerate(pipe.stages):
            if chosen is None or (j, s) in chosen:
                for layer in range(stage.first, stage.end):
                    groups.setdefault(layer, []).append((j, s))
    return groups


@dataclass(frozen=True)
class Holding:
    """The old state on one live device: layers [first, end) at TP rank `rank`."""

    first: int
    end: int
    rank: int


@lru_cache(maxsize=8)
def old_holdings(old: Plan, failed: frozenset[int]) -> dict[int, Holding]:
    """Every live device of the old plan and the shard range it holds (failed devices hold nothing:
    their memory is gone; live members of a dead TP group still hold their own shards). Cached:
    every step asks again; callers must not modify the result."""
    held: dict[int, Holding] = {}
    for pipe in old.pipelines:
        for stage in pipe.stages:
            for rank, d in enumerate(stage.devices):
                if d not in failed:
                    held[d] = Holding(stage.first, stage.end, rank)
    return held


def live_slots(plan: Plan, failed: frozenset[int]) -> list[tuple[int, int]]:
    """(pipeline, stage) positions whose whole TP group is alive (dead ones are rerouted)."""
    return [(j, s) for j, pipe in enumerate(plan.pipelines) for s, stage in enumerate(pipe.stages)
            if not failed.intersection(stage.devices)]


@dataclass(frozen=True)
class Need:
    """Missing layers of one receiving device within one segment: one variable row of the solver."""

    dst: int
    rank: int
    segment: int
    layers: tuple[int, ...]
    nbytes: int
    holders: tuple[int, ...]  # live devices that held these layers at `rank` in the old plan
    sizes: tuple[int, ...] | None = None  # bytes of each of `layers` wanted here; None: their whole tensors


class Segments:
    """Old-plan segments and their holders per TP rank (computed lazily, cached)."""

    def __init__(self, old: Plan, failed: frozenset[int], num_layers: int) -> None:
        cuts = {0, num_layers}
        for pipe in old.pipelines:
            for stage in pipe.stages:
                cuts.update((stage.first, stage.end))
        self.bounds = np.array(sorted(c for c in cuts if 0 <= c <= num_layers), dtype=np.int64)
        self.of_layer = np.searchsorted(self.bounds, np.arange(num_layers), side="right") - 1
        self._covering: list[list[tuple[int, ...]]] = [[] for _ in range(len(self.bounds) - 1)]
        for pipe in old.pipelines:
            for stage in pipe.stages:
                for g in range(int(np.searchsorted(self.bounds, stage.first)),
                               int(np.searchsorted(self.bounds, stage.end))):
                    self._covering[g].append(stage.devices)
        self._failed = failed
        self._cache: dict[tuple[int, int], tuple[int, ...]] = {}

    def holders(self, segment: int, rank: int) -> tuple[int, ...]:
        key = (segment, rank)
        if key not in self._cache:
            self._cache[key] = tuple(devs[rank] for devs in self._covering[segment]
                                     if rank < len(devs) and devs[rank] not in self._failed)
        return self._cache[key]


def missing_state(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int]) -> list[Need]:
    """Every (device, segment) of the new plan's live slots whose shards the device lacks; under
    ZeRO, each missing part of its new shard range as well, from that range's one old holder.

    Raises UnrecoverableError naming the layers when some needed shard has no surviving holder."""
    if old.tensor_parallel != new.tensor_parallel:
        raise ValueError("migration between plans of different TP degrees: shards do not correspond")
    num_layers = model.workload.num_layers
    replicated, sharded = state_bytes(model, new.tensor_parallel)
    held = old_holdings(old, failed)
    segments = Segments(old, failed, num_layers)
    needs: list[Need] = []
    lost: set[tuple[int, int]] = set()  # (layer, TP rank) without a live replica
    zero = bool(sharded.any())
    slots = live_slots(new, failed)
    if zero:  # each layer's data-parallel group: slot -> position, in the old plan (all slots) and the new
        old_groups = {layer: {slot: k for k, slot in enumerate(group)}
                      for layer, group in data_parallel_groups(old).items()}
        new_groups = {layer: {slot: k for k, slot in enumerate(group)}
                      for layer, group in data_parallel_groups(new, slots).items()}
        old_slot = {d: (j, s) for j, pipe in enumerate(old.pipelines) for s, stage in enumerate(pipe.stages)
                    for d in stage.devices}
        pieces: dict[tuple[int, int, int, int], dict[int, int]] = {}  # (dst, rank, segment, src) -> layer bytes
    shards_lost: set[tuple[int, int]] = set()
    for j, s in slots:
        stage = new.pipelines[j].stages[s]
        for rank, d in enumerate(stage.devices):
            h = held.get(d)
            keep = (h.first, h.end) if h is not None and h.rank == rank else (0, 0)
            layers = [layer for layer in range(stage.first, stage.end) if not keep[0] <= layer < keep[1]]
            by_segment: dict[int, list[int]] = {}
            for layer in layers:
                by_segment.setdefault(int(segments.of_layer[layer]), []).append(layer)
            for g, group in by_segment.items():
                holders = segments.holders(g, rank)
                if not holders:
                    lost.update((layer, rank) for layer in group)
                    continue
                if not zero:
                    needs.append(Need(d, rank, g, tuple(group), int(replicated[group].sum()), holders))
                elif replicated[group].any():
                    needs.append(Need(d, rank, g, tuple(group), int(replicated[group].sum()), holders,
                                      tuple(int(b) for b in replicated[group])))
            if not zero:
                continue
            for layer in range(stage.first, stage.end):
                size = int(sharded[layer])
                if size == 0:
                    continue
                lo, hi = shard_range(size, new_groups[layer][(j, s)], len(new_groups[layer]))
                before = old_groups[layer]
                kept = shard_range(size, before[old_slot[d]], len(before)) if keep[0] <= layer < keep[1] else (0, 0)
                wanted = [(lo, min(hi, kept[0])), (max(lo, kept[1]), hi)] if kept[1] > kept[0] else [(lo, hi)]
                holders_of = list(before)
                for a, b in wanted:
                    # the old positions whose ranges meet [a, b): from the one holding byte a on
                    for k in range(len(holders_of) * a // size, len(holders_of)):
                        c, e = shard_range(size, k, len(holders_of))
                        if c >= b:
                            break
                        if min(b, e) <= max(a, c):
                            continue
                        oj, os_ = holders_of[k]
                        src = old.pipelines[oj].stages[os_].devices[rank]
                        if src in failed:
                            shards_lost.add((layer, rank))
                            continue
                        into = pieces.setdefault((d, rank, int(segments.of_layer[layer]), src), {})
                        into[layer] = into.get(layer, 0) + min(b, e) - max(a, c)
    if lost or shards_lost:
        pairs = lost or shards_lost
        layers = sorted({layer for layer, _ in pairs})
        shown = ", ".join(str(layer) for layer in layers[:12]) + (" ..." if len(layers) > 12 else "")
        ranks = sorted({rank for _, rank in pairs})
        if lost:
            raise UnrecoverableError(
                f"layers {shown} ({len(layers)} layers; TP ranks {ranks}) have no surviving replica of their "
                "parameters and optimizer state: restart from the last checkpoint")
        what = "optimizer state and parameters" if model.zero_stage >= 3 else "optimizer state"
        gone = sorted({old.pipelines[j].stages[s].devices[r] for layer, r in shards_lost
                       for j, s in old_groups[layer] if old.pipelines[j].stages[s].devices[r] in failed})
        raise UnrecoverableError(
            f"ZeRO stage {model.zero_stage} keeps one copy of each data-parallel shard of the {what}: failed devices "
            f"{gone} held the only copy of theirs (layers {shown}, {len(layers)} layers; TP ranks {ranks}): "
            "restart from the last checkpoint")
    if zero:
        for (d, rank, g, src), by_layer in pieces.items():
            layers_here = tuple(sorted(by_layer))
            sizes = tuple(by_layer[layer] for layer in layers_here)
            needs.append(Need(d, rank, g, layers_here, sum(sizes), (src,), sizes))
    return needs
