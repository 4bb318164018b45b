"""An exact brute force over the whole reconfiguration space, reduced by symmetry, to measure the search.

Why: issue 21's independent check found plans up to 1.55x faster than the plan search's on random
8-24-device instances. This module prices every plan of the space the search claims to cover, on its
own (nothing from `chameleon_opt.solve` is used by the brute force), fast enough for 24 devices, and
compares the search with it (`python bench/brute_force.py --seeds 60`).

The space: TP groups formed inside each node from any of its survivors (any members, any number of
groups, leftovers idle); any set of disjoint pipelines (ordered sequences of those groups, idle groups
allowed); every contiguous non-empty layer split of each pipeline; every allocation of the global
micro-batches to the pipelines (each >= 1; under interleaving each >= the pipeline's stages, as the model and
the checker require: `interleaving_refusal`); with several supported memory reliefs, every relief on
every stage. A plan counts when `PerfModel.evaluate(plan, failed).memory_ok`; its value is
`iteration_time_s`. The brute force returns the minimum (up to PRUNE_TOLERANCE, relative).

Reductions (each keeps at least one plan of every value; the proofs are in `_Space`, `_Search`):
1. A TP group matters only by its node and its stage device type (`PerfModel.stage_device`: the
   slowest member): the model reads a group's devices only through their types, their nodes, its size
   and its first device's node. So devices of one type in one node are interchangeable, and a group is
   (node, effective type); which kinds of group (members' types) a node can form at once is a set of
   effective-type counts per node, precomputed exactly.
2. Nodes with the same surviving composition are interchangeable (the network is uniform): nodes are
   taken in first-use order within each class of identical nodes.
3. A plan is a multiset of pipelines: pipelines are enumerated in one canonical order (non-increasing
   1F1B time, then shape; equal shapes by non-decreasing node tuple). A pipeline is a shape (stage
   layer ranges, effective types, reliefs, micro-batches, and whether consecutive stages share a
   node, which is all its sends depend on; a boundary of 0 bytes sends nothing, so there it is left
   open) and a node per stage.
4. Branch and bound, with bounds that never exceed the step of any completion: the first pipeline in
   that order is the slowest; the optimizer step is a max over stages; the gradient all-reduce only
   grows as pipelines are added (`_Search._reduce_bound`), and pipelines still to come share the
   groups left, so one of them has at most groups/pipelines stages, hence a large stage
   (`_Search._future_bound`); and the groups left must be able to run the micro-batches left
   (`_Search._coverable`). Ties within PRUNE_TOLERANCE are not explored.
Pruning is checked by `bound=False` (every canonical plan priced) and `verify=True` (the reduced
pricing of every priced plan equals PerfModel.evaluate) against the naive enumeration of
tests/test_search_exact.py (tests/test_brute_force.py).

Instances (`random_instance`): LAYERS x MICRO keep the brute force under about 20 s at 24 devices
(120 seeds measured: median 0.03 s); at 7 layers and 7-8 micro-batches on 24 devices some instances
take minutes (many near-equal plans: the bound cannot separate them).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's package, not whichever one pip installed

from chameleon_opt.check import check_plan  # noqa: E402
from chameleon_opt.instance.load import Instance, build_instance  # noqa: E402
from chameleon_opt.perf.comm import ring_allgather_time, ring_allreduce_time  # noqa: E402
from chameleon_opt.perf.model import GIB, PerfModel, interleaving_refusal  # noqa: E402
from chameleon_opt.plan import Pipeline, Plan, Stage  # noqa: E402

OUT = ROOT / "bench" / "out" / "brute_force.json"
LAYERS = (3, 6)
"""Layers of the generated instances (inclusive): with 24 devices the brute force finishes in seconds."""
MICRO = (1, 8)
"""Global micro-batches of the generated instances (inclusive)."""
PRUNE_TOLERANCE = 1e-9
"""A partial plan is dropped when its lower bound is within this relative distance of the incumbent:
ties (frequent: equal pipelines) are not explored again; the optimum is exact to this tolerance."""
MATCH_TOLERANCE = 1e-6
"""The search matches the brute force when its objective is within this relative distance."""
DEFAULT_TIME_LIMIT_S = 10.0
"""`chameleon-solve plan --time-limit`'s default (chameleon_opt/cli.py)."""


# -- random instances ---------------------------------------------------------------------------------

def random_instance(seed: int, devices_range: tuple[int, int] = (8, 24), layers_range: tuple[int, int] = LAYERS,
                    micro_range: tuple[int, int] = MICRO) -> tuple[dict[str, Any], frozenset[int]]:
    """A seeded instance (project instance format, inline workload) and its failed devices.

    devices_range devices in at least two nodes of 1-8 devices; TP 1 or 2 (then nodes have an even
    number of devices); half heterogeneous: a slow type on some devices, 1.2-3x slower per layer, with
    0.5, 1 or 3x the memory; memory ample (2.2x what the largest stage of any plan needs: every stage
    of every plan fits, even on a slow device with half the memory),
    tight (35-90% of the model's state per device, at least 1.3-2x its largest layer) or binding (12-35%,
    at least 1-1.4x its largest layer with one micro-batch in flight: many plans do not fit, some
    instances none);
    1-2 failed devices. Parameters are 1-6e8 per layer, so memory is in realistic GiB."""
    rng = random.Random(seed)
    lo, hi = devices_range
    tp = rng.choice([1, 2])
    while True:
        per_node = rng.choice([2, 4, 6, 8] if tp == 2 else list(range(1, 9)))
        fewest, most = max(2, -(-lo // per_node)), hi // per_node
        if fewest <= most:
            break
    nodes = rng.randint(fewest, most)
    devices = nodes * per_node
    layers = rng.randint(*layers_range)
    micro = rng.randint(*micro_range)
    params = [rng.randint(1, 6) * 10 ** 8 for _ in range(layers)]
    activation = [rng.randint(0, 5) * 10 ** 8 for _ in range(layers)]
    boundary = [rng.choice([0, 10 ** 6, 10 ** 8]) for _ in range(layers)]
    state_gib = sum(params) * 16 / tp / GIB  # bf16 parameters and gradients, fp32 Adam state
    worst_gib = state_gib + min(layers, micro) * sum(activation) / tp / GIB  # any stage, any plan
    floor_gib = max(16 * p + a for p, a in zip(params, activation)) / tp / GIB  # one layer, one in flight
    regime = rng.choice(["ample", "tight", "binding"])
    memory = {"ample": 2.2 * worst_gib,
              "tight": max(state_gib * rng.uniform(0.35, 0.9), floor_gib * rng.uniform(1.3, 2.0)),
              "binding": max(state_gib * rng.uniform(0.12, 0.35), floor_gib * rng.uniform(1.0, 1.4))}[regime]
    fast = [[rng.uniform(0.2, 2.0), rng.uniform(0.2, 4.0), 0.0] for _ in range(layers)]
    profiles = [{"device_type": "fast", "times": {"1": {str(tp): fast}}}]
    cluster: dict[str, Any] = {
        "nodes": nodes, "devices_per_node": per_node,
        "device_type": {"name": "fast", "memory_gib": round(memory, 3), "peak_tflops": 2, "reserved_gib": 0},
        "network": {"intra_node_gbps": 100, "inter_node_gbps": rng.choice([1, 10])}}
    if rng.random() < 0.5:
        slow = [[f * rng.uniform(1.2, 3.0), b * rng.uniform(1.2, 3.0), 0.0] for f, b, _ in fast]
        profiles.append({"device_type": "slow", "times": {"1": {str(tp): slow}}})
        chosen = sorted(rng.sample(range(devices), rng.randint(1, max(devices // 2, 1))))
        cluster["overrides"] = [{"devices": chosen, "device_type": {
            "name": "slow", "memory_gib": round(memory * rng.choice([0.5, 1.0, 3.0]), 3), "peak_tflops": 1,
            "reserved_gib": 0}}]
    failed = frozenset(rng.sample(range(devices), rng.randint(1, min(2, devices - 1))))
    data = {
        "format": 1, "name": f"brute-{seed}", "description": f"bench/brute_force.py seed {seed}: {regime} memory",
        "cluster": cluster,
        "workload": {"inline": {"name": "toy", "layer_bytes": {
            "params": params, "activation_bytes_per_sample": activation, "boundary_bytes_per_sample": boundary},
            "profiles": profiles}},
        "training": {"global_batch": micro, "micro_batch_size": 1},
        "plan": {"tensor_parallel": tp, "layout": {"pipeline_parallel": 1, "data_parallel": min(micro, devices // tp)}},
        "failures": {"events": [{"devices": sorted(failed)}]},
    }
    return data, failed


def regime_of(data: dict[str, Any]) -> str:
    """The memory regime random_instance chose (kept in the description)."""
    return data.get("description", "").rsplit(": ", 1)[-1].split(" ")[0]


# -- the reduced space --------------------------------------------------------------------------------

@dataclass(slots=True)
class Shape:
    """A pipeline without its nodes: everything its 1F1B time, memory and optimizer step depend on.

    Stage s holds layers [ends[s-1], ends[s]) on a group of effective type types[s]; same[s] says
    whether stage s+1 is on stage s's node (the only node fact its sends depend on; None: either, the
    boundary sends nothing)."""

    index: int
    micro: int
    ends: tuple[int, ...]
    types: tuple[int, ...]
    same: tuple[bool | None, ...]
    reliefs: tuple[str | None, ...]
    time: float = 0.0          # the 1F1B makespan (PerfModel.pipeline_time)
    optimizer: float = 0.0     # the slowest stage's optimizer step
    fits_alone: bool = True    # every stage fits when this is the plan's only pipeline
    fits_shared: bool = True   # ... when there are others (data-parallel replicas)

    @property
    def stages(self) -> int:
        return len(self.ends)


def _bottlenecks(values: list[float]) -> list[float]:
    """floor[k]: the least, over splits of `values` into k contiguous non-empty parts, of the largest
    part's sum (k = 1..len(values); floor[0] = inf). Non-increasing in k: splitting a part further
    never raises the largest."""
    size = len(values)
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    # best[k][e]: the least largest part over splits of values[:e] into k parts.
    best = [[math.inf] * (size + 1) for _ in range(size + 1)]
    best[0][0] = 0.0
    for k in range(1, size + 1):
        for e in range(k, size + 1):
            best[k][e] = min(max(best[k - 1][b], prefix[e] - prefix[b]) for b in range(k - 1, e))
    return [math.inf] + [best[k][size] for k in range(1, size + 1)]


class _Space:
    """The instance reduced to classes: node compositions, group kinds, shapes.

    Exactness of reduction 1: PerfModel reads a stage's devices only through stage_device (the min of
    the members' types), len(devices), the set of their nodes and devices[0]'s node (stage_costs,
    stage_times, stage_memory, boundary_send_time, group_link, optimizer_time), and check_plan
    only through their ids' validity and distinctness. A group is inside one node (the space's rule),
    so two groups on the same node with equal effective types are interchangeable in every plan."""

    def __init__(self, instance: Instance, failed: frozenset[int], model: PerfModel) -> None:
        self.instance, self.model = instance, model
        self.tp = instance.plan.tensor_parallel
        self.layers = instance.workload.num_layers
        self.micro = instance.global_micro_batches
        types: list[Any] = []
        self.type_of: dict[int, int] = {}
        for d in range(instance.num_devices):
            if d in failed:
                continue
            t = instance.device_types[d]
            if t not in types:
                types.append(t)
            self.type_of[d] = types.index(t)
        self.types = types
        pools: dict[int, list[list[int]]] = {}
        for d, t in self.type_of.items():
            pools.setdefault(instance.node_of(d), [[] for _ in types])[t].append(d)
        # Nodes that can form at least one group; their compositions (survivors per type).
        self.pools = {n: p for n, p in sorted(pools.items()) if sum(map(len, p)) >= self.tp}
        self.nodes = list(self.pools)
        self.composition = {n: tuple(len(p) for p in self.pools[n]) for n in self.nodes}
        # Group kinds (members' types) and their effective type, as the model chooses it.
        self.kinds = list(itertools.combinations_with_replacement(range(len(types)), self.tp))
        self.kind_type = [types.index(min((types[t] for t in kind),
                                          key=lambda t: (t.peak_tflops * t.efficiency, t.memory_gib)))
                          for kind in self.kinds]
        self._check_kind_types()
        # Reduction 1: what each composition can host, as effective-type counts -> one realisation.
        self.achievable: dict[tuple[int, ...], dict[tuple[int, ...], tuple[int, ...]]] = {}
        for comp in set(self.composition.values()):
            self.achievable[comp] = self._achievable(comp)
        # Reduction 2: classes of identical nodes, members in increasing order.
        self.node_class: dict[int, int] = {}
        self.classes: list[list[int]] = []
        by_comp: dict[tuple[int, ...], int] = {}
        for n in self.nodes:
            c = by_comp.setdefault(self.composition[n], len(self.classes))
            if c == len(self.classes):
                self.classes.append([])
            self.classes[c].append(n)
            self.node_class[n] = c
        self.max_groups = {n: max(sum(v) for v in self.achievable[self.composition[n]]) for n in self.nodes}
        self.max_of_type = [sum(max(v[t] for v in self.achievable[self.composition[n]]) for n in self.nodes)
                            for t in range(len(types))]
        self.total_groups = sum(self.max_groups.values())
        self.present = sorted({t for n in self.nodes for v in self.achievable[self.composition[n]]
                               for t, c in enumerate(v) if c})
        # A representative group per (node, effective type) to price shapes with.
        self.rep: dict[tuple[int, int], tuple[int, ...]] = {}
        for n in self.nodes:
            for t in self.present:
                groups = self.realise(n, tuple(int(i == t) for i in range(len(types))))
                if groups:
                    self.rep[(n, t)] = groups[0]
        reliefs = model.relief_options
        self.relief_choices: tuple[str | None, ...] = tuple(reliefs) if len(reliefs) > 1 else (None,)
        grad = instance.workload.params * model.grad_bytes / self.tp
        self.grad_bytes = [float(g) for g in grad]
        self.grad_prefix = [0.0]
        for g in self.grad_bytes:
            self.grad_prefix.append(self.grad_prefix[-1] + g)
        # Per layer, the least optimizer step any group and relief gives it (the step is additive in
        # layers); over k-stage splits, the least possible largest stage (bytes, optimizer step).
        reps = {t: g for (n, t), g in self.rep.items()}
        self.layer_optimizer = [min((model.optimizer_time(g, layer, layer + 1, r)
                                     for g in reps.values() for r in self.relief_choices), default=0.0)
                                for layer in range(self.layers)]
        self.bytes_floor = _bottlenecks(self.grad_bytes)
        self.optimizer_floor = _bottlenecks(self.layer_optimizer)

    def _check_kind_types(self) -> None:
        """The effective type computed here must be the model's (the reduction relies on it). With two
        types tied on the model's key, its choice would follow the members' order: not supported."""
        keys = [(t.peak_tflops * t.efficiency, t.memory_gib) for t in self.types]
        if len(set(keys)) < len(keys):
            raise NotImplementedError("two device types tie on (peak x efficiency, memory)")
        for kind, t in zip(self.kinds, self.kind_type):
            members = []
            for member in kind:
                d = next((d for d, u in self.type_of.items() if u == member and d not in members), None)
                if d is None:
                    break
                members.append(d)
            else:
                assert self.model.stage_device(tuple(members)) == self.types[t], (kind, t)

    def _achievable(self, comp: tuple[int, ...]) -> dict[tuple[int, ...], tuple[int, ...]]:
        """Every effective-type count vector a node of composition `comp` can host at once (kinds
        counts realising it). Downward closed: dropping a group leaves its devices idle."""
        found: dict[tuple[int, ...], tuple[int, ...]] = {}
        width = len(self.types)

        def walk(k: int, left: list[int], counts: list[int], demand: list[int]) -> None:
            if k == len(self.kinds):
                found.setdefault(tuple(demand), tuple(counts))
                return
            kind = self.kinds[k]
            need = [kind.count(t) for t in range(width)]
            c = 0
            while True:
                walk(k + 1, left, counts + [c], demand)
                if any(left[t] < need[t] for t in range(width)):
                    break
                left = [left[t] - need[t] for t in range(width)]
                demand = list(demand)
                demand[self.kind_type[k]] += 1
                c += 1
        walk(0, list(comp), [], [0] * width)
        return found

    def realise(self, node: int, demand: tuple[int, ...]) -> list[tuple[int, ...]] | None:
        """Concrete groups on `node` for an effective-type demand: groups[t-ordered]; None if impossible."""
        counts = self.achievable[self.composition[node]].get(demand)
        if counts is None:
            return None
        pools = [list(p) for p in self.pools[node]]
        groups: list[tuple[int, ...]] = []
        for kind, count in zip(self.kinds, counts):
            for _ in range(count):
                groups.append(tuple(sorted(pools[t].pop(0) for t in kind)))
        return groups

    def fits(self, node: int, demand: tuple[int, ...]) -> bool:
        return demand in self.achievable[self.composition[node]]

    # -- shapes -------------------------------------------------------------------------------------
    def hostable(self, types: tuple[int, ...], same: tuple[bool | None, ...]) -> bool:
        """Whether some node per stage (honouring `same`: True same node as the previous stage, False
        another, None either) has room for all of the shape's groups at once; nodes of a class are
        tried in order (reduction 2)."""
        demand = {n: [0] * len(self.types) for n in self.nodes}
        chosen: list[int] = []

        def walk(s: int) -> bool:
            if s == len(types):
                return True
            link = same[s - 1] if s else None
            if link is True:
                options = [chosen[-1]]
            else:
                fresh = [next(n for n in members if n not in chosen) for members in self.classes
                         if any(n not in chosen for n in members)]
                options = sorted(set(chosen) | set(fresh))
                if link is False:
                    options = [n for n in options if n != chosen[-1]]
            for n in options:
                demand[n][types[s]] += 1
                if self.fits(n, tuple(demand[n])):
                    chosen.append(n)
                    if walk(s + 1):
                        return True
                    chosen.pop()
                demand[n][types[s]] -= 1
            return False
        return walk(0)

    def shapes(self) -> list[Shape]:
        """Every shape some node sequence can host and in which every stage fits in memory for some
        plan, priced by the model (stage times, sends, memory, optimizer step on representative
        groups; the 1F1B time by PerfModel.pipeline_time, as evaluate prices each pipeline).

        A cut whose boundary activation has no bytes costs no send on any link (boundary_send_time is 0
        for 0 bytes), so its `same` is None: both node choices are one shape (exact: nothing the
        model prices differs)."""
        model, virtual, micro = self.model, self.model.options.virtual_stages or 1, self.micro
        reps = {t: g for (n, t), g in sorted(self.rep.items(), reverse=True)}
        live = sorted(self.type_of)
        here = (live[0],)
        other = next(((d,) for d in live if self.instance.node_of(d) != self.instance.node_of(here[0])), None)
        free_cut = [float(self.instance.workload.boundary_bytes_per_sample[layer]) <= 0 for layer in range(self.layers)]
        times: dict[tuple, tuple[float, float]] = {}
        optimizer: dict[tuple, float] = {}
        fits: dict[tuple, tuple[tuple[bool, ...], tuple[bool, ...]]] = {}
        sends: dict[tuple[int, bool | None], float] = {}
        hostable: dict[tuple, bool] = {}
        unknown_memory = model.zero_stage != 0  # memory then depends on the replica count: decided per plan

        def send(last: int, same: bool | None) -> float:
            key = (last, same)
            if key not in sends:
                receiver = here if same or same is None or other is None else other
                sends[key] = model.boundary_send_time(here, receiver, last)
            return sends[key]

        def stage_fits(t: int, a: int, b: int, s: int, k: int, relief: str | None) -> tuple[tuple[bool, ...], ...]:
            key = (t, a, b, s, k, relief)
            if key not in fits:
                g = reps[t]
                capacity = model.stage_device(g).memory_gib * GIB
                fits[key] = tuple(tuple(unknown_memory or
                                        model.stage_memory(g, a, b, s, k, m, 0.0, replicas, relief)[0] <= capacity
                                        for m in range(1, micro + 1)) for replicas in (1, 2))
            return fits[key]

        shapes: list[Shape] = []
        for k in range(1, min(self.layers, self.total_groups) + 1):
            for cuts in itertools.combinations(range(1, self.layers), k - 1):
                ends = cuts + (self.layers,)
                starts = (0,) + cuts
                for types in itertools.product(self.present, repeat=k):
                    for reliefs in itertools.product(self.relief_choices, repeat=k):
                        per_stage = [stage_fits(t, a, b, s, k, r)
                                     for s, (t, a, b, r) in enumerate(zip(types, starts, ends, reliefs))]
                        alone = [all(f[0][m] for f in per_stage) for m in range(micro)]
                        shared = [all(f[1][m] for f in per_stage) for m in range(micro)]
                        if not any(alone) and not any(shared):
                            continue
                        fwd, bwd, opt = [], [], 0.0
                        for t, a, b, r in zip(types, starts, ends, reliefs):
                            key = (t, a, b, r)
                            if key not in times:
                                f, bw, _, _ = model.stage_times(reps[t], a, b, r)
                                times[key] = (f, bw)
                                # unsharded: under ZeRO >= 1 the search divides by the plan's shards
                                optimizer[key] = model.optimizer_time(reps[t], a, b, r)
                            fwd.append(times[key][0])
                            bwd.append(times[key][1])
                            opt = max(opt, optimizer[key])
                        choices = [(None,) if free_cut[c - 1] else (True, False) for c in cuts]
                        for same in itertools.product(*choices):
                            if (types, same) not in hostable:
                                hostable[(types, same)] = self.hostable(types, same)
                            if not hostable[(types, same)]:
                                continue
                            costs = [_Op(fwd[s], bwd[s], send(ends[s] - 1, same[s]) if s + 1 < k else 0.0,
                                         send(starts[s] - 1, same[s - 1]) if s else 0.0) for s in range(k)]
                            for m in range(1, micro + 1):
                                if (alone[m - 1] or shared[m - 1]) and interleaving_refusal(k, m, virtual) is None:
                                    shapes.append(Shape(len(shapes), m, ends, types, same, reliefs,
                                                        model.pipeline_time(costs, m, virtual), opt,
                                                        alone[m - 1], shared[m - 1]))
        return shapes


@dataclass(frozen=True)
class _Op:
    """A stage's per-micro-batch times as PerfModel.pipeline_time reads a StageCost (same sums)."""

    forward_s: float
    backward_s: float
    send_forward_s: float
    send_backward_s: float

    @property
    def op_forward_s(self) -> float:
        return self.forward_s + self.send_forward_s

    @property
    def op_backward_s(self) -> float:
        return self.backward_s + self.send_backward_s


# -- the branch and bound -----------------------------------------------------------------------------

@dataclass
class _Fixed:
    """One chosen pipeline: its shape and the node of each stage (and, per layer, its stage and node)."""

    shape: Shape
    nodes: tuple[int, ...]
    stage_of: tuple[int, ...] = ()
    node_of: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        first, stage_of = 0, []
        for s, end in enumerate(self.shape.ends):
            stage_of += [s] * (end - first)
            first = end
        self.stage_of = tuple(stage_of)
        self.node_of = tuple(self.nodes[s] for s in stage_of)


@dataclass
class Result:
    best: float
    plan: Plan | None
    plans: int           # complete plans priced
    evaluations: int     # of which PerfModel.evaluate was called on (possible improvements)
    complete: bool       # the whole space was covered (not cut by the deadline)
    shapes: int = 0
    nodes: int = 0       # branch-and-bound nodes
    wall_s: float = 0.0


class _Search:
    """Pipelines in canonical order: non-increasing (time, -index) of the shape, equal shapes by
    non-decreasing node tuple, nodes of each class first used in increasing order.

    Reductions 2 and 3 together are exact: among all orderings of a plan's pipelines and all
    relabellings of nodes within their classes, take the lexicographically smallest sequence of
    (key, node tuple), key = (-time, shape index). Swapping two adjacent pipelines out of key order, or
    of equal key with decreasing node tuples, would give a smaller sequence; so would exchanging a node
    x with an unused-so-far node y < x of its class at x's first use (every earlier entry is unchanged
    and x's entry becomes y). So that smallest sequence satisfies every rule enumerated here, and every
    plan has a representative that is enumerated."""

    def __init__(self, space: _Space, shapes: list[Shape], failed: frozenset[int], deadline: float,
                 verify: bool = False, bound: bool = True) -> None:
        self.space, self.model, self.failed = space, space.model, failed
        self.deadline, self.verify, self.bounded = deadline, verify, bound
        self.order = sorted(shapes, key=lambda s: (-s.time, s.index))  # canonical key ascending
        # Candidates after the first pipeline, as positions in `order`, by (micro-batches, stages,
        # groups of each type): the coverage test rules out a whole bucket at once.
        self.counts = [tuple(s.types.count(t) for t in range(len(space.types))) for s in self.order]
        self.buckets: dict[tuple[int, int, tuple[int, ...]], list[int]] = {}  # (micro, stages, counts)
        for i, s in enumerate(self.order):
            if s.fits_shared:
                self.buckets.setdefault((s.micro, s.stages, self.counts[i]), []).append(i)
        # Over the shapes at positions >= i that can share a plan: the most micro-batches per group
        # (coverage bound), the most micro-batches, the least optimizer step.
        size = len(self.order)
        self.ratio, self.micro_max, self.optimizer_min = [0.0] * (size + 1), [0] * (size + 1), [math.inf] * (size + 1)
        for i in range(size - 1, -1, -1):
            s = self.order[i]
            shared = s.fits_shared
            self.ratio[i] = max(self.ratio[i + 1], s.micro / s.stages if shared else 0.0)
            self.micro_max[i] = max(self.micro_max[i + 1], s.micro if shared else 0)
            self.optimizer_min[i] = min(self.optimizer_min[i + 1], s.optimizer if shared else math.inf)
        # Per effective type t, the most micro-batches per group of type t (inf when a shape uses none).
        self.type_ratio = [[0.0] * (size + 1) for _ in space.types]
        for t, ratio in enumerate(self.type_ratio):
            for i in range(size - 1, -1, -1):
                s = self.order[i]
                used = s.types.count(t)
                own = (s.micro / used if used else math.inf) if s.fits_shared else 0.0
                ratio[i] = max(ratio[i + 1], own)
        # The model's gradient ring (PerfModel.slot_reduce_times): the reduce-scatter half alone when the
        # parameter all-gather overlaps the next forward; under ZeRO-3 the gradients were reduce-scattered
        # inside the backward, so no bound is taken from the ring (every plan is priced by the model).
        self.ring_bound = not self.model.options.overlap_grad_reduce and self.model.zero_stage < 3
        # ZeRO >= 1 steps the optimizer per shard, and its shards follow the plan's replica count: the
        # shapes' steps (priced at the most replicas) are then bounds only, and plans are priced by the model
        self.exact_reduce = self.ring_bound and self.model.zero_stage == 0
        self.ring = ring_allgather_time if self.model.overlap_param_gather else ring_allreduce_time
        self.memory_known = self.model.zero_stage == 0
        self.intra, self.inter = self.model.intra, self.model.inter
        self.best, self.best_plan = math.inf, None
        self.plans = self.evaluations = self.visited = 0
        self.stopped = False
        self.fixed: list[_Fixed] = []
        self.demand: dict[int, list[int]] = {n: [0] * len(space.types) for n in space.nodes}
        self.uses: dict[int, int] = {}  # stages per node so far
        self.type_used = [0] * len(space.types)  # stages per effective type so far

    # -- bounds -----------------------------------------------------------------------------------
    def _future(self, i: int, left: int) -> int:
        """At least this many pipelines are still to come: the next ones sit at positions >= i of the
        order, where no shape runs more than micro_max[i] micro-batches."""
        if left == 0:
            return 0
        most = self.micro_max[i]
        return -(-left // most) if most else left  # no shape can follow: no completion to bound

    def _reduce_bound(self, i: int, left: int) -> tuple[float, bool]:
        """A lower bound on the plan's gradient all-reduce over every completion (exact when `left`
        is 0), over the fixed slots; and whether some layer's ring could still stay inside one node.

        Each layer is reduced among the N slots that hold it (one per pipeline); layers held by the
        same slots form one group: the layer intervals between consecutive stage boundaries of all
        pipelines. A slot's time is the sum of its groups' ring all-reduces. Adding pipelines (a) raises
        N (to at least N + _future), and a ring's time grows with N; (b) can only split an interval, and a
        ring's time is affine in bytes with a non-negative constant, so the parts cost at least the
        whole; (c) can only add nodes to an interval's ring: one spanning nodes stays inter-node, one on
        a single node stays intra-node only if every future pipeline puts a group there (so that node
        must have that many groups left), else the faster of both links is all we know. And the max over
        fixed slots is at most the max over all slots. With overlapped reduction the exposed time is
        only known to be >= 0."""
        if not self.ring_bound:
            return 0.0, True
        future = self._future(i, left)
        n = len(self.fixed) + future
        if n < 2:
            return 0.0, True
        cuts = sorted({e for f in self.fixed for e in f.shape.ends})
        totals = [[0.0] * f.shape.stages for f in self.fixed]
        start, local, prefix = 0, False, self.space.grad_prefix
        for end in cuts:
            nbytes = prefix[end] - prefix[start]  # integers in floats: exact, as the model's sum
            if nbytes > 0:
                slots = [f.stage_of[start] for f in self.fixed]
                nodes = {f.node_of[start] for f in self.fixed}
                inter = self.ring(nbytes, n, self.inter)
                if len(nodes) > 1:
                    t = inter
                elif not future:
                    t = self.ring(nbytes, n, self.intra)
                else:
                    node = next(iter(nodes))
                    stays = self.space.max_groups[node] - self.uses.get(node, 0) >= future
                    local = local or stays
                    t = min(self.ring(nbytes, n, self.intra), inter) if stays else inter
                for j, s in enumerate(slots):
                    totals[j][s] += t
            start = end
        return max(max(t) for t in totals), local

    def _future_bound(self, i: int, left: int, local: bool) -> tuple[float, float]:
        """Bounds (optimizer step, all-reduce) from the pipelines still to come: F >= _future of them
        share at most G groups, so one has k <= G // F stages; its largest stage holds at least
        bytes_floor[k] gradient bytes and takes at least optimizer_floor[k] to step; that slot reduces
        them among N + F slots (ring time is subadditive over its intervals), inter-node unless some
        layer's ring can stay inside one node (`local`, from _reduce_bound)."""
        future = self._future(i, left)
        if not future:
            return 0.0, 0.0
        k = min(self._groups_left() // future, self.space.layers)
        if k == 0:
            return math.inf, math.inf
        optimizer = self.space.optimizer_floor[k]
        if not self.ring_bound:
            return optimizer, 0.0
        n = len(self.fixed) + future
        nbytes = self.space.bytes_floor[k]
        reduce = self.ring(nbytes, n, self.inter)
        if local:
            reduce = min(reduce, self.ring(nbytes, n, self.intra))
        return optimizer, reduce

    def _optimizer_bound(self, i: int, left: int) -> float:
        """The optimizer step is the max over all stages: at least the fixed ones' and, when pipelines
        are to come, the least any shape at positions >= i has."""
        fixed = max(f.shape.optimizer for f in self.fixed)
        return max(fixed, self.optimizer_min[i]) if left else fixed

    def _parts(self, i: int, left: int) -> tuple[float, float]:
        """(optimizer bound, all-reduce bound) of every completion of the fixed pipelines. The
        shapes' optimizer steps are unsharded; under ZeRO >= 1 every layer ends with one replica per
        pipeline, at most the fixed ones plus one per micro-batch and group left, and the step
        divides by that many replicas' shard group at most (exact once nothing is left)."""
        reduce, local = self._reduce_bound(i, left)
        optimizer = self._optimizer_bound(i, left)
        future_optimizer, future_reduce = self._future_bound(i, left, local)
        return max(optimizer, future_optimizer) / self._shards(left), max(reduce, future_reduce)

    def _shards(self, left: int) -> float:
        """The most any completion's optimizer step is divided by (ZeRO's shard group of the most
        pipelines it can have: one more per micro-batch and group left; 1 without ZeRO)."""
        return self.model.optimizer_shards(len(self.fixed) + min(left, self._groups_left()))

    def _bound(self, i: int, left: int) -> float:
        """Step of every completion >= the slowest pipeline (the first, by the order) + the optimizer
        bound + the all-reduce bound (the step is their sum: evaluate without reduce overlap)."""
        optimizer, reduce = self._parts(i, left)
        return self.fixed[0].shape.time + optimizer + reduce

    def _prunes(self, bound: float) -> bool:
        """Whether a lower bound leaves nothing to gain (never, when bounds are off: then every
        canonical plan is priced, to test the symmetry reductions alone)."""
        return self.bounded and not self._improves(bound)

    def _improves(self, value: float) -> bool:
        return value < self.best * (1 - PRUNE_TOLERANCE)

    # -- plans ------------------------------------------------------------------------------------
    def plan(self) -> Plan:
        """The concrete plan of the fixed pipelines: groups realised per node (reduction 1)."""
        groups: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        for n, demand in self.demand.items():
            if any(demand):
                realised = self.space.realise(n, tuple(demand))
                assert realised is not None
                for g in realised:
                    t = self.space.kind_type[self.space.kinds.index(
                        tuple(sorted(self.space.type_of[d] for d in g)))]
                    groups.setdefault((n, t), []).append(g)
        pipelines = []
        for f in self.fixed:
            stages, first = [], 0
            for end, t, n, relief in zip(f.shape.ends, f.shape.types, f.nodes, f.shape.reliefs):
                stages.append(Stage(groups[(n, t)].pop(), first, end, relief))
                first = end
            pipelines.append(Pipeline(tuple(stages), f.shape.micro))
        return Plan(self.space.tp, tuple(pipelines))

    def _complete(self) -> None:
        """Price a complete plan: exactly from the parts when they are exact (no overlap, ZeRO 0), and
        through PerfModel.evaluate whenever it might improve the incumbent."""
        self.plans += 1
        value = self._bound(0, 0)
        if self.verify or self._improves(value) or not (self.exact_reduce and self.memory_known):
            plan = self.plan()
            estimate = self.model.evaluate(plan, self.failed)
            self.evaluations += 1
            if self.verify and self.exact_reduce:
                assert math.isclose(estimate.iteration_time_s, value, rel_tol=1e-9), (estimate.iteration_time_s,
                                                                                      value, plan)
                assert estimate.memory_ok or not self.memory_known, plan
            if estimate.memory_ok and estimate.iteration_time_s < self.best:
                self.best, self.best_plan = estimate.iteration_time_s, plan

    # -- enumeration ------------------------------------------------------------------------------
    def _node_tuples(self, shape: Shape, floor: tuple[int, ...] | None) -> Any:
        """Node tuples for `shape` under the first-use rule and the nodes' capacities (tuples >= floor
        when the previous pipeline has the same shape); the demand is applied while each is yielded."""
        space, k = self.space, shape.stages
        chosen: list[int] = []

        def walk(s: int, tight: bool) -> Any:
            if s == k:
                yield tuple(chosen)
                return
            t = shape.types[s]
            link = shape.same[s - 1] if s else None
            if link is True:
                options = [chosen[-1]]
            else:
                fresh = []
                for members in space.classes:
                    for n in members:
                        if not self.uses.get(n):
                            fresh.append(n)  # the first unused node of each class
                            break
                options = sorted([n for n in space.nodes if self.uses.get(n)] + fresh)
                if link is False:
                    options = [n for n in options if n != chosen[-1]]
            for n in options:
                if tight and floor is not None and n < floor[s]:
                    continue
                demand = self.demand[n]
                demand[t] += 1
                try:
                    if space.fits(n, tuple(demand)):
                        self.uses[n] = self.uses.get(n, 0) + 1
                        self.type_used[t] += 1
                        chosen.append(n)
                        try:
                            yield from walk(s + 1, tight and floor is not None and n == floor[s])
                        finally:  # also when the caller stops early (the generator is closed)
                            chosen.pop()
                            self.uses[n] -= 1
                            self.type_used[t] -= 1
                finally:
                    demand[t] -= 1
        yield from walk(0, floor is not None)

    def _coverable(self, i: int, left: int, stages: int = 0, counts: tuple[int, ...] | None = None) -> bool:
        """Whether `stages` more groups with `counts` of each type fit and the groups left then could run
        `left` micro-batches with shapes at positions >= i: a pipeline of shape s runs m_s
        micro-batches on u_t(s) groups of type t, so for any weights y >= 0 the micro-batches are at
        most max_s m_s / (y . u(s)) x (y . groups left); y = all ones, and y = each type alone (weak
        LP duality). Monotone in i: once false it stays false for larger i."""
        groups = self._groups_left() - stages
        if groups < 0 or left > self.ratio[i] * groups + 1e-9:
            return False
        for t, ratio in enumerate(self.type_ratio):
            free = self.space.max_of_type[t] - self.type_used[t] - (counts[t] if counts is not None else 0)
            if free < 0:
                return False  # the groups added do not fit
            if left and ratio[i] != math.inf and left > ratio[i] * free + 1e-9:
                return False  # (inf: some shape uses no group of type t, no bound from it)
        return True

    def _groups_left(self) -> int:
        """At most this many more groups fit (each node's most groups, less the stages placed there)."""
        return self.space.total_groups - sum(self.type_used)

    def _time_up(self) -> bool:
        self.visited += 1
        if self.visited % 256 == 0 and time.perf_counter() > self.deadline:
            self.stopped = True
        return self.stopped

    def _regular(self, budget_s: float) -> None:
        """Incumbents before the search: p pipelines of one shape apart from their micro-batches (split
        as evenly as possible), greedily placed, for every p and shape in order of speed, within
        `budget_s`. Only an upper bound: it lets the bound prune from the start (without one, a search
        can wander long in partial plans that no completion fits)."""
        end = time.perf_counter() + budget_s
        bases: dict[tuple, dict[int, Shape]] = {}
        for shape in self.order:
            bases.setdefault((shape.ends, shape.types, shape.same, shape.reliefs), {})[shape.micro] = shape
        total = self.space.micro
        for p in range(1, min(total, self.space.total_groups) + 1):
            low, extra = divmod(total, p)
            options = []
            for by_micro in bases.values():
                picked = [by_micro.get(low + 1)] * extra + [by_micro.get(low)] * (p - extra)
                if all(s is not None and (s.fits_alone if p == 1 else s.fits_shared) for s in picked):
                    options.append(sorted(picked, key=lambda s: -s.time))
            for picked in sorted(options, key=lambda picked: picked[0].time):
                if picked[0].time >= self.best or time.perf_counter() > end:
                    break
                self._place(picked)

    def _place(self, picked: list[Shape]) -> None:
        """Fix `picked` (slowest first) on the first node tuples that fit, and price the plan."""
        if len(self.fixed) == len(picked):
            self._complete()
            return
        tuples = self._node_tuples(picked[len(self.fixed)], None)
        for nodes in tuples:
            self.fixed.append(_Fixed(picked[len(self.fixed)], nodes))
            self._place(picked)
            self.fixed.pop()
            break
        tuples.close()  # gives the nodes back

    def run(self) -> None:
        self._regular(max(min(5.0, 0.1 * (self.deadline - time.perf_counter())), 0.0))
        total = self.space.micro
        for i in range(len(self.order) - 1, -1, -1):  # the slowest pipeline, fastest first
            shape = self.order[i]
            if self.stopped or self._prunes(shape.time):
                break  # every later first pipeline is at least as slow
            left = total - shape.micro
            if left < 0 or not (shape.fits_alone if left == 0 else shape.fits_shared):
                continue
            if self.bounded and not self._coverable(i, left, shape.stages, self.counts[i]):
                continue  # whatever its nodes, the rest cannot be covered
            tuples = self._node_tuples(shape, None)
            for nodes in tuples:
                self.fixed.append(_Fixed(shape, nodes))
                self._descend(i, left)
                self.fixed.pop()
                if self._time_up():
                    break
            tuples.close()

    def _descend(self, i: int, left: int) -> None:
        """Extend with pipelines at positions >= i of the order (none slower than the last), `left`
        micro-batches still to allocate."""
        if left and self.bounded and not self._coverable(i, left):
            return
        if self._prunes(self._bound(i, left)):
            return
        if left == 0:
            self._complete()
            return
        if self._time_up():
            return
        last = self.fixed[-1]
        optimizer, reduce = self._parts(i, left)
        base, shards = self.fixed[0].shape.time + reduce, self._shards(left)  # no child has more shards
        for (m, stages, counts), positions in self.buckets.items():
            if m > left or (self.bounded and not self._coverable(i, left - m, stages, counts)):
                continue  # no shape of this bucket fits and leaves a coverable rest
            for p in positions[bisect.bisect_left(positions, i):]:
                if self.bounded and not self._coverable(p, left - m, stages, counts):
                    break  # nor at any later position
                shape = self.order[p]
                if self._prunes(base + max(optimizer, shape.optimizer / shards)):
                    continue  # its optimizer step alone closes the gap (the bound only grows)
                floor = last.nodes if shape is last.shape else None
                tuples = self._node_tuples(shape, floor)
                for nodes in tuples:
                    self.fixed.append(_Fixed(shape, nodes))
                    self._descend(p, left - m)
                    self.fixed.pop()
                    if self.stopped:
                        tuples.close()
                        return


def brute_force(instance: Instance, failed: frozenset[int], deadline_s: float = math.inf,
                verify: bool = False, bound: bool = True) -> tuple[float, Plan | None, int, bool]:
    """(best step, its plan, complete plans priced, whether the whole space was covered) over the
    whole space (module docstring), by PerfModel.evaluate; inf and None when no plan fits in memory.
    `verify` evaluates every complete plan with the model and asserts the reduced pricing equals it;
    `bound=False` prices every canonical plan (no branch and bound: small instances only)."""
    result = brute_force_result(instance, failed, deadline_s, verify, bound)
    return result.best, result.plan, result.plans, result.complete


def brute_force_result(instance: Instance, failed: frozenset[int], deadline_s: float = math.inf,
                       verify: bool = False, bound: bool = True) -> Result:
    """brute_force with its counters (shapes, branch-and-bound nodes, evaluations, wall time)."""
    start = time.perf_counter()
    model = PerfModel(instance)
    space = _Space(instance, failed, model)
    shapes = space.shapes()
    search = _Search(space, shapes, failed, start + deadline_s, verify, bound)
    search.run()
    if search.best_plan is not None:
        report = check_plan(instance, search.best_plan, failed, model=model)
        assert report.ok, report.violations
    return Result(search.best, search.best_plan, search.plans, search.evaluations, not search.stopped,
                  len(shapes), search.visited, time.perf_counter() - start)


# -- the comparison with the search -------------------------------------------------------------------

def compare(seed: int, devices: tuple[int, int], time_limit_s: float, brute_limit_s: float,
            virtual_stages: int = 1, layers: tuple[int, int] = LAYERS) -> dict[str, Any]:
    """One instance: the brute force's optimum against search_plan's answer under `time_limit_s`;
    virtual_stages > 1 prices both under interleaved 1F1B (training.virtual_stages).
    A search that raises is recorded (status CRASH and the error), not propagated."""
    from chameleon_opt.solve.deadline import Deadline  # the search, only for the comparison
    from chameleon_opt.solve.search import search_plan

    data, failed = random_instance(seed, devices, layers)
    if virtual_stages > 1:
        data["training"]["virtual_stages"] = virtual_stages
    instance = build_instance(data)
    brute = brute_force_result(instance, failed, brute_limit_s)
    row: dict[str, Any] = {
        "seed": seed, "devices": instance.num_devices, "nodes": instance.spec.cluster.nodes,
        "tp": instance.plan.tensor_parallel, "hetero": bool(instance.spec.cluster.overrides),
        "memory": regime_of(data), "layers": instance.workload.num_layers,
        "micro_batches": instance.global_micro_batches, "failed": sorted(failed),
        "brute": _finite(brute.best), "brute_complete": brute.complete, "brute_s": round(brute.wall_s, 3),
        "brute_plans": brute.plans, "brute_shapes": brute.shapes, "brute_nodes": brute.nodes,
        "brute_plan": brute.plan.to_json() if brute.plan is not None else None}
    start = time.perf_counter()
    try:
        result = search_plan(instance, failed, Deadline.after(time_limit_s))
    except Exception as error:  # noqa: BLE001 (a crash is a finding, recorded per instance)
        row.update(status="CRASH", objective=None, bound=None, search_s=round(time.perf_counter() - start, 3),
                   error=f"{type(error).__name__}: {error}")
        row["ratio"] = None
        return row
    row.update(status=result.status.value, objective=_finite(result.objective), bound=_finite(result.bound),
               search_s=round(time.perf_counter() - start, 3), reason=result.reason)
    row["ratio"] = (result.objective / brute.best
                    if result.objective is not None and math.isfinite(brute.best) and brute.best > 0 else None)
    if result.solution is not None:
        row["search_plan_ok"] = check_plan(instance, result.solution, failed).ok
        row["search_plan"] = result.solution.to_json()
    return row


def _finite(value: float | None) -> float | None:
    """A plain float for the JSON (a bound may be a numpy scalar), None when absent or infinite."""
    return None if value is None or not math.isfinite(value) else float(value)


def judge(row: dict[str, Any]) -> dict[str, bool]:
    """What one row says about the search (and the brute force)."""
    best, objective, bound, status = row["brute"], row["objective"], row["bound"], row["status"]
    optimal = status == "OPTIMAL"
    found = objective is not None
    verdict = {
        "match": (best is None and status == "INFEASIBLE") or (
            best is not None and found and objective <= best * (1 + MATCH_TOLERANCE)),
        "worse": best is not None and (not found or objective > best * (1 + MATCH_TOLERANCE)),
        "optimal_but_worse": optimal and best is not None and objective > best * (1 + MATCH_TOLERANCE),
        "bound_above_optimum": bound is not None and best is not None and bound > best * (1 + 1e-9),
        "infeasible_but_feasible": status == "INFEASIBLE" and best is not None,
        "beats_brute": found and best is not None and objective < best * (1 - 1e-9) and row["brute_complete"],
        "plan_found_brute_none": found and best is None and row["brute_complete"],
        "crash": status == "CRASH",
    }
    return verdict


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    verdicts = [judge(r) for r in rows]
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    count = {name: sum(bool(v[name]) for v in verdicts) for name in verdicts[0]} if verdicts else {}
    worse = [{"seed": r["seed"], "devices": r["devices"], "tp": r["tp"], "hetero": r["hetero"],
              "memory": r["memory"], "layers": r["layers"], "micro_batches": r["micro_batches"],
              "ratio": r["ratio"], "status": r["status"], "brute": r["brute"], "objective": r["objective"],
              "bound": r["bound"]}
             for r, v in zip(rows, verdicts) if v["worse"] or v["crash"]]
    return {"instances": len(rows), **count, "brute_incomplete": sum(not r["brute_complete"] for r in rows),
            "worst_ratio": max(ratios, default=None), "worse_instances": worse}


def _line(row: dict[str, Any]) -> str:
    def num(value: float | None, digits: int = 4) -> str:
        return "-" if value is None else f"{value:.{digits}f}"
    return (f"{row['seed']:>4} {row['devices']:>3} {row['tp']:>2} {'het' if row['hetero'] else 'hom':>3} "
            f"{row['memory']:>7} {row['layers']:>2} {row['micro_batches']:>2} {num(row['brute']):>10}"
            f"{'' if row['brute_complete'] else '?'} {num(row['objective']):>10} {row['status']:>11} "
            f"{num(row['bound']):>10} {num(row['ratio']):>7} {row['search_s']:>6.2f} {row['brute_s']:>7.2f}")


HEADER = (f"{'seed':>4} {'dev':>3} {'tp':>2} {'het':>3} {'memory':>7} {'L':>2} {'m':>2} {'brute':>10} "
          f"{'search':>10} {'status':>11} {'bound':>10} {'ratio':>7} {'srch_s':>6} {'brute_s':>7}")


def _range(text: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    """'8-12' as (8, 12); a bad range is the parser's one-line error."""
    try:
        low, high = (int(x) for x in text.split("-"))
    except ValueError:
        parser.error(f"--layers {text!r}: give LOW-HIGH, e.g. 8-12")
    if not 1 <= low <= high:
        parser.error(f"--layers {text!r}: need 1 <= LOW <= HIGH")
    return low, high


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=60, help="instances: seeds 0..N-1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--devices", default="8-24", help="device range, e.g. 8-24")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S,
                        help="the search's deadline per instance (default: the CLI's --time-limit default)")
    parser.add_argument("--brute-limit", type=float, default=600.0, help="the brute force's deadline per instance")
    parser.add_argument("--layers", default=f"{LAYERS[0]}-{LAYERS[1]}",
                        help="layer range of the instances, e.g. 8-12 (deeper: the brute force takes minutes)")
    parser.add_argument("--virtual-stages", type=int, default=1,
                        help="interleaved 1F1B chunks per device (training.virtual_stages) for every instance")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.virtual_stages < 1:
        parser.error("--virtual-stages must be >= 1")
    low, high = (int(x) for x in args.devices.replace(",", "-").split("-"))
    layers = _range(args.layers, parser)
    rows = []
    print(HEADER, flush=True)
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        row = compare(seed, (low, high), args.time_limit, args.brute_limit, args.virtual_stages, layers)
        rows.append(row)
        print(_line(row) + (f"  {row['error']}" if row["status"] == "CRASH" else ""), flush=True)
    summary = summarise(rows)
    print(f"\n{summary['instances']} instances ({low}-{high} devices, layers {layers[0]}-{layers[1]}, micro-batches "
          f"{MICRO[0]}-{MICRO[1]}, virtual stages {args.virtual_stages}, search --time-limit {args.time_limit:g} s): "
          f"search matches the brute force on "
          f"{summary['match']}, worse on {summary['worse']}; OPTIMAL while worse: {summary['optimal_but_worse']}; "
          f"bound above the optimum: {summary['bound_above_optimum']}; INFEASIBLE while a plan fits: "
          f"{summary['infeasible_but_feasible']}; crashes: {summary['crash']}; search better than the brute force: "
          f"{summary['beats_brute']}; brute force cut by its limit: {summary['brute_incomplete']}; worst ratio "
          f"{summary['worst_ratio']}")
    for w in summary["worse_instances"]:
        print(f"  worse: seed {w['seed']} ({w['devices']} devices, TP {w['tp']}, {'het' if w['hetero'] else 'hom'}, "
              f"{w['memory']}, L={w['layers']}, m={w['micro_batches']}): ratio {w['ratio']}, {w['status']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": {"seeds": args.seeds, "first_seed": args.first_seed,
                                                 "devices": [low, high], "layers": list(layers),
                                                 "micro_batches": list(MICRO), "time_limit_s": args.time_limit,
                                                 "brute_limit_s": args.brute_limit,
                                                 "virtual_stages": args.virtual_stages},
                                    "summary": summary, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
