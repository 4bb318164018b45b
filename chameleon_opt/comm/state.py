"""Who holds which model state: the bookkeeping every communication model starts from.

A *tensor* is one TP shard of one layer's model state: `layer{l}.tp{r}` holds the parameters and
optimizer state of layer l's shard r, `params[l] / TP x (param_bytes + optimizer_bytes)` bytes
(gradients are recomputed in the next step, so they never move). A live device holds, from the old
plan, the shards of its old stage's layers at its old TP rank; a device of the new plan needs the
shards of its new stage's layers at its new TP rank. With TP > 1 a shard is not interchangeable with
another rank's shard, so a source must have held the same layer *and* the same rank.

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
    """Every (device, segment) of the new plan's live slots whose shards the device lacks.

    Raises UnrecoverableError naming the layers when some needed shard has no surviving holder."""
    if old.tensor_parallel != new.tensor_parallel:
        raise ValueError("migration between plans of different TP degrees: shards do not correspond")
    num_layers = model.workload.num_layers
    sizes = tensor_bytes(model, new.tensor_parallel)
    held = old_holdings(old, failed)
    segments = Segments(old, failed, num_layers)
    needs: list[Need] = []
    lost: set[tuple[int, int]] = set()
    for j, s in live_slots(new, failed):
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
                needs.append(Need(d, rank, g, tuple(group), int(sizes[group].sum()), holders))
    if lost:
        layers = sorted({layer for layer, _ in lost})
        shown = ", ".join(str(layer) for layer in layers[:12]) + (" ..." if len(layers) > 12 else "")
        ranks = sorted({rank for _, rank in lost})
        raise UnrecoverableError(
            f"layers {shown} ({len(layers)} layers; TP ranks {ranks}) have no surviving replica of their parameters "
            "and optimizer state: restart from the last checkpoint")
    return needs
