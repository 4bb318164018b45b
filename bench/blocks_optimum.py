"""The true optimum of a one-device-type instance by enumeration over layer counts, to see which side of
a search's gap is loose (issue 21, depth on real models: relief-faster-8, paper-32).

Independent of the search (it takes only survivor_groups from chameleon_opt.solve, and its floors
are its own, written apart from solve/blocks.py's): every plan it returns is priced by PerfModel.evaluate (reliefs
chosen by perf/relief.choose_reliefs, exact for the step without gradient overlap), and its pruning
uses only lower bounds it derives here from the model's own stage prices.

The space (search.SPACE restricted to one device type, which is all of it when every survivor is of
one type): d pipelines of p_j TP groups (groups inside nodes, sum p_j <= the groups the survivors
form, idle allowed), contiguous splits into p_j non-empty stages (every composition of the layers),
micro-batches m_j >= 1 summing to the global count, every node assignment of the stages (groups of
one node are interchangeable: the model reads a group only through its type, size and node), every
relief per stage. Nodes with the same number of groups are interchangeable (taken in first-use order).

Pruning (each a lower bound of the step of every plan pruned, minus nothing):
- a pipeline's 1F1B time is at least the exact 1F1B makespan with each stage's forward and backward
  at their least over the reliefs that fit its memory at its in-flight count, every send on the faster
  link (the makespan is a longest path: non-decreasing in every operation time);
- the gradient all-reduce is at least, per slot, its layer groups' rings (one ring per set of
  holders, as PerfModel.slot_reduce_times) on the faster of the two links;
- the optimizer step is at least the largest stage's least optimizer time over the reliefs.
A set of count vectors whose floor is at least the incumbent (relative 1e-9) is not placed.
Count vectors of one pipeline are generated depth first, cut where stage s alone (its forward and
backward m times after the stages before it: a path of the 1F1B graph) reaches the incumbent.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chameleon_opt.instance.load import load_instance  # noqa: E402
from chameleon_opt.perf.comm import ring_allgather_time, ring_allreduce_time  # noqa: E402
from chameleon_opt.perf.model import PerfModel  # noqa: E402
from chameleon_opt.perf.pipeline import makespans  # noqa: E402
from chameleon_opt.perf.relief import choose_reliefs  # noqa: E402
from chameleon_opt.plan import Pipeline, Plan, Stage  # noqa: E402
from chameleon_opt.solve.groups import survivor_groups  # noqa: E402

SLACK = 1e-9


class Blocks:
    """Prices and enumeration for one instance."""

    def __init__(self, path: str, failed: frozenset[int] | None = None) -> None:
        self.instance = load_instance(path)
        self.model = PerfModel(self.instance)
        self.failed = self.instance.failed_devices if failed is None else failed
        self.groups = survivor_groups(self.instance, self.failed, self.instance.plan.tensor_parallel)
        if len({self.model.stage_device(g).name for g in self.groups}) != 1:
            raise SystemExit("one device type only")
        self.layers = self.model.workload.num_layers
        self.total = self.instance.global_micro_batches
        self.by_node: dict[int, list[tuple[int, ...]]] = {}
        for g in self.groups:
            self.by_node.setdefault(self.instance.node_of(g[0]), []).append(g)
        self.nodes = sorted(self.by_node)
        self.group = self.groups[0]
        self._op: dict[tuple, tuple[float, float]] = {}
        m = self.model
        self.send = [min(m.boundary_send_on(m.intra, k), m.boundary_send_on(m.inter, k)) for k in range(self.layers)]
        self.grad = m.workload.params * m.grad_bytes / self.instance.plan.tensor_parallel

    def op(self, a: int, e: int, s: int, p: int, mb: int, d: int) -> tuple[float, float]:
        """Least forward and least backward (op overhead, no sends) of stage s of p holding [a, e) over
        the reliefs that fit (inf when none)."""
        x = min(p - s, mb)
        key = (a, e, x, d)
        if key not in self._op:
            m, best = self.model, (math.inf, math.inf)
            for relief in m.relief_options:
                need, have = m.stage_memory(self.group, a, e, p - x, p, mb, 0.0, d, relief)
                if need <= have:
                    f, b, _, _ = m.stage_times(self.group, a, e, relief)
                    best = (min(best[0], f + m.op_overhead_s), min(best[1], b + m.op_overhead_s))
            self._op[key] = best
        return self._op[key]

    def vectors(self, p: int, mb: int, d: int, ceiling: float) -> list[tuple[float, tuple[int, ...]]]:
        """Count vectors of p stages with their 1F1B floor below `ceiling`, cheapest first."""
        found: list[tuple[int, ...]] = []

        def walk(s: int, a: int, before: float, counts: list[int]) -> None:
            left = p - s - 1
            for k in range(1, self.layers - a - left + 1):
                e = a + k if left else self.layers
                if not left and k != self.layers - a:
                    continue
                f, b = self.op(a, e, s, p, mb, d)
                w = f + b + (self.send[e - 1] if left else 0.0) + (self.send[a - 1] if s else 0.0)
                if before + mb * w >= ceiling or not math.isfinite(w):
                    continue  # larger k: not monotone in memory fit, so keep scanning
                if left:
                    walk(s + 1, e, before + w, counts + [k])
                else:
                    found.append(tuple(counts + [k]))
        walk(0, 0, 0.0, [])
        if not found:
            return []
        cuts = np.array([np.concatenate(([0], np.cumsum(c))) for c in found])
        f, b = np.zeros((len(found), p)), np.zeros((len(found), p))
        for row, c in enumerate(cuts):
            for s in range(p):
                fo, ba = self.op(int(c[s]), int(c[s + 1]), s, p, mb, d)
                f[row, s] = fo + (self.send[c[s + 1] - 1] if s < p - 1 else 0.0)
                b[row, s] = ba + (self.send[c[s] - 1] if s else 0.0)
        times = makespans(f, b, mb)
        keep = sorted((float(t), v) for t, v in zip(times, found) if t < ceiling)
        return keep

    def reduce_floor(self, vectors: list[tuple[int, ...]]) -> float:
        """Gradient all-reduce floor of pipelines with these counts (faster link per ring)."""
        m = self.model
        holders: dict[int, list[tuple[int, int]]] = {}
        for j, c in enumerate(vectors):
            start = 0
            for s, k in enumerate(c):
                for layer in range(start, start + k):
                    holders.setdefault(layer, []).append((j, s))
                start += k
        sets: dict[tuple, list[int]] = {}
        for layer, slots in holders.items():
            sets.setdefault(tuple(slots), []).append(layer)
        reduce = ring_allgather_time if m.overlap_param_gather else ring_allreduce_time
        per: dict[tuple[int, int], float] = {}
        for slots, layers in sets.items():
            if len(slots) < 2:
                continue
            nbytes = float(self.grad[layers].sum())
            t = min(reduce(nbytes, len(slots), link) for link in (m.collective, m.inter))
            for slot in slots:
                per[slot] = per.get(slot, 0.0) + t
        return max(per.values(), default=0.0)

    def optimizer_floor(self, vectors: list[tuple[int, ...]], d: int) -> float:
        m, worst = self.model, 0.0
        for c in vectors:
            start = 0
            for k in c:
                worst = max(worst, min(m.optimizer_time(self.group, start, start + k, r, d) for r in m.relief_options))
                start += k
        return worst

    def placements(self, sizes: list[int]):
        """Node labels for every stage (pipelines in order), capacities respected, nodes of equal
        capacity in first-use order."""
        caps = [len(self.by_node[n]) for n in self.nodes]
        total = sum(sizes)
        labels: list[int] = []
        used = [0] * len(caps)

        def walk(i: int):
            if i == total:
                yield list(labels)
                return
            seen_fresh: set[int] = set()
            for n in range(len(caps)):
                if used[n] >= caps[n]:
                    continue
                if used[n] == 0:
                    if caps[n] in seen_fresh:
                        continue
                    seen_fresh.add(caps[n])
                used[n] += 1
                labels.append(n)
                yield from walk(i + 1)
                labels.pop()
                used[n] -= 1
        yield from walk(0)

    def plan(self, vectors: list[tuple[int, ...]], micro: list[int], labels: list[int]) -> Plan:
        taken = {n: 0 for n in range(len(self.nodes))}
        pipes, at = [], 0
        for c, mb in zip(vectors, micro):
            stages, start = [], 0
            for k in c:
                n = labels[at]
                group = self.by_node[self.nodes[n]][taken[n]]
                taken[n] += 1
                at += 1
                stages.append(Stage(group, start, start + k))
                start += k
            pipes.append(Pipeline(tuple(stages), mb))
        return Plan(self.instance.plan.tensor_parallel, tuple(pipes))


def shapes(groups: int, layers: int, total: int):
    """(stage counts non-increasing, micro-batches) of every pipeline set; equal stage counts take
    non-increasing micro-batches."""
    for d in range(1, min(groups, total) + 1):
        def parts(left: int, most: int, k: int):
            if k == 0:
                yield ()
                return
            for p in range(min(most, left - (k - 1), layers), 0, -1):
                for rest in parts(left - p, p, k - 1):
                    yield (p,) + rest
        for counts in parts(groups, groups, d):
            def micro(j: int, left: int):
                if j == d - 1:
                    if left >= 1 and (j == 0 or counts[j] != counts[j - 1] or left <= prev[-1]):
                        yield (left,)
                    return
                for mb in range(1, left - (d - 1 - j) + 1):
                    if j and counts[j] == counts[j - 1] and mb > prev[-1]:
                        continue
                    prev.append(mb)
                    for rest in micro(j + 1, left - mb):
                        yield (mb,) + rest
                    prev.pop()
            prev: list[int] = []
            for split in micro(0, total):
                yield counts, split


def solve(path: str, incumbent: float, deadline_s: float, failed: frozenset[int] | None = None) -> dict:
    bk = Blocks(path, failed)
    start = time.perf_counter()
    best, best_plan = incumbent, None
    explored = placed = 0
    for counts, micro in shapes(len(bk.groups), bk.layers, bk.total):
        if time.perf_counter() - start > deadline_s:
            return {"complete": False, "best": best, "plan": best_plan, "placed": placed}
        d = len(counts)
        lists = []
        for p, mb in zip(counts, micro):
            lists.append(bk.vectors(p, mb, d, best * (1 - SLACK)))
            if not lists[-1]:
                break
        if not lists or not lists[-1]:
            continue
        explored += 1
        for combo in itertools.product(*lists):
            pmax = max(t for t, _ in combo)
            if pmax >= best * (1 - SLACK):
                continue
            vectors = [v for _, v in combo]
            floor = pmax + bk.reduce_floor(vectors) + bk.optimizer_floor(vectors, d)
            if floor >= best * (1 - SLACK):
                continue
            for labels in bk.placements([len(v) for v in vectors]):
                plan = bk.plan(vectors, list(micro), labels)
                chosen = choose_reliefs(bk.model, plan, bk.failed)
                placed += 1
                if chosen is not None and chosen[1].iteration_time_s < best * (1 - 1e-12):
                    best, best_plan = chosen[1].iteration_time_s, chosen[0]
                    print(f"  better {best:.6f}: counts {vectors} micro {micro} labels {labels}", flush=True)
    return {"complete": True, "best": best, "plan": best_plan, "placed": placed, "shapes": explored,
            "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("instance")
    parser.add_argument("--incumbent", type=float, required=True,
                        help="a plan's step (the search's): plans at least this slow are not priced")
    parser.add_argument("--deadline", type=float, default=3600.0)
    parser.add_argument("--failed", help="failed devices, e.g. 0,6 (default: the instance's own)")
    args = parser.parse_args()
    failed = frozenset(int(d) for d in args.failed.split(",")) if args.failed else None
    result = solve(args.instance, args.incumbent * (1 + 1e-9), args.deadline, failed)
    plan = result.pop("plan")
    result["plan"] = plan.to_json() if plan is not None else None
    print(json.dumps(result))


if __name__ == "__main__":
    main()
