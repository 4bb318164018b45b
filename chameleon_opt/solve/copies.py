"""Copy plans: P copies of one pipeline (a device type per stage, one layer split), each run of
stages joined by a paying send placed inside one node.

Why: on small heterogeneous clusters the best plan is often P identical pipelines that mix device
types (32-64-device seed 4: eight fast-slow-fast pipelines, each fast-slow pair in one node). The
branch and bound grows its first pipeline depth first from the fastest groups, so such a plan comes
late (seed 4: not within 20 s); the template path keeps one device type per pipeline, the mixed
path puts the largest memory in front, and column plans place by layer, not by send. Each copy's
gradient slots then form one ring per stage (identical holders), and its sends stay inside nodes
where the nodes allow.

Construction: every (device types along the pipeline, layer split, copies P) is ranked by an
estimate (the closed-form 1F1B floor of the per-type stage times at the fastest relief with
intra-node sends and ceil(total / P) micro-batches, the slowest stage's optimizer step, the largest
stage's ring over P replicas on the faster link); in that order, while the estimate is below the
best step known, the copies whose stages fit in memory are placed on each way to form the TP
groups (`exact.inventories`, else the survivors' default groups): the runs of stages between
boundaries that send nothing across nodes (or send as fast there as inside a node), longest first,
each on the first node with enough free groups of each of its types, else cut at its cheapest
boundary (`_place`); the placement whose crossings add the least send time is priced by the
performance model with its best reliefs. A heuristic: its plans are incumbents only.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections import Counter
from collections.abc import Callable

import numpy as np

from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.comm import Link, ring_allreduce_time
from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.exact import inventories
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.polish import spread_and_priced

PLACEMENTS = 16
"""Most ways to give whole stage columns nodes tried per copy candidate (`_place_columns`)."""
PAIR_SHAPES = 4
"""Shapes (device types along a pipeline, layer split) of each multiset of device types paired with the
others (`_pairs`), the best by copy estimate (24-32-device seed 3132's slow-fast-slow copy is the
fourth of its 18, the 74th of 162 shapes)."""
PAIR_BUDGET = 20_000_000
"""Most (pair of shapes, copies of each, micro-batches of the first) estimates, vectorised; beyond, the
fewest shapes that fit (by copy estimate)."""
PAIR_TRIES = 8
"""Most pairs of shapes priced per ranking (`_pairs` takes two in turn; pairs that fit no memory or no
placement are skipped); 24 found the same plans on the 24-32-device misses and took copy_plans on
32-64-device seeds 0-39 from 0.25 s (one shape) to 0.60 s, 8 to 0.51 s."""
MIX_CELLS = 4_096
"""Most cells (groups used of each device type) of `_mixes`' knapsack; beyond, no mixed plans."""
CANDIDATE_BUDGET = 200_000
"""Most (device types along a pipeline, layer split, copies) candidates ranked; beyond, no copy plans
(32-64-device instances of two device types: at most 4,000; 13 layers of one type and 8 micro-batches:
about 18,000; of two types: 3.5 x 10^6). 50,000 left deep instances of two types without copy plans (16-24
devices, 10 layers, 18 groups: about 93,000; seed 14's search stopped 10% above the brute force's plan);
ranking 93,000 takes about 0.6 s of CPU, within the copies' share of the deadline (cut while ranking, they
give none; while pricing, what they priced)."""


def _penalties(model: PerfModel, bounds: tuple[int, ...]) -> list[float]:
    """Per boundary s (between stages s - 1 and s; index 0 unused): what its send costs more across
    nodes than inside one (0: no bytes, or no slower)."""
    return [0.0] + [max(model.boundary_send_on(model.inter, bounds[s] - 1)
                        - model.boundary_send_on(model.intra, bounds[s] - 1), 0.0) for s in range(1, len(bounds) - 1)]


def _runs(penalty: list[float]) -> list[tuple[int, int]]:
    """The pipeline's runs of stages [start, end) joined by boundaries that cost more across nodes:
    kept in one node, those sends stay on the intra-node link."""
    runs, start = [], 0
    for s in range(1, len(penalty)):
        if penalty[s] <= 0.0:
            runs.append((start, s))
            start = s
    return runs + [(start, len(penalty))]


def _place(types: tuple[str, ...], penalty: list[float], copies: int,
           free: dict[int, dict[str, list[tuple[int, ...]]]]) -> tuple[list[list[tuple[int, ...]]], float] | None:
    """Groups for `copies` copies of a pipeline of these stage types (see the module docstring),
    with what their node crossings add to the sends; None when the groups lack some type. `free`
    (per node, per type, its groups) is consumed. A run no node holds is cut at its cheapest
    boundary (32-64-device seed 0: nodes of at most three fast groups, four-stage runs cut at the
    boundary that sends 1 MB, not 100 MB), down to single stages on the node with the most free
    groups of their type."""
    placed: list[dict[int, tuple[int, ...]]] = [{} for _ in range(copies)]  # per copy: each stage's group
    where: list[dict[int, int]] = [{} for _ in range(copies)]  # per copy: each stage's node

    def run(j: int, start: int, end: int, tight: bool = False) -> bool:
        need = Counter(types[start:end])
        fits = [n for n, pools in free.items() if all(len(pools.get(t, ())) >= k for t, k in need.items())]
        # a piece of a cut run: the node it fills best, so nodes of many free groups stay whole for the
        # long pieces of the copies to come (32-64 seed 380: 1-stage pieces on nodes of four, 5-stage
        # ones on nodes of five)
        node = min(fits, key=lambda n: (sum(len(free[n].get(t, ())) for t in need), n)) if tight and fits \
            else next(iter(fits), None)
        if node is None and end - start > 1:
            cut = min(range(start + 1, end), key=lambda s: (penalty[s], s))
            pieces = sorted(((start, cut), (cut, end)), key=lambda piece: piece[0] - piece[1])  # longer first
            return all(run(j, first, last, True) for first, last in pieces)
        if node is None:
            holders = [n for n, pools in free.items() if pools.get(types[start])]
            if not holders:
                return False
            node = max(holders, key=lambda n: (len(free[n][types[start]]), -n))
        for s in range(start, end):
            where[j][s] = node
            placed[j][s] = free[node][types[s]].pop(0)
        return True

    # the longest runs first: they need the most of one node
    items = sorted(((j, r) for j in range(copies) for r in _runs(penalty)),
                   key=lambda item: (item[1][0] - item[1][1], item[0]))
    if not all(run(j, start, end) for j, (start, end) in items):
        return None
    cost = sum(penalty[s] for j in range(copies) for s in range(1, len(types)) if where[j][s] != where[j][s - 1])
    return [[copy[s] for s in range(len(types))] for copy in placed], cost


def _place_columns(types: tuple[str, ...], sizes: list[float], penalty: list[float], copies: int,
                   free: dict[int, dict[str, list[tuple[int, ...]]]]) -> list[list[list[tuple[int, ...]]]]:
    """Groups for `copies` copies with each stage's copies (its column) in one node where a node has that
    many free groups of its type, the stages of most gradient bytes first: their rings stay inside a
    node, where `_place` keeps each copy's sends inside one (24-32-device seed 3138: four five-stage
    fast copies on nodes of 5, 7, 3 and 6 fast groups, the columns of layers 1, 2 and 4 inside nodes:
    22.386225, the optimum, against 23.088195 placed by sends). The other columns, those with the
    costliest sends on either side first, take copy by copy a node of the copy's stage before or after
    it where that send costs more across nodes, else the node with the most free groups of their type:
    either stage by stage (every copy of one column, then the next), or each copy's run of such stages
    joined by paying sends at once, on one node with room for it where one has (its sends inside; 24-32-
    device seed 8080: stages 0-1 of four copies beside three whole columns, 26.263957 -> 26.261917, the
    optimum; stage by stage stays better elsewhere, 8063's 17.615100 against 17.748481, so both are priced).
    Of up to PLACEMENTS ways to give the whole columns nodes (the first node of each free
    composition), per way of spilling the one whose sends across nodes cost least (one when both are the
    same; none when the groups lack some type). `free` is not changed."""
    order = sorted(range(len(types)), key=lambda s: (-sizes[s], s))
    node_of = {g: n for n, pools in free.items() for gs in pools.values() for g in gs}
    found: list[tuple[float, bool, list[list[tuple[int, ...]]]]] = []

    def spill(left: dict[int, dict[str, list[tuple[int, ...]]]], placed: list[list[tuple[int, ...] | None]],
              spilled: list[int], whole: bool) -> None:
        sides = [penalty[s] + (penalty[s + 1] if s + 1 < len(types) else 0.0) for s in range(len(types))]
        runs: list[list[int]] = []  # `whole`: spilled stages joined by paying sends, each copy's on one node
        for s in sorted(spilled):
            if whole and runs and runs[-1][-1] == s - 1 and penalty[s] > 0.0:
                runs[-1].append(s)
            else:
                runs.append([s])
        # the costliest sends around it first (ties: the order spilled, the largest columns first)
        for run in sorted(runs, key=lambda run: (-max(sides[s] for s in run), min(map(spilled.index, run)))):
            need = Counter(types[s] for s in run)
            for j in range(copies):
                def near(n: int, first: int = run[0], last: int = run[-1]) -> float:
                    """What the copy's sends next to stages first..last save on node n."""
                    return sum(penalty[b] for b, g in ((first, placed[j][first - 1] if first else None),
                                                       (last + 1, placed[j][last + 1] if last + 1 < len(types) else None))
                               if g is not None and node_of[g] == n)
                roomy = [n for n, pools in left.items() if all(len(pools.get(t, ())) >= k for t, k in need.items())]
                if roomy:  # the whole run on one node: its paying sends stay inside
                    node = max(roomy, key=lambda n: (near(n), min(len(left[n][t]) for t in need), -n))
                    for s in run:
                        placed[j][s] = left[node][types[s]].pop(0)
                    continue
                for s in run:  # no node holds it whole: stage by stage
                    holders = [n for n, pools in left.items() if pools.get(types[s])]
                    if not holders:
                        return
                    node = max(holders, key=lambda n, s=s: (near(n, s, s), len(left[n][types[s]]), -n))
                    placed[j][s] = left[node][types[s]].pop(0)
        cost = sum(penalty[b] for copy in placed for b in range(1, len(types))
                   if node_of[copy[b]] != node_of[copy[b - 1]])
        found.append((cost, whole, [list(copy) for copy in placed]))

    def extend(k: int, left: dict[int, dict[str, list[tuple[int, ...]]]], placed: list[list[tuple[int, ...] | None]],
               spilled: list[int]) -> None:
        if len(found) >= 2 * PLACEMENTS:
            return
        if k == len(order):
            for whole in (False, True):
                spill({n: {t: list(gs) for t, gs in pools.items()} for n, pools in left.items()},
                      [list(copy) for copy in placed], spilled, whole)
            return
        s = order[k]
        fits = {}
        for n in sorted(left, key=lambda n: (len(left[n].get(types[s], ())), n)):
            if len(left[n].get(types[s], ())) >= copies:
                fits.setdefault(tuple(sorted((t, len(gs)) for t, gs in left[n].items())), n)
        if not fits:
            extend(k + 1, left, placed, spilled + [s])
        for n in fits.values():
            taken, left[n][types[s]] = left[n][types[s]][:copies], left[n][types[s]][copies:]
            for j in range(copies):
                placed[j][s] = taken[j]
            extend(k + 1, left, placed, spilled)
            left[n][types[s]] = taken + left[n][types[s]]
            for j in range(copies):
                placed[j][s] = None
    extend(0, {n: {t: list(gs) for t, gs in pools.items()} for n, pools in free.items()},
           [[None] * len(types) for _ in range(copies)], [])
    best: list[list[list[tuple[int, ...]]]] = []
    for whole in (False, True):
        complete = [item for item in found if item[1] == whole and all(g is not None for copy in item[2] for g in copy)]
        if complete and (chosen := min(complete, key=lambda item: item[0])[2]) not in best:
            best.append(chosen)
    return best


def _place_layers(model: PerfModel, tp: int, pipes: list[tuple[tuple[str, ...], tuple[int, ...]]],
                  free: dict[int, dict[str, list[tuple[int, ...]]]]) -> list[list[tuple[int, ...]]] | None:
    """Groups for pipelines of several shapes with each layer's holders (one stage of every pipeline)
    in one node where a node has their types free, the layers of most gradient bytes first, a layer
    whose holders placed so far sit on two nodes, or fit no node, left to the end: there each stage
    takes a node of a stage next to it whose send costs more across nodes, else the node with the most
    free groups of its type. 24-32-device seed 3288: one fast-slow-fast-fast pipeline beside two
    fast-fast copies whose first stages hold layers 0-3; the slow stage holding layer 2 (5 x 10^8
    parameters) beside them in one node rings it inside (36.196779, the optimum, against 36.856839
    placed by sends). Of up to PLACEMENTS ways (the first node of each free composition per layer), the
    one with the fewest gradient bytes and sends across nodes (a layer's ring over P replicas, a send
    per micro-batch of a pipeline's share, both on the inter-node link); None when some type lacks
    groups. `free` is not changed."""
    total, replicas = model.instance.global_micro_batches, len(pipes)
    grad = model.workload.params * model.grad_bytes / tp
    layers = len(grad)
    node_of = {g: n for n, pools in free.items() for gs in pools.values() for g in gs}
    penalties = [_penalties(model, bounds) for _, bounds in pipes]
    holder = [[next(s for s in range(len(types)) if bounds[s] <= layer < bounds[s + 1]) for layer in range(layers)]
              for types, bounds in pipes]
    order = sorted(range(layers), key=lambda layer: (-grad[layer], layer))
    across = [ring_allreduce_time(float(grad[layer]), replicas, model.inter) for layer in range(layers)]
    share = -(-total // replicas)
    found: list[tuple[float, list[list[tuple[int, ...]]]]] = []

    def finish(left: dict[int, dict[str, list[tuple[int, ...]]]], placed: list[list[tuple[int, ...] | None]]) -> None:
        rest = [(j, s) for j, seq in enumerate(placed) for s, g in enumerate(seq) if g is None]
        sides = {(j, s): penalties[j][s] + (penalties[j][s + 1] if s + 1 < len(placed[j]) else 0.0) for j, s in rest}
        for j, s in sorted(rest, key=lambda item: -sides[item]):
            kind = pipes[j][0][s]
            holders = [n for n, pools in left.items() if pools.get(kind)]
            if not holders:
                return

            def near(n: int) -> float:  # what the pipeline's sends next to this stage save on node n
                return sum(penalties[j][b] for b, g in ((s, placed[j][s - 1] if s else None),
                                                        (s + 1, placed[j][s + 1] if s + 1 < len(placed[j]) else None))
                           if g is not None and node_of[g] == n)
            node = max(holders, key=lambda n: (near(n), len(left[n][kind]), -n))
            placed[j][s] = left[node][kind].pop(0)
        cost = sum(across[layer] for layer in range(layers)
                   if len({node_of[placed[j][holder[j][layer]]] for j in range(replicas)}) > 1)
        cost += share * sum(penalties[j][b] for j, seq in enumerate(placed) for b in range(1, len(seq))
                            if node_of[seq[b]] != node_of[seq[b - 1]])
        found.append((cost, [list(seq) for seq in placed]))

    def extend(k: int, left: dict[int, dict[str, list[tuple[int, ...]]]], placed: list[list[tuple[int, ...] | None]]
               ) -> None:
        if len(found) >= PLACEMENTS:
            return
        if k == layers:
            finish({n: {t: list(gs) for t, gs in pools.items()} for n, pools in left.items()},
                   [list(seq) for seq in placed])
            return
        layer = order[k]
        slots = [(j, holder[j][layer]) for j in range(replicas)]
        nodes = {node_of[placed[j][s]] for j, s in slots if placed[j][s] is not None}
        need = Counter(pipes[j][0][s] for j, s in slots if placed[j][s] is None)
        options: dict[tuple, int] = {}
        if len(nodes) <= 1 and need:
            for n in sorted(nodes or left, key=lambda n: (sum(len(gs) for gs in left[n].values()), n)):
                if all(len(left[n].get(t, ())) >= c for t, c in need.items()):
                    options.setdefault(tuple(sorted((t, len(gs)) for t, gs in left[n].items())), n)
        if not options:
            extend(k + 1, left, placed)
        for n in options.values():
            taken = []
            for j, s in slots:
                if placed[j][s] is None:
                    placed[j][s] = left[n][pipes[j][0][s]].pop(0)
                    taken.append((j, s))
            extend(k + 1, left, placed)
            for j, s in reversed(taken):
                left[n][pipes[j][0][s]].insert(0, placed[j][s])
                placed[j][s] = None
    extend(0, {n: {t: list(gs) for t, gs in pools.items()} for n, pools in free.items()},
           [[None] * len(types) for types, _ in pipes])
    return min(found, key=lambda item: item[0])[1] if found else None


def copy_plans(instance: Instance, failed: frozenset[int], model: PerfModel, deadline: Deadline,
               incumbent: float = math.inf) -> list[tuple[Plan, float]]:
    """(plan, exact step) of the copy plans found below `incumbent`, fastest first (see the
    module docstring); empty past `deadline` or beyond CANDIDATE_BUDGET."""
    tp, total, layers = instance.plan.tensor_parallel, instance.global_micro_batches, instance.workload.num_layers
    options = [groups for groups in inventories(instance, model, failed, tp, deadline) or
               [survivor_groups(instance, failed, tp)] if groups]
    if not options:
        return []
    groups = options[0]  # every inventory forms as many groups, as many in each node
    names = {g: model.stage_device(g).name for option in options for g in option}
    counts = [Counter(names[g] for g in option) for option in options]
    available = functools.reduce(operator.or_, counts)  # per type: the most groups of it any inventory has
    kinds = sorted(available)
    longest = min(layers, len(groups))
    if sum(len(kinds) ** s * math.comb(layers - 1, s - 1) * min(total, len(groups) // s)
           for s in range(1, longest + 1)) > CANDIDATE_BUDGET:
        return []
    # a group of each type from any inventory: the first may form none of a type another forms
    # (8-24-device seed 156: TP 2 over fast and slow devices, mixed groups in some inventories only)
    sample = {name: next(g for option in options for g in option if names[g] == name) for name in kinds}
    relief = model.fastest_relief
    # per type: per layer forward + backward split as (forward, backward) prefix sums, optimizer steps
    forward, backward, update = {}, {}, {}
    for name, g in sample.items():
        times = [model.stage_times(g, layer, layer + 1, relief)[:2] for layer in range(layers)]
        forward[name] = np.cumsum([0.0] + [t[0] for t in times])
        backward[name] = np.cumsum([0.0] + [t[1] for t in times])
        update[name] = np.cumsum([0.0] + [model.optimizer_time(g, layer, layer + 1, relief) for layer in range(layers)])
    sends = np.array([model.boundary_send_on(model.intra, layer) for layer in range(layers)])
    sizes = np.cumsum(np.concatenate([[0.0], model.workload.params * model.grad_bytes / tp]))
    per_node = Counter(instance.node_of(g[0]) for g in groups)
    faster = Link(max(model.intra.bandwidth, model.inter.bandwidth), min(model.intra.latency, model.inter.latency))
    candidates = []
    for stages in range(1, longest + 1):
        if deadline.expired():
            return []
        cuts = np.array([(0,) + cut + (layers,) for cut in itertools.combinations(range(1, layers), stages - 1)])
        first, end = cuts[:, :-1], cuts[:, 1:]
        send = np.zeros_like(first, dtype=float)
        send[:, :-1] = sends[end[:, :-1] - 1]
        largest = (sizes[end] - sizes[first]).max(axis=1)
        warmup = np.arange(stages - 1, -1, -1)
        for types in itertools.product(kinds, repeat=stages):
            used = Counter(types)
            most = min(min(total, len(groups) // stages), *(available[t] // k for t, k in used.items()))
            if most < 1:
                continue
            f = np.stack([forward[t][end[:, s]] - forward[t][first[:, s]] for s, t in enumerate(types)], axis=1) + send
            b = np.stack([backward[t][end[:, s]] - backward[t][first[:, s]] for s, t in enumerate(types)], axis=1)
            b[:, 1:] += send[:, :-1]
            step = np.stack([update[t][end[:, s]] - update[t][first[:, s]] for s, t in enumerate(types)],
                            axis=1).max(axis=1)
            whole = (f + b).sum(axis=1)
            for copies in range(1, most + 1):
                m = -(-total // copies)
                # the closed-form 1F1B floor: W + (m - 1) b_s + max(m - 1 - k_s, 0) f_s, its largest stage
                floor = (whole[:, None] + (m - 1) * b + np.maximum(m - 1 - warmup, 0) * f).max(axis=1)
                link = faster if copies <= max(per_node.values()) else model.inter
                ring = np.array([ring_allreduce_time(float(x), copies, link) for x in largest]) if copies > 1 else 0.0
                estimate = floor + step / model.optimizer_shards(copies) + ring
                candidates += [(float(e), types, tuple(int(x) for x in cut), copies)
                               for e, cut in zip(estimate, cuts)]
    candidates.sort()
    layouts: list[dict[int, dict[str, list[tuple[int, ...]]]]] = []  # per inventory: per node, per type, its groups
    for option in options:
        layouts.append({})
        for g in option:
            layouts[-1].setdefault(instance.node_of(g[0]), {}).setdefault(names[g], []).append(g)
    fits: dict[tuple, bool] = {}

    def fit(name: str, first: int, end: int, s: int, stages: int, m: int, copies: int) -> bool:
        """Whether a stage of this type fits in memory under some relief (memoised)."""
        key = (name, first, end, s, stages, m, copies)
        if key not in fits:
            g = sample[name]
            capacity = model.stage_device(g).memory_gib * GIB
            fits[key] = any(model.stage_memory(g, first, end, s, stages, m, 0.0, copies, r)[0] <= capacity
                            for r in model.relief_options)
        return fits[key]

    found: list[tuple[Plan, float]] = []
    best, most_per_node = incumbent, max(per_node.values())
    for estimate, types, bounds, copies in candidates:
        if estimate >= best * (1 - 1e-9) or deadline.expired():
            break
        stages, m = len(types), -(-total // copies)
        if not all(fit(t, bounds[s], bounds[s + 1], s, stages, m, copies) for s, t in enumerate(types)):
            continue
        penalty, used = _penalties(model, bounds), Counter(types)
        placements = [_place(types, penalty, copies, {n: {t: list(gs) for t, gs in pools.items()}
                                                      for n, pools in layout.items()})
                      for have, layout in zip(counts, layouts) if all(have[t] >= k * copies for t, k in used.items())]
        placements = [found for found in placements if found is not None]
        if not placements:
            continue
        ways = [min(placements, key=lambda found: found[1])[0]]  # the inventory whose crossings cost least
        if 1 < copies <= most_per_node and stages > 1:  # and by columns, on the first inventory that has them
            sizes_of = [float(sizes[bounds[s + 1]] - sizes[bounds[s]]) for s in range(stages)]
            ways += next((found for have, layout in zip(counts, layouts)
                          if all(have[t] >= k * copies for t, k in used.items())
                          for found in [_place_columns(types, sizes_of, penalty, copies, layout)] if found), [])
        for placed in ways:
            priced = _priced(model, [(seq, bounds) for seq in placed], tp, total, deadline, failed)
            if priced is not None:
                found.append(priced)
                best = min(best, priced[1])
    per_kinds: Counter = Counter()  # per multiset of types: its shapes kept, the best by copy estimate
    shapes = []
    most = min(total, len(groups))
    for types, bounds in dict.fromkeys((types, bounds) for _, types, bounds, _ in candidates):
        kinds_used = tuple(sorted(Counter(types).items()))
        # that fit in memory with one micro-batch and the most replicas (24-32-device seed 3253: four
        # slow-fast-fast copies whose slow stage holds two layers beside three fast copies, one micro-batch
        # each; the slow stages of one layer rank first and fit nowhere)
        if per_kinds[kinds_used] < PAIR_SHAPES and all(fit(t, bounds[s], bounds[s + 1], s, len(types), 1, most)
                                                       for s, t in enumerate(types)):
            per_kinds[kinds_used] += 1
            shapes.append((types, bounds))
    shapes = shapes[:max(2, math.isqrt(PAIR_BUDGET // max(total ** 3, 1)))]
    found += _pairs(model, tp, shapes, (forward, backward, update, sends, sizes), available, len(groups),
                    max(per_node.values()), counts, layouts, fit, deadline, failed, best)
    best = min([best] + [step for _, step in found])
    found += _mixes(model, tp, shapes, (forward, backward, update, sends, sizes), available, counts, layouts, fit,
                    deadline, failed, best)
    return sorted(found, key=lambda item: item[1])


def _priced(model: PerfModel, placed: list[tuple[list[tuple[int, ...]], tuple[int, ...]]], tp: int, total: int,
            deadline: Deadline, failed: frozenset[int]) -> tuple[Plan, float] | None:
    """(plan, exact step) of pipelines given as (each stage's group, layer boundaries), micro-batches
    spread and reliefs chosen as every incumbent builder does (`spread_and_priced`); None when none fits."""
    pipelines = [Pipeline(tuple(Stage(g, bounds[s], bounds[s + 1]) for s, g in enumerate(seq)), 1)
                 for seq, bounds in placed]
    return spread_and_priced(model, pipelines, tp, total, deadline, failed)


def _shape_floors(types: tuple[str, ...], bounds: tuple[int, ...], prefix: tuple, total: int) -> np.ndarray:
    """The closed-form 1F1B floor of one shape (device types along a pipeline, layer split) for each
    micro-batch count m = 0..total: W + (m - 1) b_s + max(m - 1 - k_s, 0) f_s at its largest stage s
    (k_s its warm-up forwards), the sends on the stages beside them; `prefix` as `_pairs` takes it."""
    forward, backward, _, sends, _ = prefix
    stages, first, end = len(types), np.array(bounds[:-1]), np.array(bounds[1:])
    send = np.zeros(stages)
    send[:-1] = sends[end[:-1] - 1]
    f = np.array([forward[t][end[s]] - forward[t][first[s]] for s, t in enumerate(types)]) + send
    b = np.array([backward[t][end[s]] - backward[t][first[s]] for s, t in enumerate(types)])
    b[1:] += send[:-1]
    m = np.arange(total + 1)[:, None]
    return ((f + b).sum() + np.maximum(m - 1, 0) * b + np.maximum(m - 1 - np.arange(stages - 1, -1, -1), 0) * f
            ).max(axis=1)


def _inside(model: PerfModel, types: tuple[str, ...], bounds: tuple[int, ...],
            layout: dict[int, dict[str, list[tuple[int, ...]]]]) -> int:
    """How many copies of a shape `_place` puts one after another on these groups (per node, per type)
    with every paying send inside a node: past them, some copy sends across nodes (24-32-device seed
    6166: slow-fast copies whose 100 MB send must stay in a node, four nodes with a slow and a fast group)."""
    penalty, copies = _penalties(model, bounds), 0
    free = {n: {t: list(gs) for t, gs in pools.items()} for n, pools in layout.items()}
    while True:
        got = _place(types, penalty, 1, free)
        if got is None or got[1] > 0.0:
            return copies
        copies += 1


def _pairs(model: PerfModel, tp: int, shapes: list[tuple[tuple[str, ...], tuple[int, ...]]], prefix: tuple,
           available: Counter, groups: int, most_per_node: int, counts: list[Counter], layouts: list[dict],
           fit: Callable[..., bool], deadline: Deadline, failed: frozenset[int], best: float
           ) -> list[tuple[Plan, float]]:
    """(plan, exact step) of plans of copies of two shapes, c_A of one and c_B of the other, below `best`.
    Why: the best plan often mixes two shapes, fast pipelines beside ones that put a slow group where
    it costs least (24-32-device seeds 3132: two slow-fast-slow copies and two fast-fast ones; 3144:
    three fast three-stage copies and two slow-fast ones), which neither the copies of one shape nor
    the branch and bound's runs meet within 2 s. Each pair of the best shapes by copy estimate, and
    each (c_A, c_B) the groups of each type allow, is estimated as the copies are (the closed-form
    1F1B floor of each shape at its micro-batches, the best split of the batch between them, the
    larger step and ring over c_A + c_B replicas); by estimate, below `best`, each is placed as the
    copies are (the first shape's copies, then the second's on the groups left: both orders, on every
    inventory with the groups) and priced by the performance model with its best reliefs."""
    _, _, update, _, sizes = prefix
    total = model.instance.global_micro_batches
    if len(shapes) < 2 or total < 2:
        return []
    faster = Link(max(model.intra.bandwidth, model.inter.bandwidth), min(model.intra.latency, model.inter.latency))
    # per shape: its 1F1B floor per micro-batch count (index m), its step, its largest stage's gradient bytes
    tables = []
    for types, bounds in shapes:
        first, end = np.array(bounds[:-1]), np.array(bounds[1:])
        floor = _shape_floors(types, bounds, prefix, total)
        step = max(update[t][end[s]] - update[t][first[s]] for s, t in enumerate(types))
        tables.append((floor, step, float((sizes[end] - sizes[first]).max()), Counter(types)))
    floors = np.array([table[0] for table in tables])  # (shape, m)
    floors[:, 0] = np.inf
    steps, sizes_of = np.array([table[1] for table in tables]), np.array([table[2] for table in tables])
    stage_counts = np.array([len(types) for types, _ in shapes])
    uses = np.array([[table[3][t] for t in sorted(available)] for table in tables])  # (shape, type)
    have = np.array([available[t] for t in sorted(available)])
    upper = np.triu(np.ones((len(shapes), len(shapes)), dtype=bool), 1)  # each unordered pair once
    # past the copies its nodes keep whole (`_inside`), a shape's estimate takes its paying sends across nodes
    inside = np.array([_inside(model, types, bounds, layouts[0]) for types, bounds in shapes])
    across = (prefix[0], prefix[1], update,
              np.array([model.boundary_send_on(model.inter, layer) for layer in range(len(prefix[3]))]), sizes)
    crossing = np.array([_shape_floors(types, bounds, across, total) for types, bounds in shapes])
    crossing[:, 0] = np.inf
    largest, slowest = np.maximum.outer(sizes_of, sizes_of), np.maximum.outer(steps, steps)
    estimates = []
    for copies_a in range(1, min(total, groups)):
        if deadline.expired():
            return []
        for copies_b in range(1, min(total, groups) - copies_a + 1):
            fits = upper & (np.add.outer(stage_counts * copies_a, stage_counts * copies_b) <= groups) & np.all(
                uses[:, None, :] * copies_a + uses[None, :, :] * copies_b <= have, axis=2)
            if not fits.any():
                continue
            time_s, placed_s = np.full(fits.shape, np.inf), np.full(fits.shape, np.inf)
            first = np.where((copies_a > inside)[:, None], crossing, floors)
            second = np.where((copies_b > inside)[:, None], crossing, floors)
            for m in range(1, (total - copies_b) // copies_a + 1):
                other = -(-(total - copies_a * m) // copies_b)
                np.minimum(time_s, np.maximum.outer(floors[:, m], floors[:, other]), out=time_s)
                np.minimum(placed_s, np.maximum.outer(first[:, m], second[:, other]), out=placed_s)
            replicas = copies_a + copies_b
            link = faster if replicas <= most_per_node else model.inter
            ring = 2 * (replicas - 1) * (link.latency + largest / replicas / link.bandwidth)
            extra = slowest / model.optimizer_shards(replicas) + ring
            estimate = np.where(fits, time_s + extra, np.inf)
            for i, j in zip(*np.nonzero(estimate < best * (1 - 1e-9))):
                union = len(set(shapes[i][1]) | set(shapes[j][1]))
                estimates.append((float(placed_s[i, j] + extra[i, j]), union, float(estimate[i, j]), int(i), copies_a,
                                  int(j), copies_b))
    # two rankings, taken in turn: by the estimate with the crossings the nodes force, then the fewest
    # boundaries in both splits (a stage rings one group per run of its layers between them, each with its
    # own latency), then the estimate; and by the estimate alone. Neither ranking's first pairs hold the
    # other's best plan on every instance (24-32-device seed 6166 needs the first, 3163 the second: 27.73
    # against 28.39 at 2 s by the first alone), so each gets PAIR_TRIES tries.
    by_crossings = sorted(estimates)
    by_estimate = sorted(estimates, key=lambda e: (e[2],) + e[3:])
    ranked = list(dict.fromkeys(e for pair in zip(by_crossings, by_estimate) for e in pair))
    found: list[tuple[Plan, float]] = []
    tries = 0
    for _, _, estimate, i, copies_a, j, copies_b in ranked:
        if tries >= 2 * PAIR_TRIES or deadline.expired():
            break
        if estimate >= best * (1 - 1e-9):
            continue
        parts = ((shapes[i], copies_a), (shapes[j], copies_b))
        replicas, m = copies_a + copies_b, -(-total // (copies_a + copies_b))
        if not all(fit(t, bounds[s], bounds[s + 1], s, len(types), m, replicas)
                   for (types, bounds), _ in parts for s, t in enumerate(types)):
            continue
        need: Counter = Counter()
        for (types, _), copies in parts:
            for t in types:
                need[t] += copies
        placements = []
        layout = next((layout for have, layout in zip(counts, layouts) if all(have[t] >= k for t, k in need.items())),
                      None)  # the first inventory with the groups
        if layout is not None:
            for order in (parts, parts[::-1]):
                free = {n: {t: list(gs) for t, gs in pools.items()} for n, pools in layout.items()}
                placed, cost = [], 0.0
                for (types, bounds), copies in order:
                    got = _place(types, _penalties(model, bounds), copies, free)
                    if got is None:
                        break
                    placed += [(seq, bounds) for seq in got[0]]
                    cost += got[1]
                else:
                    placements.append((cost, placed))
        if not placements:
            continue
        tries += 1
        # by sends, each order whose crossings cost the least (equal costs can slow the slowest pipeline or
        # a faster one: 24-32-device seed 6166, a 100 MB send across on a slow-fast copy or on a fast-fast
        # one), and by layers
        cheapest = min(cost for cost, _ in placements)
        ways = [placed for cost, placed in placements if cost <= cheapest]
        pipes = [shape for shape, copies in parts for _ in range(copies)]
        by_layers = _place_layers(model, tp, pipes, layout)
        if by_layers is not None:
            ways.append([(seq, bounds) for seq, (_, bounds) in zip(by_layers, pipes)])
        for placed in ways:
            priced = _priced(model, placed, tp, total, deadline, failed)
            if priced is not None:
                found.append(priced)
                best = min(best, priced[1])
    return found


def _mixes(model: PerfModel, tp: int, shapes: list[tuple[tuple[str, ...], tuple[int, ...]]], prefix: tuple,
           available: Counter, counts: list[Counter], layouts: list[dict], fit: Callable[..., bool],
           deadline: Deadline, failed: frozenset[int], best: float) -> list[tuple[Plan, float]]:
    """(plan, exact step) of the plan of any number of shapes whose pipelines' estimated time is least,
    when below `best`. Why: the groups of each type may allow no plan of one or two shapes as fast as
    one of three or four (24-32-device seed 3253: seven pipelines of one micro-batch on 21 fast and 5
    slow groups, fast stages of one layer each; five slow-fast-fast copies beside two fast four-stage
    ones 22.3599, two slow-fast-fast, three fast-slow-fast-fast and two fast four-stage ones 22.2405).
    Each shape's time is its closed-form 1F1B floor per micro-batch count plus its optimizer step (no
    ring); the least bound t for which some multiset of shapes, within the groups of each type, runs
    every micro-batch with each pipeline's time at most t (bisection over the floors' values; per t a
    knapsack over the groups used of each type, the most micro-batches per number of pipelines) is
    placed by layers (`_place_layers`) and priced by the performance model with its best reliefs."""
    update = prefix[2]
    total = model.instance.global_micro_batches
    kinds = sorted(available)
    have = tuple(available[t] for t in kinds)
    if len(shapes) < 3 or total < 2 or math.prod(h + 1 for h in have) > MIX_CELLS:
        return []
    times = []
    for types, bounds in shapes:
        first, end = np.array(bounds[:-1]), np.array(bounds[1:])
        times.append(_shape_floors(types, bounds, prefix, total)[1:]
                     + max(update[t][end[s]] - update[t][first[s]] for s, t in enumerate(types)))
    most = min(total, sum(have))
    for (types, bounds), row in zip(shapes, times):  # no more micro-batches than fit in memory with the most replicas
        row[[not all(fit(t, bounds[s], bounds[s + 1], s, len(types), m, most) for s, t in enumerate(types))
             for m in range(1, total + 1)]] = np.inf
    times_of = np.array(times)  # (shape, micro-batches - 1): nondecreasing along the micro-batches
    uses = [tuple(Counter(types)[t] for t in kinds) for types, _ in shapes]

    def mix(bound: float, below: float = -math.inf, beyond: int = 0) -> list[int] | None:
        """Shapes (indices, one per pipeline) that run every micro-batch within `bound`, at most `beyond`
        of them past `below` (the rest within it; without `below`, no limit), the fewest pipelines."""
        items = []  # (shape, groups used of each type and pipelines past `below`, micro-batches it runs)
        for i, row in enumerate(times_of):
            within, past = int((row <= below).sum()), int((row <= bound).sum())
            if within:
                items.append((i, uses[i] + (0,), within))
            if past > within:
                items.append((i, uses[i] + (int(below > -math.inf),), past))
        limits = have + (beyond,)
        level = np.full(tuple(h + 1 for h in limits), -1, dtype=int)  # per groups used: the most micro-batches
        level[(0,) * len(limits)] = 0
        choices = []
        for _ in range(most):
            after, chosen = np.full_like(level, -1), np.full_like(level, -1)
            for k, (_, use, run) in enumerate(items):
                target = tuple(slice(u, None) for u in use)
                source = level[tuple(slice(0, h + 1 - u) for h, u in zip(limits, use))]
                gain = np.where(source >= 0, source + run, -1)
                better = gain > after[target]
                after[target] = np.where(better, gain, after[target])
                chosen[target] = np.where(better, k, chosen[target])
            choices.append(chosen)
            level = after
            if level.max() >= total:
                cell = np.unravel_index(int(level.argmax()), level.shape)
                picked = []
                for chosen in reversed(choices):
                    k = int(chosen[cell])
                    picked.append(items[k][0])
                    cell = tuple(c - u for c, u in zip(cell, items[k][1]))
                return picked
        return None

    bounds_at = np.unique(times_of[np.isfinite(times_of) & (times_of < best)])
    low, high, picked = 0, len(bounds_at), None
    while low < high and not deadline.expired():  # the least bound with a mix
        middle = (low + high) // 2
        found_mix = mix(float(bounds_at[middle]))
        if found_mix is None:
            low = middle + 1
        else:
            high, picked = middle, found_mix
    if picked is None or deadline.expired():
        return []
    if high > 0:  # the fewest pipelines at that bound: the others' stages leave the rings room
        below = float(bounds_at[high - 1])
        picked = next((found_mix for beyond in range(1, most + 1) if not deadline.expired()
                       for found_mix in [mix(float(bounds_at[high]), below, beyond)] if found_mix is not None), picked)
    pipes = [shapes[i] for i in sorted(picked)]
    need = Counter(t for types, _ in pipes for t in types)
    layout = next((layout for have_of, layout in zip(counts, layouts)
                   if all(have_of[t] >= k for t, k in need.items())), None)
    placed = _place_layers(model, tp, pipes, layout) if layout is not None else None
    if placed is None:
        return []
    priced = _priced(model, [(seq, bounds) for seq, (_, bounds) in zip(placed, pipes)], tp, total, deadline,
                     failed)
    return [priced] if priced is not None and priced[1] < best else []
