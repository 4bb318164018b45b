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
layer matches in bytes per device, not in which bytes).

With `training.shard_replicas` = c copies (torchtitan HSDP, Megatron-LM's
--num-distributed-optimizer-instances) the D slots holding a layer, in plan order, form c
consecutive shard groups (D / c slots each, sizes differing by one where c does not divide D:
perf/memory.py `shard_groups`), and the ranges above are taken within each group, so every byte
has one holder per group. Consecutive because a plan's pipelines are the trainer's data-parallel
ranks in order, and both trainers group consecutive data-parallel ranks (Megatron's intra-instance
groups; torchtitan's mesh [dp_replicate, dp_shard] makes dp_shard the inner, consecutive one).
A missing byte may then come from any live holder of it in any group (a Need per run of bytes
with the same live holders; the solver splits it among them), so a device taking over a failed
device's range gathers it from a surviving copy. Only bytes whose every group's holder failed are
gone: then only a checkpoint has them (UnrecoverableError, exit 5); with c = 1 that is any byte a
failed device held. When the plan's data-parallel size changes the groups are re-formed and
re-sharded the same way: each device gathers its new range minus what it already holds.

Layers are grouped into *segments*: maximal runs of layers covered by the same set of old slots.
Every layer of a segment has the same holders, so one solver variable per (receiver, segment,
source) is exact and much smaller than one per (receiver, layer, source).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

from chameleon_opt.errors import UnrecoverableError
from chameleon_opt.perf.memory import shard_groups
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.solve.deadline import Deadline, DeadlinePassed


ABANDON_NEEDS = 1_000  # fewer shards to move: finishing past the deadline costs under 0.05 s, never abandoned


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


class ShardGroups:
    """A layer's data-parallel slots (plan order) split into `copies` consecutive shard groups
    (perf.memory.shard_groups): each group shards the layer's sharded bytes over itself, position k
    of a group of g keeping shard_range(S, k, g), so every byte has one holder per group."""

    def __init__(self, slots: list[tuple[int, int]], copies: int) -> None:
        self.groups = [slots[a:b] for a, b in shard_groups(len(slots), copies)]
        self.where = {slot: (k, len(group)) for group in self.groups for k, slot in enumerate(group)}

    def range_of(self, slot: tuple[int, int], size: int) -> tuple[int, int]:
        """Bytes [lo, hi) of a layer's `size` sharded bytes that `slot` keeps."""
        k, g = self.where[slot]
        return shard_range(size, k, g)

    def covering(self, size: int, a: int, b: int) -> list[list[tuple[int, int, tuple[int, int]]]]:
        """Per group, the (lo, hi, slot) ranges that meet bytes [a, b), in byte order."""
        out = []
        for group in self.groups:
            g, pieces = len(group), []
            for k in range(g * a // size, g):  # from the position holding byte a on
                c, e = shard_range(size, k, g)
                if c >= b:
                    break
                if min(b, e) > max(a, c):
                    pieces.append((c, e, group[k]))
            out.append(pieces)
        return out


def shard_copies_lost(plan: Plan, failed: frozenset[int], copies: int, layers: set[int] | None = None
                      ) -> tuple[list[int], list[int]]:
    """(layers, failed devices) where some part of a layer's ZeRO-sharded state had every copy on
    failed devices: a byte is held, at each TP rank, by one slot of each of the layer's `copies`
    shard groups (ShardGroups), so it is gone when all of those slots' devices at that rank
    failed. Exact fractions of the layer (the byte sizes do not matter); `layers`: only these
    (those with state), default all. The devices are the failed holders of the lost parts."""
    hit: dict[int, set[int]] = {}  # layer -> TP ranks of failed devices on its slots
    for pipe in plan.pipelines:
        for stage in pipe.stages:
            ranks = {r for r, d in enumerate(stage.devices) if d in failed}
            if ranks:
                for layer in range(stage.first, stage.end):
                    if layers is None or layer in layers:
                        hit.setdefault(layer, set()).update(ranks)
    if not hit:
        return [], []
    holders: dict[int, list[tuple[int, int]]] = {layer: [] for layer in hit}
    for j, pipe in enumerate(plan.pipelines):
        for s, stage in enumerate(pipe.stages):
            for layer in range(stage.first, stage.end):
                if layer in holders:
                    holders[layer].append((j, s))
    lost_layers: set[int] = set()
    gone: set[int] = set()
    for layer, ranks in hit.items():
        split = ShardGroups(holders[layer], copies)
        for rank in ranks:
            dead = [[(Fraction(k, len(group)), Fraction(k + 1, len(group)), device)
                     for k, (j, s) in enumerate(group)
                     for device in [plan.pipelines[j].stages[s].devices[rank]] if device in failed]
                    for group in split.groups]
            common = [(lo, hi) for lo, hi, _ in dead[0]]  # the parts every copy lost so far
            for other in dead[1:]:
                common = [(max(lo, c), min(hi, e)) for lo, hi in common for c, e, _ in other
                          if min(hi, e) > max(lo, c)]
            if common:
                lost_layers.add(layer)
                gone.update(device for group in dead for c, e, device in group
                            if any(min(hi, e) > max(lo, c) for lo, hi in common))
    return sorted(lost_layers), sorted(gone)


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


def moved_pairs_at_least(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int],
                         remapped: bool = False) -> tuple[int, int]:
    """(pairs, receivers): lower bounds on the (device, layer) pairs `missing_state` lists (the
    sum of its needs' layers, at least one transfer each) and on the devices it lists a need for,
    counted from layer ranges alone (no shard is listed), so a migration that cannot be cut in
    the time left is declared before its listing is paid for (1-10 s at 16,384-131,072 devices).

    Why a lower bound. A live slot's device at TP rank r holds one old range [f, e), usable only
    at rank r. A layer of its new range it lacks is listed once in the need for its replicated
    bytes, if any, and once more in a need for its ZeRO shard range when its sharded bytes are at
    least the plan's pipeline count, which bounds every shard group, so every position's range is
    non-empty (`_listed`). A layer it holds is listed when its ZeRO shard range must grow
    (`_regrown`). So the device's needs list at least L(a, b) - G([a, b) & [f, e)) layers, L
    summing the listings of lacked layers and G what holding saves (those minus the regrown). With
    `remapped` any assignment of groups to slots is allowed (`assign_slots`' re-mapping): each
    slot's device then saves at most the largest G over any live device's old range, or nothing."""
    if old.tensor_parallel != new.tensor_parallel:
        raise ValueError("migration between plans of different TP degrees: shards do not correspond")
    listed = _listed(model, new)
    saved = listed - _regrown(model, old, new, failed)
    lacking = np.concatenate([[0], np.cumsum(listed)]).astype(np.int64)
    gain = np.concatenate([[0], np.cumsum(saved)]).astype(np.int64)
    held = old_holdings(old, failed)
    slots = live_slots(new, failed)
    if remapped:
        ranges = np.array(sorted({(h.first, h.end) for h in held.values()}), dtype=np.int64).reshape(-1, 2)
        wanted: dict[tuple[int, int], int] = {}  # (first, end) -> devices of the live slots with that range
        for j, s in slots:
            stage = new.pipelines[j].stages[s]
            wanted[(stage.first, stage.end)] = wanted.get((stage.first, stage.end), 0) + len(stage.devices)
        if not wanted:
            return 0, 0
        span = np.array(list(wanted), dtype=np.int64)
        devices = np.array(list(wanted.values()), dtype=np.int64)
        kept = np.zeros(len(span), dtype=np.int64)
        if len(ranges):
            lo = np.maximum(span[:, :1], ranges[None, :, 0])
            hi = np.maximum(np.minimum(span[:, 1:], ranges[None, :, 1]), lo)
            kept = np.maximum((gain[hi] - gain[lo]).max(axis=1), 0)
        least = lacking[span[:, 1]] - lacking[span[:, 0]] - kept
        return int((least * devices).sum()), int(devices[least > 0].sum())
    pairs = receivers = 0
    for j, s in slots:
        stage = new.pipelines[j].stages[s]
        whole = int(lacking[stage.end] - lacking[stage.first])
        for rank, d in enumerate(stage.devices):
            h = held.get(d)
            least = whole
            if h is not None and h.rank == rank:
                lo, hi = max(stage.first, h.first), min(stage.end, h.end)
                least -= int(gain[hi] - gain[lo]) if hi > lo else 0
            pairs += least
            receivers += least > 0
    return pairs, receivers


def _listed(model: PerfModel, new: Plan) -> np.ndarray:
    """Per layer: the needs with bytes for it a device of `new` lacking it gets (see
    `moved_pairs_at_least`): one for its replicated bytes, another for its ZeRO shard range."""
    replicated, sharded = state_bytes(model, new.tensor_parallel)
    return (replicated > 0).astype(np.int64) + (sharded >= max(len(new.pipelines), 1))


def _regrown(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int]) -> np.ndarray:
    """Per layer (0/1): whether every device holding it in `old` and again in `new` (same TP rank)
    must gather part of its ZeRO shard range: the shortest new range (floor(S / g) for the largest
    new shard group g) is longer than the longest old one (ceil(S / g') for the smallest old
    group g'), so what it keeps cannot cover it. Groups: the layer's slots in plan order, all of
    the old plan's, the live ones of the new (`_sharded_missing`), split by `shard_groups`."""
    num_layers = model.workload.num_layers
    _, sharded = state_bytes(model, new.tensor_parallel)
    if not sharded.any():
        return np.zeros(num_layers, dtype=np.int64)

    def replicas(plan: Plan, live: bool) -> np.ndarray:  # slots holding each layer
        starts = np.zeros(num_layers + 1, dtype=np.int64)
        for pipe in plan.pipelines:
            for stage in pipe.stages:
                if not live or failed.isdisjoint(stage.devices):
                    starts[stage.first] += 1
                    starts[stage.end] -= 1
        return np.cumsum(starts)[:num_layers]

    copies = model.shard_copies
    sizes: dict[int, tuple[int, int]] = {}  # replicas -> (smallest, largest) shard group

    def extremes(count: int) -> tuple[int, int]:
        if count not in sizes:
            widths = [b - a for a, b in shard_groups(count, copies)]
            sizes[count] = (min(widths), max(widths))
        return sizes[count]

    before, after = replicas(old, False), replicas(new, True)
    grown = np.zeros(num_layers, dtype=np.int64)
    for layer in np.flatnonzero(sharded > 0):
        smallest, largest = extremes(int(before[layer]))[0], extremes(int(after[layer]))[1]
        size = int(sharded[layer])
        grown[layer] = smallest > 0 and largest > 0 and size // largest > -(-size // smallest)
    return grown


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


def missing_state(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int],
                  abandon: Deadline | None = None) -> list[Need]:
    """Every (device, segment) of the new plan's live slots whose shards the device lacks; under
    ZeRO, each missing part of its new shard range as well, from the live holders of that part (one per
    shard group: training.shard_replicas).

    With `abandon` (`schedule_migration`'s): once it has passed and ABANDON_NEEDS needs with bytes
    are listed, DeadlinePassed is raised between slots, as `schedule_migration` would raise it
    after the listing (its time left is then 0, and every need has at least one transfer).

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
    # under ZeRO: (dst, rank, segment, live holders) -> layer bytes of the sharded state to gather
    pieces: dict[tuple[int, int, int, tuple[int, ...]], dict[int, int]] = {}
    shards_lost: set[tuple[int, int]] = set()
    gone: set[int] = set()  # failed devices that held every copy of some needed bytes
    listed = 0  # needs with bytes so far
    for j, s in slots:
        if abandon is not None and listed >= ABANDON_NEEDS and abandon.left() <= 0:
            raise DeadlinePassed(f"the deadline passed while listing the shards to move ({listed:,} needs so far): "
                                 f"they cannot be cut and scheduled in the 0.00 s left", given_s=0.0)
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
                nbytes = int(replicated[group].sum())
                listed += nbytes > 0
                if not zero:
                    needs.append(Need(d, rank, g, tuple(group), nbytes, holders))
                elif nbytes > 0:
                    needs.append(Need(d, rank, g, tuple(group), nbytes, holders,
                                      tuple(int(b) for b in replicated[group])))
    if zero:
        _sharded_missing(old, new, failed, slots, sharded, segments, held, model.shard_copies, pieces, shards_lost,
                         gone, abandon if listed >= ABANDON_NEEDS else None)
    if lost or shards_lost:
        pairs = lost or shards_lost
        layers = sorted({layer for layer, _ in pairs})
        shown = ", ".join(str(layer) for layer in layers[:12]) + (" ..." if len(layers) > 12 else "")
        ranks = sorted({rank for _, rank in pairs})
        if lost:
            raise UnrecoverableError(
                f"layers {shown} ({len(layers)} layers; TP ranks {ranks}) have no surviving replica of their "
                "parameters and optimizer state: restart from the last checkpoint")
        raise UnrecoverableError(
            f"{shard_copies_phrase(model.zero_stage, model.shard_copies)}: failed devices {sorted(gone)} held "
            f"{held_every_copy(model.shard_copies)} (layers {shown}, {len(layers)} layers; TP ranks {ranks}): "
            "restart from the last checkpoint")
    if zero:
        for (d, rank, g, holders), by_layer in pieces.items():
            layers_here = tuple(sorted(by_layer))
            sizes = tuple(by_layer[layer] for layer in layers_here)
            needs.append(Need(d, rank, g, layers_here, sum(sizes), holders, sizes))
    return needs


def shard_copies_phrase(zero_stage: int, copies: int) -> str:
    """'ZeRO stage z keeps one copy (N copies) of each data-parallel shard of the ...': the start of
    the exit-5 message, so decide and the migration say the same."""
    what = "optimizer state and parameters" if zero_stage >= 3 else "optimizer state"
    kept = "one copy" if copies == 1 else f"{copies} copies"
    return f"ZeRO stage {zero_stage} keeps {kept} of each data-parallel shard of the {what}"


def held_every_copy(copies: int) -> str:
    return "the only copy of theirs" if copies == 1 else "every copy of some shards"


def _sharded_missing(old: Plan, new: Plan, failed: frozenset[int], slots: list[tuple[int, int]], sharded: np.ndarray,
                     segments: Segments, held: dict[int, Holding], copies: int,
                     pieces: dict[tuple[int, int, int, tuple[int, ...]], dict[int, int]],
                     shards_lost: set[tuple[int, int]], gone: set[int], abandon: Deadline | None = None) -> None:
    """missing_state's ZeRO part: each live new slot's device gathers its new range of each layer's
    sharded bytes minus the part of its old range it keeps, every run of bytes from the live old
    holders of that run (one per shard group), added to `pieces`; runs with none go to
    `shards_lost` and their failed holders to `gone`. Worked per slot, not per device: the TP
    ranks of a slot that keep the same old range want the same runs from the same old slots, so
    they share one entry until the end (at 16,384 devices 8 times fewer), and a slot whose TP group
    held the same position of the same group size before is skipped outright."""
    old_groups = {layer: ShardGroups(group, copies) for layer, group in data_parallel_groups(old).items()}
    new_groups = {layer: ShardGroups(group, copies) for layer, group in data_parallel_groups(new, slots).items()}
    old_slot = {d: (j, s) for j, pipe in enumerate(old.pipelines) for s, stage in enumerate(pipe.stages)
                for d in stage.devices}
    # (new slot, its TP ranks alike, segment, old slots holding the run) -> layer bytes each of those ranks wants
    wants: dict[tuple[tuple[int, int], tuple[int, ...], int, tuple[tuple[int, int], ...]], dict[int, int]] = {}
    for j, s in slots:
        if abandon is not None and abandon.left() <= 0:  # given only once ABANDON_NEEDS needs are listed
            raise DeadlinePassed("the deadline passed while listing the sharded state to move: it cannot be cut and "
                                 "scheduled in the 0.00 s left", given_s=0.0)
        stage = new.pipelines[j].stages[s]
        origin = old_slot.get(stage.devices[0])
        if origin is not None and old.pipelines[origin[0]].stages[origin[1]].devices != stage.devices:
            origin = None  # not the same TP group at the same ranks
        everyone = tuple(range(len(stage.devices)))
        for layer in range(stage.first, stage.end):
            size = int(sharded[layer])
            if size == 0:
                continue
            position = new_groups[layer].where[(j, s)]
            before = old_groups[layer]
            if origin is not None and before.where.get(origin) == position:
                continue  # the same range as before on every TP rank
            lo, hi = shard_range(size, *position)
            segment = int(segments.of_layer[layer])
            alike: dict[tuple[int, int], tuple[int, ...]] = {}  # kept range -> the TP ranks keeping it
            if origin is not None:
                alike[before.range_of(origin, size) if origin in before.where else (0, 0)] = everyone
            else:
                for rank, d in enumerate(stage.devices):
                    h = held.get(d)
                    keeps = h is not None and h.rank == rank and h.first <= layer < h.end
                    kept = before.range_of(old_slot[d], size) if keeps else (0, 0)
                    alike[kept] = alike.get(kept, ()) + (rank,)
            for kept, ranks in alike.items():
                wanted = [(lo, min(hi, kept[0])), (max(lo, kept[1]), hi)] if kept[1] > kept[0] else [(lo, hi)]
                for a, b in wanted:
                    if b <= a:
                        continue
                    # cut [a, b) where any copy's holder changes; each run from its holders in every group
                    covers = before.covering(size, a, b)
                    cuts = sorted({a, b} | {x for group in covers for c, e, _ in group for x in (c, e) if a < x < b})
                    for x, y in zip(cuts, cuts[1:]):
                        holder_slots = tuple(slot for group in covers for c, e, slot in group if c <= x < e)
                        into = wants.setdefault(((j, s), ranks, segment, holder_slots), {})
                        into[layer] = into.get(layer, 0) + y - x
    tuples: dict[tuple[int, ...], tuple[int, ...]] = {}  # holder tuples shared (the solver caches by tuple)
    for ((j, s), ranks, segment, holder_slots), by_layer in wants.items():
        devices = new.pipelines[j].stages[s].devices
        for rank in ranks:
            holding = [old.pipelines[oj].stages[os_].devices[rank] for oj, os_ in holder_slots]
            live = tuple(sorted(src for src in holding if src not in failed))
            if not live:
                shards_lost.update((layer, rank) for layer in by_layer)
                gone.update(holding)
                continue
            live = tuples.setdefault(live, live)
            into = pieces.setdefault((devices[rank], rank, segment, live), {})
            for layer, nbytes in by_layer.items():
                into[layer] = into.get(layer, 0) + nbytes
