"""Issue 21: an independent cross-check of the exact search's master, by a MILP written out as an MPS
file and solved from that file by HiGHS (highspy) and by CBC (pulp's bundled binary).

The exact search (chameleon_opt/solve/exact.py) prices pipeline shapes once and lets a branch and
bound choose a multiset of them. Here the same choice is a MILP of our own (nothing of
chameleon_opt.solve is used to build or solve it; the search is only called to be compared):

Columns. The survivors of each node can be cut into TP groups in several ways (its leftovers idle);
each way gives a count of groups per effective device type (PerfModel.stage_device), and only the
maximal counts matter (an extra group may always idle). A class is a (node, effective type): its
groups are interchangeable for the model. A column is an ordered sequence of classes (a class at
most as often as some cut of its node holds, the node's other classes counted too), a contiguous
layer split and a micro-batch count m; it is priced on concrete representative groups with the
model's public functions: stage_costs + pipeline_time (the exact 1F1B time of those groups, sends
on the links their nodes imply), optimizer_time (the slowest stage's step), stage_memory (every
stage fits with m micro-batches, alone and with data-parallel replicas).

Master. x_c (integer): how many pipelines of column c; per node one cut (binary per maximal count
vector) and per class sum of its uses <= the chosen cut's count; sum m_c x_c = N; P = sum x_c,
chosen among 1..min(N, groups) by binaries y_P. Step = T + U + D, T >= time_c and U >= optimizer_c
for every used column (u_c = [x_c >= 1]), D the data-parallel term exactly as
PerfModel.data_parallel_time prices it (no overlap): the layers held by the same slots form one
ring (the intervals between the union of all pipelines' stage boundaries: z_k = 1 when some used
pipeline cuts at layer k), each ring all-reduces its bytes over the P slots holding them, on the
inter-node link when their first devices sit on two nodes or more (w_l = 1 when every used
pipeline holds layer l on one node: h_{l,n} marks the nodes holding l), and a slot pays the sum of
its rings; D >= that sum for every stage range [a, b) some used pipeline has (v_ab), for the chosen
P. Ring time: 2(P-1) latency + 2(P-1)/P bytes / bandwidth (perf/comm.py), per ring, so the latency
of a group starting at a cut k is z_k (inter) - z_k w_k (inter - intra), linearised by r_k.
Times are in milliseconds in the model (latencies of microseconds stay well above the tolerances).

Scope (where the MILP is exact, checked per instance, else the instance is skipped and said so):
one supported relief (no per-stage relief choice), ZeRO 0 (memory does not depend on the replica
count beyond one vs several), no overlapped gradient reduction, no interleaving, every layer with
gradient bytes. bench/brute_force.py's generator (`random_instance`) draws only such instances.

Checks per instance: (a) HiGHS and CBC both prove optimality (or both infeasibility) of the same
exported file, with the same objective; (b) where search_plan says OPTIMAL, its objective equals
the MILP optimum, and its bound is never above the MILP optimum (nor its objective below it: the
search's plans are in the MILP's space); (c) each solver's solution, decoded into a Plan, evaluates
(PerfModel.evaluate) to the objective the MILP gave it, fits in memory and passes the checker.
Optionally (--brute) the brute force of bench/brute_force.py is a third opinion.

    .venv/bin/python bench/master_crosscheck.py --seeds 40
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import highspy
import pulp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's package, not whichever one pip installed

from chameleon_opt.check import check_plan
from chameleon_opt.instance.load import Instance, build_instance
from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from brute_force import random_instance, regime_of  # noqa: E402 (the bench folder is not a package)

OUT = ROOT / "bench" / "out" / "master_crosscheck.json"
DEVICES = (8, 16)
LAYERS = (2, 4)
MICRO = (1, 6)
MS = 1e3
"""Model units: milliseconds."""
MAX_COLUMNS = 6_000
"""Instances with more columns are skipped (reported as such): at 28,672 columns (16 one-device nodes,
4 layers) neither solver proves the MILP in 300 s."""
AGREE = 1e-9
"""Relative tolerance between exact values: evaluated plans, objectives recomputed from integer solutions."""
SOLVER_AGREE = 1e-6
"""Relative tolerance on the objectives the solvers report (their own floating point)."""


# -- the column space -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    seq: tuple[int, ...]       # class per stage
    bounds: tuple[int, ...]    # (0, b1, ..., L)
    m: int
    time_s: float              # PerfModel.pipeline_time of the column's groups
    optimizer_s: float         # slowest stage's optimizer_time
    alone: bool                # fits when it is the plan's only pipeline
    shared: bool               # fits next to other pipelines (replicas > 1)


class Space:
    """Classes, node cuts and priced columns of one instance over its survivors."""

    def __init__(self, instance: Instance, failed: frozenset[int], model: PerfModel,
                 max_columns: int = MAX_COLUMNS) -> None:
        self.instance, self.model, self.failed = instance, model, failed
        self.tp = instance.plan.tensor_parallel
        self.layers = instance.workload.num_layers
        self.total = instance.global_micro_batches
        self.nodes: list[int] = []
        self.options: dict[int, list[dict[str, int]]] = {}                  # maximal count vectors
        self.realise: dict[int, list[dict[str, list[tuple[int, ...]]]]] = {}  # a cut for each
        for node in range(instance.spec.cluster.nodes):
            live = [d for d in range(node * instance.devices_per_node, (node + 1) * instance.devices_per_node)
                    if d not in failed]
            cuts = self._cuts(live)
            if cuts:
                self.nodes.append(node)
                self.options[node] = [counts for counts, _ in cuts]
                self.realise[node] = [groups for _, groups in cuts]
        self.classes: list[tuple[int, str]] = sorted({(n, t) for n in self.nodes for o in self.options[n] for t in o})
        self.class_max = [max(o.get(t, 0) for o in self.options[n]) for n, t in self.classes]
        self.node_max = {n: max(sum(o.values()) for o in self.options[n]) for n in self.nodes}
        self.groups = sum(self.node_max.values())
        self.longest = min(self.layers, self.groups)
        self.most_pipelines = min(self.total, self.groups)
        self.columns: list[Column] = []
        self.too_many = False
        self.sequences = 0
        self._times: dict[tuple, list[float]] = {}
        self._fits: dict[tuple, tuple[bool, bool]] = {}
        self._enumerate(max_columns)

    def _cuts(self, live: list[int]) -> list[tuple[dict[str, int], dict[str, list[tuple[int, ...]]]]]:
        """Every way to cut a node's survivors into as many TP groups as fit, reduced to the maximal
        effective-type counts, each with one realisation (groups per type)."""
        tp, found = self.tp, {}
        count = len(live) // tp
        if count == 0:
            return []
        idle = len(live) - count * tp

        def walk(left: list[int], groups: list[tuple[int, ...]], skipped: int) -> None:
            if len(groups) == count:
                by_type: dict[str, list[tuple[int, ...]]] = {}
                for g in groups:
                    by_type.setdefault(self.model.stage_device(g).name, []).append(g)
                key = tuple(sorted((t, len(gs)) for t, gs in by_type.items()))
                found.setdefault(key, by_type)
                return
            head, rest = left[0], left[1:]
            for others in itertools.combinations(rest, tp - 1):
                walk([d for d in rest if d not in others], groups + [(head,) + others], skipped)
            if skipped < idle:
                walk(rest, groups, skipped + 1)

        walk(sorted(live), [], 0)
        vectors = [(dict(k), v) for k, v in found.items()]
        maximal = [(c, g) for c, g in vectors
                   if not any(o != c and all(o.get(t, 0) >= n for t, n in c.items()) for o, _ in vectors)]
        return sorted(maximal, key=lambda item: sorted(item[0].items()))

    def hostable(self, demand: dict[int, dict[str, int]]) -> bool:
        return all(any(all(o.get(t, 0) >= n for t, n in need.items()) for o in self.options[node])
                   for node, need in demand.items())

    def groups_for(self, seq: tuple[int, ...]) -> list[tuple[int, ...]] | None:
        """Distinct concrete groups realising a class sequence (one cut per node that holds it)."""
        demand: dict[int, dict[str, int]] = {}
        for c in seq:
            node, t = self.classes[c]
            demand.setdefault(node, {}).setdefault(t, 0)
            demand[node][t] += 1
        picked: dict[int, dict[str, list[tuple[int, ...]]]] = {}
        for node, need in demand.items():
            for o, groups in zip(self.options[node], self.realise[node]):
                if all(o.get(t, 0) >= n for t, n in need.items()):
                    picked[node] = {t: list(gs) for t, gs in groups.items()}
                    break
            else:
                return None
        out = []
        for c in seq:
            node, t = self.classes[c]
            out.append(picked[node][t].pop(0))
        return out

    def _enumerate(self, max_columns: int) -> None:
        splits = {k: [(0,) + cut + (self.layers,) for cut in itertools.combinations(range(1, self.layers), k - 1)]
                  for k in range(1, self.longest + 1)}
        demand: dict[int, dict[str, int]] = {}

        def walk(seq: list[int]) -> bool:
            if seq:
                self.sequences += 1
                if not self._price(tuple(seq), splits[len(seq)], max_columns):
                    return False
            if len(seq) == self.longest:
                return True
            for c, (node, t) in enumerate(self.classes):
                need = demand.setdefault(node, {})
                need[t] = need.get(t, 0) + 1
                if self.hostable({node: need}):
                    if not walk(seq + [c]):
                        return False
                need[t] -= 1
            return True

        self.too_many = not walk([])

    def _price(self, seq: tuple[int, ...], splits: list[tuple[int, ...]], max_columns: int) -> bool:
        model, k = self.model, len(seq)
        groups = self.groups_for(seq)
        assert groups is not None
        types = tuple(self.classes[c][1] for c in seq)
        same = tuple(self.classes[a][0] == self.classes[b][0] for a, b in zip(seq, seq[1:]))
        for bounds in splits:
            stages = tuple(Stage(g, bounds[s], bounds[s + 1]) for s, g in enumerate(groups))
            key = (types, same, bounds)
            if key not in self._times:
                plan = Plan(self.tp, (Pipeline(stages, 1),))
                costs = model.stage_costs(plan, 0, [0.0] * k)
                self._times[key] = [model.pipeline_time(costs, m, model.options.virtual_stages or 1)
                                    for m in range(1, self.total + 1)]
            optimizer = max(model.optimizer_time(st.devices, st.first, st.end, st.relief) for st in stages)
            for m in range(1, self.total + 1):
                alone, shared = True, True
                for s, st in enumerate(stages):
                    a, b = self._fit(st, s, k, m)
                    alone, shared = alone and a, shared and b
                if alone or shared:
                    self.columns.append(Column(seq, bounds, m, self._times[key][m - 1], optimizer, alone, shared))
            if len(self.columns) > max_columns:
                return False
        return True

    def _fit(self, stage: Stage, s: int, k: int, m: int) -> tuple[bool, bool]:
        key = (self.model.stage_device(stage.devices).name, stage.first, stage.end, s, k, m)
        if key not in self._fits:
            capacity = self.model.stage_device(stage.devices).memory_gib * GIB
            self._fits[key] = tuple(self.model.stage_memory(stage.devices, stage.first, stage.end, s, k, m, 0.0,
                                                            replicas, stage.relief)[0] <= capacity
                                    for replicas in (1, 2))
        return self._fits[key]

    # -- a solution as a plan ---------------------------------------------------------------------
    def plan(self, counts: dict[int, int], cut: dict[int, int]) -> Plan:
        """The plan of x (column -> pipelines) on the chosen cut of each node."""
        pools = {n: {t: list(gs) for t, gs in self.realise[n][cut.get(n, 0)].items()} for n in self.nodes}
        pipelines = []
        for c, x in sorted(counts.items()):
            column = self.columns[c]
            for _ in range(x):
                stages = []
                for s, cls in enumerate(column.seq):
                    node, t = self.classes[cls]
                    stages.append(Stage(pools[node][t].pop(0), column.bounds[s], column.bounds[s + 1]))
                pipelines.append(Pipeline(tuple(stages), column.m))
        return Plan(self.tp, tuple(pipelines))

    def step(self, counts: dict[int, int]) -> float:
        """The step the MILP's own formulas give an integer solution, in seconds (recomputed in
        Python from the column prices and the ring rule, no solver tolerance)."""
        used = [self.columns[c] for c, x in counts.items() if x]
        pipelines = sum(counts.values())
        t = max(c.time_s for c in used)
        u = max(c.optimizer_s for c in used)
        return t + u + self.dp_time(used, pipelines)

    def dp_time(self, used: list[Column], pipelines: int) -> float:
        if pipelines < 2:
            return 0.0
        model = self.model
        grad = model.workload.params * model.grad_bytes / self.tp
        cuts = sorted({b for c in used for b in c.bounds})
        worst = 0.0
        for c in used:
            for s, cls in enumerate(c.seq):
                a, b = c.bounds[s], c.bounds[s + 1]
                total = 0.0
                edges = [a] + [k for k in cuts if a < k < b] + [b]
                for lo, hi in zip(edges, edges[1:]):  # one ring per interval; its slots' nodes
                    nodes = {self.classes[o.seq[max(i for i in range(len(o.seq)) if o.bounds[i] <= lo)]][0]
                             for o in used}
                    link = model.intra if len(nodes) == 1 else model.inter
                    steps = 2 * (pipelines - 1)
                    total += steps * link.latency + steps * float(grad[lo:hi].sum()) / pipelines / link.bandwidth
                worst = max(worst, total)
        return worst


def scope_problem(instance: Instance, model: PerfModel) -> str | None:
    """Why the MILP would not be exact for this instance (None: it is)."""
    if len(model.relief_options) != 1:
        return "several reliefs (per-stage relief choice not modelled)"
    if model.zero_stage != 0:
        return "ZeRO sharding (memory depends on the replica count)"
    if model.options.overlap_grad_reduce:
        return "overlapped gradient reduction"
    if (model.options.virtual_stages or 1) > 1:
        return "interleaved 1F1B"
    if (instance.workload.params <= 0).any():
        return "a layer without gradient bytes (its ring costs no latency)"
    return None


# -- the MILP ---------------------------------------------------------------------------------------

@dataclass
class Master:
    problem: pulp.LpProblem
    x: dict[int, str]                 # column -> variable name
    cut: dict[tuple[int, int], str]   # (node, option) -> variable name
    rows: int
    variables: int


def build_master(space: Space) -> Master:
    model = space.model
    total, layers, columns = space.total, space.layers, space.columns
    prob = pulp.LpProblem("master", pulp.LpMinimize)
    T = prob.add_variable("T", 0)
    U = prob.add_variable("U", 0)
    D = prob.add_variable("D", 0)
    prob += T + U + D
    x, u = {}, {}
    for c, col in enumerate(columns):
        uses = {cls: col.seq.count(cls) for cls in set(col.seq)}
        cap = min(total // col.m, min(space.class_max[cls] // n for cls, n in uses.items()))
        x[c] = prob.add_variable(f"x{c}", 0, cap, pulp.LpInteger)
        u[c] = prob.add_variable(f"u{c}", 0, 1, pulp.LpBinary)
        prob += x[c] - cap * u[c] <= 0, f"use_hi{c}"
        prob += u[c] - x[c] <= 0, f"use_lo{c}"
        prob += T - MS * col.time_s * u[c] >= 0, f"time{c}"
        prob += U - MS * col.optimizer_s * u[c] >= 0, f"opt{c}"
    most = space.most_pipelines
    y = {p: prob.add_variable(f"y{p}", 0, 1, pulp.LpBinary) for p in range(1, most + 1)}
    prob += pulp.lpSum(y.values()) == 1, "one_P"
    prob += pulp.lpSum(x.values()) - pulp.lpSum(p * y[p] for p in y) == 0, "count_P"
    prob += pulp.lpSum(col.m * x[c] for c, col in enumerate(columns)) == total, "micro_batches"
    for c, col in enumerate(columns):  # memory: some columns fit only alone, or only with replicas
        if not col.shared:
            prob += u[c] + pulp.lpSum(y[p] for p in y if p >= 2) <= 1, f"alone{c}"
        if not col.alone:
            prob += u[c] + y[1] <= 1, f"shared{c}"
    # T by levels (exact, and a stronger LP relaxation): the distinct column times t_1 < t_2 < ...;
    # L_j = 1 when some used column takes at least t_j, T >= sum_j (t_j - t_{j-1}) L_j; M_j counts the
    # micro-batches of the columns at level j or above (one sparse chain), M_j <= N L_j.
    times = sorted({col.time_s for col in columns})
    level = {t: j for j, t in enumerate(times)}
    L = [prob.add_variable(f"L{j}", 0, 1, pulp.LpBinary) for j in range(len(times))]
    M = [prob.add_variable(f"M{j}", 0) for j in range(len(times))]
    at: list[list[int]] = [[] for _ in times]
    for c, col in enumerate(columns):
        at[level[col.time_s]].append(c)
    for j in range(len(times)):
        above = M[j + 1] if j + 1 < len(times) else 0
        prob += M[j] - above - pulp.lpSum(columns[c].m * x[c] for c in at[j]) == 0, f"chain{j}"
        prob += M[j] - total * L[j] <= 0, f"level{j}"
        if j + 1 < len(times):
            prob += L[j] - L[j + 1] >= 0, f"nested{j}"
    prob += T - pulp.lpSum(MS * (t - (times[j - 1] if j else 0.0)) * L[j] for j, t in enumerate(times)) >= 0, \
        "levels"
    # groups: one cut per node, each class used at most as often as the cut holds it
    cut = {}
    for n in space.nodes:
        if len(space.options[n]) > 1:
            for o in range(len(space.options[n])):
                cut[n, o] = prob.add_variable(f"cut{n}_{o}", 0, 1, pulp.LpBinary)
            prob += pulp.lpSum(cut[n, o] for o in range(len(space.options[n]))) == 1, f"one_cut{n}"
    for k, (n, t) in enumerate(space.classes):
        used = pulp.lpSum(col.seq.count(k) * x[c] for c, col in enumerate(columns) if k in col.seq)
        if len(space.options[n]) > 1:
            prob += used - pulp.lpSum(o.get(t, 0) * cut[n, i] for i, o in enumerate(space.options[n])) <= 0, \
                f"cap{k}"
        else:
            prob += used <= space.options[n][0].get(t, 0), f"cap{k}"
    # symmetry: nodes with the same cuts are interchangeable (the model sees a node only through
    # which groups share it), so some optimum uses them in non-increasing number of groups
    family: dict[str, list[int]] = {}
    for n in space.nodes:
        family.setdefault(json.dumps(space.options[n], sort_keys=True), []).append(n)
    load = {n: pulp.lpSum(sum(space.classes[k][0] == n for k in col.seq) * x[c]
                          for c, col in enumerate(columns) if any(space.classes[k][0] == n for k in col.seq))
            for n in space.nodes}
    for members in family.values():
        for a, b in zip(members, members[1:]):
            prob += load[a] - load[b] >= 0, f"sym{a}_{b}"
    # the data-parallel term (module docstring)
    ranges = sorted({(col.bounds[s], col.bounds[s + 1]) for col in columns for s in range(len(col.seq))})
    where = sorted({(col.bounds[s], col.bounds[s + 1], space.classes[cls][0])
                    for col in columns for s, cls in enumerate(col.seq)})
    v = {r: prob.add_variable(f"v{r[0]}_{r[1]}", 0, 1, pulp.LpBinary) for r in ranges}
    vn = {r: prob.add_variable(f"vn{r[0]}_{r[1]}_{r[2]}", 0, 1, pulp.LpBinary) for r in where}
    members: dict[tuple[int, int, int], list[int]] = {r: [] for r in where}
    for c, col in enumerate(columns):
        for s, cls in enumerate(col.seq):
            r = (col.bounds[s], col.bounds[s + 1], space.classes[cls][0])
            members[r].append(c)
            prob += vn[r] - u[c] >= 0, f"vn_lo{c}_{s}"
    for r, cs in members.items():
        prob += vn[r] - pulp.lpSum(u[c] for c in cs) <= 0, f"vn_hi{r[0]}_{r[1]}_{r[2]}"
        prob += v[r[:2]] - vn[r] >= 0, f"v_lo{r[0]}_{r[1]}_{r[2]}"
    for r in ranges:
        prob += v[r] - pulp.lpSum(vn[q] for q in where if q[:2] == r) <= 0, f"v_hi{r[0]}_{r[1]}"
    h = {}
    for layer in range(layers):
        for n in space.nodes:
            holders = [q for q in where if q[2] == n and q[0] <= layer < q[1]]
            if holders:
                h[layer, n] = prob.add_variable(f"h{layer}_{n}", 0, 1, pulp.LpBinary)
                for q in holders:
                    prob += h[layer, n] - vn[q] >= 0, f"h_lo{layer}_{q[0]}_{q[1]}_{n}"
                prob += h[layer, n] - pulp.lpSum(vn[q] for q in holders) <= 0, f"h_hi{layer}_{n}"
    w = {layer: prob.add_variable(f"w{layer}", 0, 1, pulp.LpBinary) for layer in range(layers)}
    for layer in range(layers):
        held = pulp.lpSum(var for (l2, _), var in h.items() if l2 == layer)
        nodes = sum(1 for (l2, _) in h if l2 == layer)
        prob += w[layer] + held >= 2, f"w_lo{layer}"          # on one node: intra-node ring
        if nodes > 1:
            prob += (nodes - 1) * w[layer] + held <= nodes, f"w_hi{layer}"  # on two or more: not
    z, r_ = {}, {}
    for k in range(1, layers):
        starting = [q for q in ranges if q[0] == k]
        z[k] = prob.add_variable(f"z{k}", 0, 1, pulp.LpBinary)
        r_[k] = prob.add_variable(f"r{k}", 0, 1, pulp.LpBinary)
        for q in starting:
            prob += z[k] - v[q] >= 0, f"z_lo{k}_{q[1]}"
        prob += z[k] - pulp.lpSum(v[q] for q in starting) <= 0, f"z_hi{k}"
        prob += r_[k] - z[k] <= 0, f"r_z{k}"
        prob += r_[k] - w[k] <= 0, f"r_w{k}"
        prob += r_[k] - z[k] - w[k] >= -1, f"r_lo{k}"
    grad = [float(g) for g in model.workload.params * model.grad_bytes / space.tp]
    inter, intra = model.inter, model.intra
    for (a, b) in ranges:
        for p in y:
            if p < 2:
                continue
            alpha, beta = 2 * (p - 1) / p, 2 * (p - 1)
            expr = pulp.LpAffineExpression()
            top = 0.0
            for layer in range(a, b):
                expr += MS * alpha * grad[layer] / inter.bandwidth
                expr += -MS * alpha * grad[layer] * (1 / inter.bandwidth - 1 / intra.bandwidth) * w[layer]
                top += MS * alpha * grad[layer] * max(1 / inter.bandwidth, 1 / intra.bandwidth)
            expr += MS * beta * inter.latency - MS * beta * (inter.latency - intra.latency) * w[a]
            top += MS * beta * max(inter.latency, intra.latency)
            for k in range(a + 1, b):
                expr += MS * beta * inter.latency * z[k] - MS * beta * (inter.latency - intra.latency) * r_[k]
                top += MS * beta * max(inter.latency, intra.latency)
            # D >= slot time when the range is used and P = p (top: the most it can be)
            prob += D - expr - top * v[(a, b)] - top * y[p] >= -2 * top, f"dp{a}_{b}_{p}"
    return Master(prob, {c: var.name for c, var in x.items()}, {k: var.name for k, var in cut.items()},
                  prob.numConstraints(), prob.numVariables())


# -- the solvers, each from the exported file ---------------------------------------------------------

@dataclass
class Solved:
    solver: str
    status: str                 # the solver's own words
    optimal: bool
    infeasible: bool
    objective: float | None     # ms, as the solver reports it
    bound: float | None
    values: dict[str, float]
    wall_s: float


def solve_highs(path: Path, limit_s: float) -> Solved:
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("time_limit", float(limit_s))
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.0)
    h.setOptionValue("mip_feasibility_tolerance", 1e-9)
    start = time.perf_counter()
    h.readModel(str(path))
    h.run()
    wall = time.perf_counter() - start
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    optimal = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    infeasible = h.getModelStatus() == highspy.HighsModelStatus.kInfeasible
    values = {}
    if optimal:
        names = h.getLp().col_names_
        values = dict(zip(names, h.getSolution().col_value))
    return Solved("highs", status, optimal, infeasible, info.objective_function_value if optimal else None,
                  info.mip_dual_bound if optimal else None, values, wall)


def solve_cbc(path: Path, limit_s: float, workdir: Path) -> Solved:
    with warnings.catch_warnings():  # PuLP's bundled CBC is deprecated for PuLP 4.0; it is what we have
        warnings.simplefilter("ignore", DeprecationWarning)
        binary = pulp.PULP_CBC_CMD().path
    solution = workdir / "cbc.sol"
    solution.unlink(missing_ok=True)
    start = time.perf_counter()
    run = subprocess.run([binary, str(path), "-sec", str(limit_s), "-ratioGap", "0", "-allowableGap", "0",
                          "-integerTolerance", "1e-9", "-threads", "1", "-solve", "-solu", str(solution)],
                         capture_output=True, text=True)
    wall = time.perf_counter() - start
    log = run.stdout
    # CBC's own status: the solution file's first line ("Optimal - objective value X", "Infeasible - ...",
    # "Stopped on time - ..."), and its log's "Result - ..." line (absent when presolve proves infeasibility)
    lines = solution.read_text().splitlines() if solution.exists() else []
    head = lines[0].split(" - objective value")[0].strip() if lines else ""
    result = re.search(r"Result - (.*)", log)
    said = result.group(1).strip() if result else next(
        (text.strip() for text in log.splitlines() if "infeasible" in text.lower()), f"exit {run.returncode}")
    status = f"{head or 'no solution file'} ({said})"
    optimal = head == "Optimal" and (result is None or said.startswith("Optimal solution found"))
    infeasible = head.startswith("Infeasible") or "infeasible" in said.lower()
    objective = bound = None
    values: dict[str, float] = {}
    if optimal:
        first = re.search(r"objective value\s+(\S+)", lines[0])
        objective = float(first.group(1)) if first else None
        for line in lines[1:]:
            parts = line.replace("**", " ").split()
            if len(parts) >= 3:
                values[parts[1]] = float(parts[2])
        lower = re.search(r"Lower bound:\s+(\S+)", log)
        bound = float(lower.group(1)) if lower else objective  # CBC prints a bound line only when stopped
    return Solved("cbc", status, optimal, infeasible, objective, bound, values, wall)


# -- one instance -----------------------------------------------------------------------------------

def decode(space: Space, master: Master, solved: Solved) -> tuple[dict[int, int], dict[int, int]]:
    counts = {c: round(solved.values.get(name, 0.0)) for c, name in master.x.items()}
    counts = {c: n for c, n in counts.items() if n}
    cut = {}
    for (n, o), name in master.cut.items():
        if round(solved.values.get(name, 0.0)) == 1:
            cut[n] = o
    # the capacity rows let a node's cut be any that holds what is used: take one that does
    for n in space.nodes:
        need: dict[str, int] = {}
        for c, x in counts.items():
            for cls in space.columns[c].seq:
                if space.classes[cls][0] == n:
                    need[space.classes[cls][1]] = need.get(space.classes[cls][1], 0) + x
        if not all(space.options[n][cut.get(n, 0)].get(t, 0) >= k for t, k in need.items()):
            cut[n] = next(i for i, o in enumerate(space.options[n]) if all(o.get(t, 0) >= k for t, k in need.items()))
    return counts, cut


def check_instance(seed: int, devices: tuple[int, int] = DEVICES, layers: tuple[int, int] = LAYERS,
                   micro: tuple[int, int] = MICRO, time_limit_s: float = 10.0, solver_limit_s: float = 300.0,
                   max_columns: int = MAX_COLUMNS, brute: bool = False, keep: Path | None = None) -> dict[str, Any]:
    """Everything the cross-check says about one seeded instance (a row of the JSON)."""
    from chameleon_opt.solve.deadline import Deadline  # the search, only to be compared
    from chameleon_opt.solve.search import search_plan

    data, failed = random_instance(seed, devices, layers, micro)
    instance = build_instance(data)
    model = PerfModel(instance)
    row: dict[str, Any] = {
        "seed": seed, "devices": instance.num_devices, "nodes": instance.spec.cluster.nodes,
        "tp": instance.plan.tensor_parallel, "hetero": bool(instance.spec.cluster.overrides),
        "memory": regime_of(data), "layers": instance.workload.num_layers,
        "micro_batches": instance.global_micro_batches, "failed": sorted(failed)}
    problem = scope_problem(instance, model)
    if problem is not None:
        row.update(outcome="skipped", why=problem)
        return row
    start = time.perf_counter()
    space = Space(instance, failed, model, max_columns)
    row.update(classes=len(space.classes), groups=space.groups, columns=len(space.columns),
               price_s=round(time.perf_counter() - start, 3))
    if space.too_many:
        row.update(outcome="skipped", why=f"more than {max_columns} columns")
        return row
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) if keep is None else keep
        work.mkdir(parents=True, exist_ok=True)
        path = work / f"master_{seed}.mps"
        start = time.perf_counter()
        master = build_master(space) if space.columns else None
        if master is not None:
            master.problem.writeMPS(str(path))
        row.update(rows=master.rows if master else 0, variables=master.variables if master else 0,
                   build_s=round(time.perf_counter() - start, 3))
        solved = [solve_highs(path, solver_limit_s), solve_cbc(path, solver_limit_s, work)] if master else []
    for s in solved:
        row[s.solver] = {"status": s.status, "objective_ms": s.objective, "bound_ms": s.bound,
                         "wall_s": round(s.wall_s, 3)}
    # (a) the solvers agree (an instance without columns: no pipeline fits, infeasible by construction)
    milp: float | None = None
    plan_json = None
    notes: list[str] = []
    unresolved = [s for s in solved if not (s.optimal or s.infeasible)]  # stopped by the solver's limit
    if not solved:
        agree, infeasible = True, True
    else:
        infeasible = all(s.infeasible for s in solved)
        agree = infeasible or (all(s.optimal for s in solved) and
                               math.isclose(solved[0].objective, solved[1].objective, rel_tol=SOLVER_AGREE))
        if not agree:
            notes.append("solvers disagree: " + "; ".join(f"{s.solver} {s.status} {s.objective}" for s in solved))
    # (c) each solver's solution, decoded, evaluates to what the MILP said
    prices_ok = True
    for s in solved:
        if not s.optimal:
            continue
        counts, cut = decode(space, master, s)
        recomputed = space.step(counts)
        plan = space.plan(counts, cut)
        estimate = model.evaluate(plan, failed)
        report = check_plan(instance, plan, failed, model=model)
        ok = (math.isclose(recomputed * MS, s.objective, rel_tol=SOLVER_AGREE)
              and math.isclose(estimate.iteration_time_s, recomputed, rel_tol=AGREE)
              and estimate.memory_ok and report.ok)
        row[s.solver].update(recomputed_s=recomputed, evaluated_s=estimate.iteration_time_s,
                             memory_ok=estimate.memory_ok, checker_ok=report.ok, pipelines=sum(counts.values()))
        if not ok:
            prices_ok = False
            notes.append(f"{s.solver}'s plan: MILP {s.objective} ms, recomputed {recomputed:.9g} s, evaluated "
                         f"{estimate.iteration_time_s:.9g} s, memory_ok {estimate.memory_ok}, checker {report.ok}")
        value = estimate.iteration_time_s
        if milp is None or value < milp:
            milp, plan_json = value, plan.to_json()
    if solved and len({round(row[s.solver]["evaluated_s"], 9) for s in solved if s.optimal}) > 1:
        values = [row[s.solver]["evaluated_s"] for s in solved if s.optimal]
        if not math.isclose(values[0], values[1], rel_tol=AGREE):
            agree = False
            notes.append(f"solvers' plans evaluate differently: {values}")
    row.update(milp_s=milp, milp_plan=plan_json)
    # (b) the search
    start = time.perf_counter()
    result = search_plan(instance, failed, Deadline.after(time_limit_s), model=PerfModel(instance))
    row.update(search_status=result.status.value, search_s=result.objective, search_bound_s=result.bound,
               search_wall_s=round(time.perf_counter() - start, 3),
               exact_search="branch and bound" in result.reason)
    optimal = result.status.value == "OPTIMAL"
    search_ok = True
    if milp is None and unresolved:
        notes.append("no solver proved the MILP within its limit: the search is not checked")
    elif milp is None:  # no plan in the space
        if result.objective is not None:
            search_ok = False
            notes.append(f"the MILP is infeasible but the search returns {result.objective}")
    else:
        if result.status.value == "INFEASIBLE":
            search_ok = False
            notes.append(f"the search says INFEASIBLE, the MILP finds {milp}")
        if optimal and not math.isclose(result.objective, milp, rel_tol=AGREE):
            search_ok = False
            notes.append(f"OPTIMAL {result.objective!r} != MILP {milp!r} (ratio {result.objective / milp:.9f})")
        if result.objective is not None and result.objective < milp * (1 - AGREE):
            search_ok = False
            notes.append(f"the search's plan {result.objective!r} beats the MILP optimum {milp!r}")
        if result.bound is not None and result.bound > milp * (1 + AGREE):
            search_ok = False
            notes.append(f"the search's bound {result.bound!r} is above the MILP optimum {milp!r}")
    if brute:
        from brute_force import brute_force_result
        found = brute_force_result(instance, failed, 120.0)
        best = found.best if math.isfinite(found.best) else None
        row.update(brute_s=best, brute_complete=found.complete, brute_wall_s=round(found.wall_s, 3))
        if found.complete and not ((best is None and milp is None) or (
                best is not None and milp is not None and math.isclose(best, milp, rel_tol=AGREE))):
            notes.append(f"the brute force finds {best}, the MILP {milp}")
            prices_ok = False
    outcome = "agree" if agree and prices_ok and search_ok else "mismatch"
    if outcome == "mismatch" and unresolved and prices_ok and search_ok:
        outcome = "unresolved"  # only a solver's time limit stands between this row and an agreement
    row.update(solvers_agree=agree, prices_ok=prices_ok, search_ok=search_ok, outcome=outcome, notes=notes)
    return row


# -- the run ----------------------------------------------------------------------------------------

def _num(value: float | None, digits: int = 5) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


HEADER = (f"{'seed':>4} {'dev':>3} {'tp':>2} {'het':>3} {'memory':>7} {'L':>2} {'N':>2} {'cols':>6} {'rows':>6} "
          f"{'milp':>10} {'search':>10} {'status':>10} {'bound':>10} {'highs_s':>7} {'cbc_s':>7} {'srch_s':>6} outcome")


def line(row: dict[str, Any]) -> str:
    if row["outcome"] == "skipped":
        return (f"{row['seed']:>4} {row['devices']:>3} {row['tp']:>2} {'het' if row['hetero'] else 'hom':>3} "
                f"{row['memory']:>7} {row['layers']:>2} {row['micro_batches']:>2} skipped: {row['why']}")
    highs, cbc = row.get("highs", {}), row.get("cbc", {})
    return (f"{row['seed']:>4} {row['devices']:>3} {row['tp']:>2} {'het' if row['hetero'] else 'hom':>3} "
            f"{row['memory']:>7} {row['layers']:>2} {row['micro_batches']:>2} {row['columns']:>6} {row['rows']:>6} "
            f"{_num(row['milp_s']):>10} {_num(row['search_s']):>10} {row['search_status']:>10} "
            f"{_num(row['search_bound_s']):>10} {highs.get('wall_s', 0):>7.2f} {cbc.get('wall_s', 0):>7.2f} "
            f"{row['search_wall_s']:>6.2f} {row['outcome']}")


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    checked = [r for r in rows if r["outcome"] not in ("skipped", "unresolved")]
    unresolved = [r["seed"] for r in rows if r["outcome"] == "unresolved"]
    walls = {s: sorted(r[s]["wall_s"] for r in checked if s in r) for s in ("highs", "cbc")}

    def stats(values: list[float]) -> dict[str, float] | None:
        return {"median": values[len(values) // 2], "max": values[-1], "total": round(sum(values), 3)} \
            if values else None
    return {
        "instances": len(rows), "checked": len(checked), "unresolved": unresolved,
        "skipped": sum(r["outcome"] == "skipped" for r in rows),
        "agreements": sum(r["outcome"] == "agree" for r in checked),
        "mismatches": [{"seed": r["seed"], "notes": r["notes"], "milp_s": r["milp_s"], "search_s": r["search_s"],
                        "search_status": r["search_status"], "search_bound_s": r["search_bound_s"]}
                       for r in checked if r["outcome"] == "mismatch"],
        "solvers_agree": sum(r["solvers_agree"] for r in checked),
        "prices_ok": sum(r["prices_ok"] for r in checked),
        "search_ok": sum(r["search_ok"] for r in checked),
        "search_optimal": sum(r["search_status"] == "OPTIMAL" for r in checked),
        "search_optimal_equal": sum(r["search_status"] == "OPTIMAL" and r["search_ok"] for r in checked),
        "infeasible": sum(r["milp_s"] is None for r in checked),
        "multi_pipeline_optima": sum(r.get("highs", {}).get("pipelines", 0) > 1 for r in checked),
        "columns_max": max((r["columns"] for r in checked), default=0),
        "highs_wall_s": stats(walls["highs"]), "cbc_wall_s": stats(walls["cbc"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=40, help="instances: seeds first..first+N-1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--devices", default=f"{DEVICES[0]}-{DEVICES[1]}")
    parser.add_argument("--layers", default=f"{LAYERS[0]}-{LAYERS[1]}")
    parser.add_argument("--micro", default=f"{MICRO[0]}-{MICRO[1]}")
    parser.add_argument("--time-limit", type=float, default=10.0, help="the search's deadline per instance")
    parser.add_argument("--solver-limit", type=float, default=300.0, help="HiGHS's and CBC's limit per instance")
    parser.add_argument("--max-columns", type=int, default=MAX_COLUMNS)
    parser.add_argument("--brute", action="store_true", help="also run bench/brute_force.py's brute force")
    parser.add_argument("--keep", type=Path, default=None, help="keep the MPS files in this folder")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    def pair(text: str) -> tuple[int, int]:
        low, high = (int(v) for v in text.split("-"))
        return low, high
    devices, layers, micro = pair(args.devices), pair(args.layers), pair(args.micro)
    print(HEADER, flush=True)
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        row = check_instance(seed, devices, layers, micro, args.time_limit, args.solver_limit, args.max_columns,
                             args.brute, args.keep)
        rows.append(row)
        print(line(row), flush=True)
        for note in row.get("notes", []):
            print(f"      {note}", flush=True)
    summary = summarise(rows)
    print(f"\n{summary['instances']} instances ({devices[0]}-{devices[1]} devices, layers {layers[0]}-{layers[1]}, "
          f"micro-batches {micro[0]}-{micro[1]}): {summary['checked']} checked, {summary['skipped']} skipped, "
          f"unresolved by a solver's limit {summary['unresolved']}; "
          f"agreements {summary['agreements']}, mismatches {len(summary['mismatches'])}; HiGHS = CBC on "
          f"{summary['solvers_agree']}, evaluated plans = MILP on {summary['prices_ok']}, search consistent on "
          f"{summary['search_ok']} (OPTIMAL {summary['search_optimal']}, equal to the MILP on "
          f"{summary['search_optimal_equal']}); infeasible {summary['infeasible']}; several pipelines in "
          f"{summary['multi_pipeline_optima']} optima; HiGHS wall {summary['highs_wall_s']}, CBC wall "
          f"{summary['cbc_wall_s']}")
    for m in summary["mismatches"]:
        print(f"  mismatch: seed {m['seed']}: " + "; ".join(m["notes"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": {"seeds": args.seeds, "first_seed": args.first_seed,
                                                 "devices": list(devices), "layers": list(layers),
                                                 "micro_batches": list(micro), "time_limit_s": args.time_limit,
                                                 "solver_limit_s": args.solver_limit,
                                                 "max_columns": args.max_columns, "brute": args.brute},
                                    "summary": summary, "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
