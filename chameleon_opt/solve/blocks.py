"""Exact search over layer counts for one device type and identical blocks: real models (tens of
identical transformer blocks between an embedding and a head) on a few TP groups, where exact.py's
branch and bound refuses (its split and table budgets) and the whole-layer bound (homogeneous.py)
stays 0.7-1.6% below the optimum (relief-faster-8, paper-32: the plans were optimal, the bound loose).

The space is search.SPACE with every survivor of one device type: d pipelines of p_j TP groups (each
inside a node, sum p_j <= the groups the survivors form, idle allowed), every contiguous split into
p_j non-empty stages (a count vector), micro-batches m_j >= 1 summing to the global count, every node
assignment of the stages (the model reads a group only through its type, size and node: groups of one
node are interchangeable, and nodes with as many groups are taken in first-use order), every relief
per stage (perf/relief.choose_reliefs at the leaves: exact for the step without gradient overlap).
Each stage is priced at its own layers, so nothing rests on the blocks being identical but the speed.

Branch and bound against an incumbent; a part of the space is cut only when a lower bound of the step
of every plan in it is at least the incumbent less PRUNE (relative, below search.OPTIMALITY_TOLERANCE),
so when the search is complete the best plan is optimal within PRUNE. Step = max_j P_j + R + U
(PerfModel.evaluate with ZeRO 0, no overlap, no interleaving) and the bounds are:
- P_j: the exact 1F1B makespan (perf/pipeline.py's longest path, non-decreasing in every operation
  time) with each stage's forward and backward at their least over the reliefs that fit its memory at
  its in-flight count min(p - s, m) with d replicas, sends on the faster link. Count vectors are
  generated depth first, cut where a prefix's path "the stages before s, then stage s's m forwards
  and backwards" reaches the ceiling; the micro-batches of each pipeline are capped by the whole-layer
  floors (homogeneous.pipeline_floors, non-decreasing in m);
- R: per slot, the rings of its layer groups (one ring per set of holders, as
  PerfModel.slot_reduce_times) on the faster link they may use (inside a node only when a node has as
  many groups), each fixed as soon as the placement fixes it; for one count vector alone, its
  largest stage's single ring (a slot's rings add up to at least one ring of all its bytes);
- U: the largest over stages of the least optimizer step over the reliefs;
- once a pipeline's stages are placed, its crossings fix its sends: P_j is then the least makespan
  over one relief per stage, and P_j + U >= the least over the same choices of its makespan plus its
  own largest optimizer step (max_j P_j + U >= P_k + U_k for every k).
Identical blocks are what keep it small: the near-balanced count vectors are few, and a pipeline's
floor is shared by every placement with the same crossings.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.comm import ring_allgather_time, ring_allreduce_time
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.pipeline import makespans, one_f_one_b_time
from chameleon_opt.perf.relief import choose_reliefs
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.homogeneous import pipeline_floors

PRUNE = 1e-7
"""Relative: parts of the space whose floor is within this of the incumbent are not explored (ties)."""
RELIEF_COMBINATIONS = 256
"""Most relief combinations of one pipeline whose makespans the placement floor takes the least of."""
BLOCK_TOLERANCE = 1e-9
"""Relative spread of a middle layer's costs within which the layers count as identical blocks."""
MOST_GROUPS = 8
"""More TP groups than this: the method stays out. Its shapes, count-vector sets and placements grow
fast: relief-faster-8 (7 groups) completes in 0.8 s of CPU, paper-32 (15 groups) in 8 s, more than the
search's share of a plan decision leaves it."""


@dataclass(frozen=True)
class BlocksResult:
    """The best plan found (None: none beat the incumbent), its step, and whether the space was
    exhausted (then the incumbent or `plan` is optimal within PRUNE)."""

    plan: Plan | None
    value: float
    complete: bool
    placed: int


def identical_blocks(model: PerfModel, group: tuple[int, ...]) -> bool:
    """Whether every layer but the first and the last costs the same on this group (the model's per-layer
    time, state and activation rows under every relief, and the boundary bytes). The rows are
    differences of prefix sums, so equal layers differ in the last bits: equal within BLOCK_TOLERANCE.
    Only where the method is fast rests on this: every stage is priced at its own layers."""
    layers = model.workload.num_layers
    if layers < 4:
        return False
    rows = [model.workload.boundary_bytes_per_sample[1:-1]]
    for relief in model.relief_options:
        costs = model.layer_costs(group, 2, relief)
        rows += [costs.time_s[1:-1], costs.static_bytes[1:-1], costs.activation_bytes[1:-1]]
    return all(np.ptp(row) <= BLOCK_TOLERANCE * np.max(np.abs(row)) for row in rows)


class _Space:
    """Prices of one instance's stages and pipelines (floors), shared by every shape."""

    def __init__(self, instance: Instance, model: PerfModel, failed: frozenset[int],
                 groups: list[tuple[int, ...]]) -> None:
        self.instance, self.model, self.failed = instance, model, failed
        self.layers, self.total = model.workload.num_layers, instance.global_micro_batches
        self.by_node: dict[int, list[tuple[int, ...]]] = {}
        for g in groups:
            self.by_node.setdefault(instance.node_of(g[0]), []).append(g)
        self.nodes = sorted(self.by_node)
        self.group = groups[0]
        self.widest = max(len(g) for g in self.by_node.values())  # the most groups of one node
        links = (model.intra, model.inter)
        self.sends = {link: [model.boundary_send_on(link, k) for k in range(self.layers)] for link in links}
        self.send = [min(a, b) for a, b in zip(*self.sends.values())]
        self.grad = model.workload.params * model.grad_bytes / instance.plan.tensor_parallel
        self._menus: dict[tuple[int, int, int, int], tuple[tuple[float, float, float], ...]] = {}
        self._spans: dict[tuple, tuple[float, float]] = {}  # makespan's answers
        self._vectors: dict[tuple[int, int, int], list[tuple[float, tuple[int, ...]]]] = {}
        self._ceilings: dict[tuple[int, int, int], float] = {}
        self.optimizer: dict[tuple[int, int, int], float] = {}  # (a, e, d): the least optimizer step over the reliefs

    def menu(self, a: int, e: int, s: int, p: int, mb: int, d: int) -> tuple[tuple[float, float, float], ...]:
        """(forward, backward, optimizer step) of each relief that fits stage s of p holding [a, e) with d
        replicas (op overhead, no sends), those no other beats in all three: memory depends on s, p, m
        only through the in-flight count min(p - s, m) (the head's logits too)."""
        x = min(p - s, mb)
        key = (a, e, x, d)
        if key not in self._menus:
            m, pairs = self.model, set()
            for relief in m.relief_options:
                need, have = m.stage_memory(self.group, a, e, p - x, p, mb, 0.0, d, relief)
                if need <= have:
                    f, b, _, _ = m.stage_times(self.group, a, e, relief)
                    pairs.add((f + m.op_overhead_s, b + m.op_overhead_s, m.optimizer_time(self.group, a, e, relief, d)))
            self._menus[key] = tuple(sorted(q for q in pairs if not any(
                o != q and o[0] <= q[0] and o[1] <= q[1] and o[2] <= q[2] for o in pairs)))
        return self._menus[key]

    def op(self, a: int, e: int, s: int, p: int, mb: int, d: int) -> tuple[float, float]:
        """The least forward and the least backward over `menu` (each apart; inf when none fits)."""
        pairs = self.menu(a, e, s, p, mb, d)
        return (min(q[0] for q in pairs), min(q[1] for q in pairs)) if pairs else (math.inf, math.inf)

    def times(self, counts: tuple[int, ...], mb: int, d: int, crossing: tuple[bool, ...] | None
              ) -> tuple[list[float], list[float]]:
        """Stage operation floors of one count vector (`op`); sends on the faster link, or on the crossing's."""
        menus = self.rows(counts, mb, d, crossing)
        return ([min((q[0] for q in menu), default=math.inf) for menu in menus],
                [min((q[1] for q in menu), default=math.inf) for menu in menus])

    def rows(self, counts: tuple[int, ...], mb: int, d: int, crossing: tuple[bool, ...] | None
             ) -> list[tuple[tuple[float, float, float], ...]]:
        """Per stage: its `menu` with the sends added (forward: the one after it, backward: the one before)."""
        p, out = len(counts), []
        cuts = np.concatenate(([0], np.cumsum(counts))).tolist()
        for s in range(p):
            after = self._send(cuts[s + 1] - 1, None if crossing is None else crossing[s]) if s < p - 1 else 0.0
            before = self._send(cuts[s] - 1, None if crossing is None else crossing[s - 1]) if s else 0.0
            out.append(tuple((f + after, b + before, o) for f, b, o in self.menu(cuts[s], cuts[s + 1], s, p, mb, d)))
        return out

    def makespan(self, counts: tuple[int, ...], mb: int, d: int, crossing: tuple[bool, ...]) -> tuple[float, float]:
        """Floors of this pipeline with these crossings: of its 1F1B time, the least makespan over one
        relief per stage (each stage's menu); of its 1F1B time plus its own largest optimizer step (at
        most the step's: max over pipelines of the 1F1B plus max over every stage of the optimizer
        step), the least of that sum over the same choices. With more than RELIEF_COMBINATIONS
        choices: each operation at its least, and each stage's least optimizer step."""
        key = (counts, mb, d, crossing)
        if key not in self._spans:
            menus = self.rows(counts, mb, d, crossing)
            if not all(menus):
                self._spans[key] = (math.inf, math.inf)
            elif math.prod(len(menu) for menu in menus) > RELIEF_COMBINATIONS:
                span = one_f_one_b_time(*self.times(counts, mb, d, crossing), mb)
                self._spans[key] = (span, span + max(min(q[2] for q in menu) for menu in menus))
            else:
                picks = np.array(list(itertools.product(*menus)))  # (combinations, stages, 3)
                spans = makespans(picks[:, :, 0], picks[:, :, 1], mb)
                self._spans[key] = (float(spans.min()), float((spans + picks[:, :, 2].max(axis=1)).min()))
        return self._spans[key]

    def _send(self, layer: int, across: bool | None) -> float:
        if across is None:
            return self.send[layer]
        return self.sends[self.model.inter if across else self.model.intra][layer]

    def vectors(self, p: int, mb: int, d: int, ceiling: float, deadline: Deadline
                ) -> list[tuple[float, tuple[int, ...]]] | None:
        """Count vectors of p stages whose 1F1B floor is below `ceiling`, cheapest first (None past
        the deadline). Remembered per (p, m, d) with the ceiling they were cut at (a lower one reuses them)."""
        key = (p, mb, d)
        if key in self._vectors and self._ceilings[key] >= ceiling:
            return [(t, v) for t, v in self._vectors[key] if t < ceiling]
        found: list[tuple[int, ...]] = []
        layers = self.layers

        def walk(s: int, a: int, before: float, counts: tuple[int, ...]) -> bool:
            left = p - s - 1
            if deadline.expired():
                return False
            sizes = range(1, layers - a - left + 1) if left else (layers - a,)
            for k in sizes:
                e = a + k
                f, b = self.op(a, e, s, p, mb, d)
                w = f + b + (self.send[e - 1] if left else 0.0) + (self.send[a - 1] if s else 0.0)
                if not math.isfinite(w) or before + mb * w >= ceiling:
                    continue  # memory need is not monotone in k under reliefs: keep scanning
                if left:
                    if not walk(s + 1, e, before + w, counts + (k,)):
                        return False
                else:
                    found.append(counts + (k,))
            return True

        if not walk(0, 0, 0.0, ()):
            return None
        priced: list[tuple[float, tuple[int, ...]]] = []
        if found:
            rows = [self.times(v, mb, d, None) for v in found]
            spans = makespans(np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), mb)
            priced = sorted((float(t), v) for t, v in zip(spans, found) if t < ceiling)
        self._vectors[key], self._ceilings[key] = priced, ceiling
        return priced

    def ring_sets(self, vectors: list[tuple[int, ...]]) -> list[tuple[tuple[int, ...], float]]:
        """(slots as indices into the flattened stages, gradient bytes) of each set of holders."""
        holders: dict[int, list[int]] = {}
        flat = 0
        for c in vectors:
            start = 0
            for k in c:
                for layer in range(start, start + k):
                    holders.setdefault(layer, []).append(flat)
                start += k
                flat += 1
        sets: dict[tuple[int, ...], list[int]] = {}
        for layer, slots in holders.items():
            sets.setdefault(tuple(slots), []).append(layer)
        return [(slots, float(self.grad[layers].sum())) for slots, layers in sets.items() if len(slots) > 1]

    def ring_times(self, rings: list[tuple[tuple[int, ...], float]]) -> list[tuple[tuple[int, ...], float, float, float]]:
        """Per set of holders: (its slots, its ring inside a node, across nodes, and the least it may take:
        inside a node only when one node has as many groups)."""
        m = self.model
        reduce = ring_allgather_time if m.overlap_param_gather else ring_allreduce_time
        out = []
        for slots, nbytes in rings:
            inside, across = reduce(nbytes, len(slots), m.collective), reduce(nbytes, len(slots), m.inter)
            out.append((slots, inside, across, min(inside, across) if len(slots) <= self.widest else across))
        return out

    @staticmethod
    def reduce_time(rings: list[tuple[tuple[int, ...], float, float, float]], labels: list[int]) -> float:
        """The slowest slot's rings (`ring_times`) with the first len(labels) flat stages placed on those
        nodes: a ring is across nodes once two of its placed stages are on two nodes, inside one once
        all its stages are placed on one, else at its least."""
        placed = len(labels)
        per: dict[int, float] = {}
        for slots, inside, across, least in rings:
            nodes = {labels[i] for i in slots if i < placed}
            t = across if len(nodes) > 1 else inside if slots[-1] < placed else least
            for i in slots:
                per[i] = per.get(i, 0.0) + t
        return max(per.values(), default=0.0)

    def optimizer_floor(self, vectors: list[tuple[int, ...]], d: int) -> float:
        m, worst = self.model, 0.0
        for c in vectors:
            start = 0
            for k in c:
                key = (start, start + k, d)
                if key not in self.optimizer:
                    self.optimizer[key] = min(m.optimizer_time(self.group, start, start + k, r, d)
                                              for r in m.relief_options)
                worst = max(worst, self.optimizer[key])
                start += k
        return worst

    def plan(self, vectors: list[tuple[int, ...]], micro: tuple[int, ...], labels: list[int]) -> Plan:
        taken = {n: 0 for n in range(len(self.nodes))}
        pipes, at = [], 0
        for c, mb in zip(vectors, micro):
            stages, start = [], 0
            for k in c:
                n = labels[at]
                stages.append(Stage(self.by_node[self.nodes[n]][taken[n]], start, start + k))
                taken[n] += 1
                at += 1
                start += k
            pipes.append(Pipeline(tuple(stages), mb))
        return Plan(self.instance.plan.tensor_parallel, tuple(pipes))


def _shapes(groups: int, layers: int):
    """Stage counts (non-increasing) of every pipeline set on at most `groups` groups."""
    def parts(left: int, most: int, k: int):
        if k == 0:
            yield ()
            return
        for p in range(min(most, left - (k - 1), layers), 0, -1):
            for rest in parts(left - p, p, k - 1):
                yield (p,) + rest
    for d in range(1, groups + 1):
        yield from parts(groups, groups, d)


def _splits(counts: tuple[int, ...], caps: list[int], total: int):
    """Micro-batches per pipeline (each 1..cap, summing to total); pipelines of equal stage counts take
    non-increasing shares (they are interchangeable)."""
    d = len(counts)
    rest_caps = [sum(caps[j:]) for j in range(d)] + [0]

    def walk(j: int, left: int, previous: int):
        if j == d:
            if left == 0:
                yield ()
            return
        most = min(caps[j], left - (d - 1 - j))
        if j and counts[j] == counts[j - 1]:
            most = min(most, previous)
        for mb in range(most, 0, -1):
            if left - mb > rest_caps[j + 1]:
                break
            for rest in walk(j + 1, left - mb, mb):
                yield (mb,) + rest
    yield from walk(0, total, total)


def blocks_search(instance: Instance, model: PerfModel, failed: frozenset[int], deadline: Deadline,
                  incumbent: float) -> BlocksResult | None:
    """The branch and bound (module docstring) against `incumbent` (the step of a plan of the space),
    or None outside its assumptions: survivors of more than one type, ZeRO > 0, overlapped gradient
    reduction, interleaving, context parallelism, layers not identical blocks, too many groups."""
    tp = instance.plan.tensor_parallel
    groups = survivor_groups(instance, failed, tp)
    if not groups or len(groups) > MOST_GROUPS or model.zero_stage != 0 or model.options.overlap_grad_reduce \
            or (model.options.virtual_stages or 1) > 1 or (model.context_parallel or 1) > 1:
        return None
    if len({instance.device_types[d].name for d in range(instance.num_devices) if d not in failed}) > 1:
        return None
    if not identical_blocks(model, groups[0]):
        return None
    space = _Space(instance, model, failed, groups)
    best, best_plan, placed = incumbent, None, 0
    floors: dict[int, np.ndarray | None] = {}
    for counts in _shapes(len(groups), space.layers):
        d = len(counts)
        if d > space.total:
            break
        if deadline.expired():
            return BlocksResult(best_plan, best, False, placed)
        ceiling = best * (1 - PRUNE)
        # caps: the most micro-batches each pipeline can run below the ceiling (floors non-decreasing in m)
        replicas = min(d, 2)  # ZeRO 0: several replicas price alike
        if replicas not in floors:
            floors[replicas] = pipeline_floors(model, groups[0], replicas, len(groups), space.total, ceiling,
                                               deadline)
        table = floors[replicas]
        if table is None:
            return BlocksResult(best_plan, best, False, placed)
        caps = [int(np.sum(table[p] < ceiling)) for p in counts]
        if sum(caps) < space.total or min(caps) < 1:
            continue
        for micro in _splits(counts, caps, space.total):
            ceiling = best * (1 - PRUNE)
            lists = []
            for p, mb in zip(counts, micro):
                found = space.vectors(p, mb, d, ceiling, deadline)
                if found is None:
                    return BlocksResult(best_plan, best, False, placed)
                lists.append(found)
            if not all(lists):
                continue
            for combo in _combos(space, counts, micro, d, lists, lambda: best * (1 - PRUNE)):
                if deadline.expired():
                    return BlocksResult(best_plan, best, False, placed)
                ceiling = best * (1 - PRUNE)
                slowest = max(t for t, _ in combo)
                vectors = [v for _, v in combo]
                rings = space.ring_times(space.ring_sets(vectors))
                rest = space.optimizer_floor(vectors, d)
                if slowest + space.reduce_time(rings, []) + rest >= ceiling:
                    continue
                found_plan, value, count = _place(space, vectors, micro, d, rings, slowest, rest, best, deadline)
                placed += count
                if found_plan is None and value is None:
                    return BlocksResult(best_plan, best, False, placed)
                if found_plan is not None and value < best:
                    best, best_plan = value, found_plan
    return BlocksResult(best_plan, best, True, placed)


def _combos(space: _Space, counts: tuple[int, ...], micro: tuple[int, ...], d: int,
            lists: list[list[tuple[float, tuple[int, ...]]]], ceiling: Callable[[], float]):
    """One count vector per pipeline, cut by per-vector floors: the slowest makespan, plus the largest
    stage's one ring on the faster link (a slot reduces its layers in rings over the d holders, one
    after another: their sum is at least one ring of all its bytes), plus the largest optimizer step.
    Interchangeable pipelines (equal stage and micro-batch counts) take non-decreasing list indices."""
    priced = []
    for c_list in lists:
        rows = []
        for t, v in c_list:
            rings = [(tuple(range(d)), float(space.grad[a:e].sum())) for a, e in _ranges(v)]
            rows.append((t, space.reduce_time(space.ring_times(rings), []), space.optimizer_floor([v], d), v))
        priced.append(rows)
    chosen: list[tuple[float, tuple[int, ...]]] = []

    def walk(j: int, low: int, t: float, r: float, u: float):
        if j == len(priced):
            yield list(chosen)
            return
        for i in range(low, len(priced[j])):
            tj, rj, uj, v = priced[j][i]
            if max(t, tj) + max(r, rj) + max(u, uj) >= ceiling():
                continue
            chosen.append((tj, v))
            same = j + 1 < len(priced) and counts[j + 1] == counts[j] and micro[j + 1] == micro[j]
            yield from walk(j + 1, i if same else 0, max(t, tj), max(r, rj), max(u, uj))
            chosen.pop()
    yield from walk(0, 0, 0.0, 0.0, 0.0)


def _ranges(counts: tuple[int, ...]) -> list[tuple[int, int]]:
    cuts = np.concatenate(([0], np.cumsum(counts))).tolist()
    return list(zip(cuts, cuts[1:]))


def _place(space: _Space, vectors: list[tuple[int, ...]], micro: tuple[int, ...], d: int,
           rings: list[tuple[tuple[int, ...], float, float, float]], floor: float, rest: float, best: float,
           deadline: Deadline
           ) -> tuple[Plan | None, float | None, int]:
    """Every node assignment of these pipelines' stages whose floor is below `best`, priced exactly;
    (None, None, n) past the deadline. The floor: the slowest pipeline's makespan with its sends on its
    crossings (`floor`: the slowest without crossings) plus `rest` (the optimizer step's floor), or the
    largest makespan-plus-own-optimizer-step, whichever is larger, plus the rings (on their links once
    every stage is placed, on the faster link they may use before)."""
    caps = [len(space.by_node[n]) for n in space.nodes]
    sizes = [len(v) for v in vectors]
    total = sum(sizes)
    starts = np.concatenate(([0], np.cumsum(sizes))).tolist()
    labels: list[int] = []
    used = [0] * len(caps)
    found: Plan | None = None
    placed = 0
    def span(j: int) -> tuple[float, float]:
        own = labels[starts[j]:starts[j + 1]]
        return space.makespan(vectors[j], micro[j], d, tuple(a != b for a, b in zip(own, own[1:])))

    def walk(i: int, slowest: float, coupled: float) -> bool:
        nonlocal best, found, placed
        if deadline.expired():
            return False
        if i == total:
            if max(slowest + rest, coupled) + space.reduce_time(rings, labels) >= best * (1 - PRUNE):
                return True
            chosen = choose_reliefs(space.model, space.plan(vectors, micro, labels), space.failed)
            placed += 1
            if chosen is not None and chosen[1].iteration_time_s < best * (1 - 1e-12):
                best, found = chosen[1].iteration_time_s, chosen[0]
            return True
        fresh: set[int] = set()
        for n in range(len(caps)):
            if used[n] >= caps[n]:
                continue
            if used[n] == 0:  # nodes of equal capacity are interchangeable until used
                if caps[n] in fresh:
                    continue
                fresh.add(caps[n])
            used[n] += 1
            labels.append(n)
            ends = [j for j in range(len(vectors)) if starts[j + 1] == i + 1]
            now, tied = slowest, coupled
            if ends:
                one, both = span(ends[0])
                now, tied = max(now, one), max(tied, both)
            ok = walk(i + 1, now, tied) if max(now + rest, tied) + space.reduce_time(rings, labels) \
                < best * (1 - PRUNE) else True
            labels.pop()
            used[n] -= 1
            if not ok:
                return False
        return True

    if not walk(0, floor, 0.0):
        return None, None, placed
    return found, best, placed
