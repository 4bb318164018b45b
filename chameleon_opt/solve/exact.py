"""Exact plan search for small survivor sets: branch and bound over the whole plan space, priced
by the performance model itself.

The space (the `space` named in `plan --json`): TP groups formed inside each node from any of its
survivors (every grouping whose group types differ is tried, once up to renaming nodes), pipelines as ordered sequences of
groups of any device types, survivors left idle, every contiguous layer split, every micro-batch
allocation; 1F1B; step = PerfModel.evaluate (exact 1F1B longest path + gradient all-reduce +
optimizer step), memory checked at the exact replica count.

Decomposition (pipelines priced once per shape, a master over multisets of them):
- classes: TP groups of one device type in one node are interchangeable; nodes whose surviving
  groups have the same types form a family and are interchangeable too.
- pipeline shape: (device type per stage, whether each boundary crosses nodes, layer boundaries).
  Its exact terms do not depend on where it is placed (the model sees a node only through
  intra/inter-node links): t(m) = PerfModel.pipeline_time (the 1F1B longest path, Eq. 11, blocking
  sends included, or interleaved 1F1B), u = its slowest optimizer step, g = its largest per-stage
  gradient bytes, for every m that fits in memory with the most replicas any plan could give it
  (`price`, cached per shape);
- master: pipelines chosen one at a time in non-increasing key (stages, m, shape, boundaries): a
  multiset, not a sequence; each grown stage by stage from the groups left, each class's groups
  taken in order, and a node no group uses yet taken only as the first such node of its family
  (symmetry: any plan maps onto one of these by renaming nodes and groups, with the same step).
  Step = max t + DP + max u; a candidate is cut when
      max(t so far, cover(groups left, micro-batches left)) + max u + ring floor >= incumbent,
  and a pipeline stops growing when no longer one can beat the incumbent (`completion`).
  cover(state, n) is a DP over a relaxation that counts the groups left of each device type (a
  state; one kind for all types when the tables would be too large): a pipeline taking v_k groups
  of type k costs at least lower(v, m), every stage range at its type's fastest relief, in every
  order of the types along the pipeline, boundary sends at the faster link except the node
  crossings a pipeline longer than a node must make (runs of stages in one node hold at most a
  node's groups: every minimal set of crossings that allows is tried), so
      cover(state, n) = min(cover(state - e_k, n), min over v <= state, m <= n of
                        max(lower(v, m), cover(state - v, n - m)))
  and no plan is priced with more fast groups than the cluster has; lower(v, m) counts only splits
  whose every stage fits the relaxed memory of its own type. The tables are built once for every
  inventory (`Relaxation`). The ring floor is the all-reduce of the largest stage over the
  pipelines there will be (at least `fewest_table`'s count more; one of them has a stage of at
  least `_largest_stage` bytes), on the inter-node link when no node can hold a slot of every
  pipeline, and of the layers whose holders already sit on two nodes or on a node without an
  unused group for each pipeline to come (per stage: those layers' bytes across and the rest on the
  faster link, `Relaxation.stage_ring`). A partial plan is also cut when the root floor of every
  pipeline count it may end with meets the incumbent (`by_count`, each count's refined up to the
  incumbent); per count the root floor also splits plans by which layers ring inside a node
  (`ExactSearch.floor`: column, spanning, held, isolated-stage, neighboured, kept-pair and
  one-stage-pipeline floors, and `thresholds`: the slowest time and the largest ring on the same splits;
  `boundaries`: sends between two stages of a kind kept inside nodes are counted). A pipeline stops growing once its first stages' kinds, in
  order, make it or the others too slow: it takes at least `prefix_lower` (the least closed-form
  1F1B time over the orders that start so, any split and crossings) with the m micro-batches it
  runs, the others at least the cover of the rest on the groups left, for every m (only every
  micro-batch left when no plan of more pipelines can beat the incumbent: it is the last). Leaves:
  PerfModel.evaluate after choose_reliefs.
When the tree is exhausted the incumbent is optimal over the space; if the deadline stops it
first, the caller reports its own valid bound instead.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.comm import Link, ring_allgather_time, ring_allreduce_time
from chameleon_opt.perf.memory import in_flight_micro_batches
from chameleon_opt.perf.model import GIB, PerfModel, interleaving_refusal
from chameleon_opt.perf.pipeline import one_f_one_b_floors
from chameleon_opt.perf.relief import choose_reliefs
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.bounds import MemoryRelaxation
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.frames import on_fresh_chunk
from chameleon_opt.solve.polish import polish_placement, polish_step_splits

EXACT_GROUPS = 64
"""Most surviving TP groups the branch and bound is tried on; beyond, the scale path's bound stands."""
SPLIT_BUDGET = 4_096
"""Most layer splits over every pipeline length (2^12: 13 layers); each pipeline shape is priced over them."""
CROSSING_BUDGET = 20_000
"""Most (split, crossing boundaries) pairs tried per pipeline length by the relaxation; beyond, every
boundary takes its faster link."""
LOWER_SIMULATION_UNITS = 1_000_000
"""Most stage x micro-batch operations the relaxation simulates; beyond, it uses the per-stage
closed-form bound. The closed form skips the simulations that cannot lower a minimum, so few run:
the 32-64-device seeds 9000-9199 above 100,000 units (7, up to 207,000) build their table in at most
0.1 s. 32-64-device seed 9166 (207,000 units): two fast stages and a slow one with three
micro-batches take 38.03 s, the closed form allowed 37.47, and its floor stayed at 38.28 against the
38.70 plan; simulated, it meets the plan at once. Beyond, DEEP_SIMULATION_UNITS."""
DEEP_SIMULATION_UNITS = 50_000
"""Beyond LOWER_SIMULATION_UNITS, the most stage x micro-batch operations the relaxation's `lower_times`
tables simulate in all (the first built, `build`'s, takes what it needs): per micro-batch count the
candidates best first by closed form, while one can still lower the least; once the units are spent,
the least closed form left bounds every candidate not simulated. 8-24-device seed 4 (11 layers, one
pipeline of 8 micro-batches): the closed forms allowed 76.82, 846 simulations (0.2 s) meet the
optimum, 77.83."""
ISOLATED_SIMULATION_UNITS = 100_000
"""The same for the isolated tables (`lower_times`' `isolate`), which simulate every choice of the
isolated stages, for many cases each: at LOWER_SIMULATION_UNITS they took 32-64-device seed 359 from
0.18 to 0.45 s."""
ISOLATED_BATCH_ELEMENTS = 200_000
"""Most (candidate, m) elements of one batch of the isolated tables' closed forms (50-70 ms on a quiet
2-core machine): `lower_times` reads its deadline between batches. In one call, 330 choices of 24-32-device
deep seed 4 (4 of 11 layers, 5 pairs, 252 splits, 8 micro-batches: 3.3M elements) took 1.3 s."""
TABLE_BUDGET = 500_000
"""Most steps of the relaxation's cover and completion tables (groups x micro-batches^2 x stages)."""
COUNTED_BUDGET = 20_000_000
"""Most steps of the pipeline-counted tables (`Relaxation.counted_table`, vectorised: the cover's steps
times the pipeline counts, once per least stage count); beyond, the reported floor is the pipeline
time's alone (none affordable) or takes the least stage counts that were."""
TYPED_BUDGET = 5_000_000
"""Most (state, kinds of one pipeline, n, m) steps of the type-aware cover tables (vectorised); beyond,
or beyond both CROSSING_BUDGET (split, order of kinds) pairs and KINDS_BUDGET, the relaxation lets every
group be of the fastest device type."""
KINDS_BUDGET = 20_000_000
"""Most (split, order of kinds) pairs x micro-batches x stages (the closed forms' elements) of a
relaxation that counts the device types with every send on the faster link (`Relaxation.free_sends`),
tried when the pairs are beyond CROSSING_BUDGET: deep pipelines have about 3^(layers - 1) of them
(8-24-device seed 4, 11 layers, nine groups of two types: 45,336 pairs, 3.3M elements, 0.2 s), and one
kind for every type let every slow group run at the fast type's pace (its floor 68.19, the optimum
77.83). The typed tables cost 0.5-0.8 s at 11-12 layers on 25-56 devices (118,097-354,294 pairs), where
one kind took 0.1 s: 32-64-device deep seed 10 (one micro-batch, the same floor either way) proves in
1.8 s instead of 0.8."""
FLOORED_SPLITS = 16
"""The tree floors a pipeline shape's splits at once (`Relaxation.shape_floors`, one numpy pass of about
0.1 ms, the price of 3-5 splits of a short pipeline) before pricing them when it has more splits than
this (deep pipelines: up to 252 at 11 layers); at 3-6 layers no shape has (at most 10)."""
GROUPING_BUDGET = 2_000
"""Most groupings of one node's survivors into TP groups enumerated before giving up exactness."""
INVENTORY_BUDGET = 256
"""Most inventories (combinations of the nodes' distinct groupings) searched: each is a branch and
bound of its own, so their count is checked before any is built (a product over 50 heterogeneous
nodes has 2^50 of them). 32-64 seed 45 (TP 2, seven nodes of fast and slow devices) has 192: its
floors and trees take 0.5 s, and at 64 its bound was the relaxation's, 0.2% low."""
SHORT_SHARE = 0.3
"""Of the branch and bound's time, at most this much for its runs capped at shorter pipelines."""
REGULAR_SHARE = 0.15
"""Of the branch and bound's time, at most this much for its run over plans whose pipelines all have
the first one's layer split, after the short runs (`ExactSearch.solve`)."""
FOCUS_SHARE = 0.3
"""Of the branch and bound's time, at most this much for a regular run over the plans of the pipeline
count with the least floor alone, when other counts are also below the incumbent (`ExactSearch.solve`)."""
REFINE_SHARE = 0.5
"""Of the exact search's time, at most this much refines the inventories' floors before the branch and
bound (`ExactSearch.floor` with a deadline: tables built on demand; tens of ms below 24 devices, under
0.3 s on 54 of 60 random 32-64-device instances, 0.5-1.4 s on the two of 64 devices and 7 micro-batches);
an inventory whose refined floor meets the incumbent is not searched. Only a slow floor uses it all,
and its tree rarely finishes in the rest without it (32-64 seed 56: the floor meets the plan)."""
SOLE_REFINE_SHARE = 0.6
"""REFINE_SHARE where a single inventory's floor is below the incumbent: its tree is then all that could
prove the plan otherwise, and it rarely does once the floors outlast their share (32-64 seeds 0-389 and
1000-1199 at 2 s: of the nine whose refining ran out, the six with one inventory left were never proven by
its tree; when set at 0.8, 324's floor met its plan after 1.14 s of refining, 0.95 s at REFINE_SHARE). Not
more: a small tree then has no time left (32-64 seed 192: its floors refine for 1.7 s and stay 0.18%
below the plan, its tree ends in 0.26 s; at 0.8 it had 0.25 s, at 0.6 it is proven in 1.66 s, while 324
and 53 still meet their plans by refining, in 0.85 and 1.08 s)."""
STEP_POLISH_SHARE = 0.1
"""Of what is left, at most this much polishes each better plan a tree finds (`polish_step_splits`)."""
REACHING_SHARE = 0.1
"""Of the branch and bound's time after its short runs, at most this much for the floors of the plans
left, each with a pipeline longer than the short runs allowed (`ExactSearch.reaching`)."""
LEAF_POLISH_SHARE = 0.05
"""Of the current run's time left, at most this much polishes the placement of each better plan a tree
finds (`polish_placement`, ms at 24 devices)."""
CHUNK_ELEMENTS = 1_000_000
"""Most (pair, (m, n)) elements one step of `Relaxation.counted_table` holds at once (8 MB an array)."""
SINGLE_LAYERS = 6
"""Most layers `ExactSearch.single` splits plans over (every set of layers whose rings stay inside a
node: 2^6 - 1 sets)."""
UNION_SETS = 64
"""Most sets of boundaries `ExactSearch.union_rings` floors plans over (2^(L-1) for L layers: 7 layers)."""
PRUNE_TOLERANCE = 1e-9
"""A node is cut when its bound is within this relative margin of the incumbent (ties)."""


@dataclass
class ExactOutcome:
    """What the branch and bound proved: `complete` means the whole space was searched."""

    plan: Plan | None
    objective: float
    complete: bool
    columns: int
    leaves: int
    reason: str
    bound: float = 0.0  # the relaxation's floor on every plan's step (`ExactSearch.floor`; holds when stopped early)


def _groupings(devices: list[int], tp: int, limit: int) -> list[list[tuple[int, ...]]] | None:
    """Every way to cut `devices` into as many TP groups as fit (the leftover idles); None when
    there are more than `limit`. Maximal groupings dominate: an extra group may always idle."""
    count = len(devices) // tp
    if count == 0:
        return [[]]
    found: list[list[tuple[int, ...]]] = []

    def extend(left: list[int], groups: list[tuple[int, ...]], skipped: int) -> bool:
        if len(groups) == count:
            found.append(list(groups))
            return len(found) <= limit
        if len(left) < tp:
            return True
        first, rest = left[0], left[1:]
        for others in itertools.combinations(rest, tp - 1):
            remaining = [d for d in rest if d not in others]
            if not extend(remaining, groups + [(first,) + others], skipped):
                return False
        if skipped < len(devices) - count * tp:  # `first` idles
            return extend(rest, groups, skipped + 1)
        return True

    return found if extend(sorted(devices), [], 0) else None


def _dominates(model: PerfModel, group: tuple[int, ...], other: tuple[int, ...]) -> bool:
    """Whether a TP group of `group`'s stage device type is never worse than one of `other`'s in the
    same node: under every relief and on every layer range no slower forward, backward or optimizer
    step, per layer no more state or activation bytes, and as much room for them (what the model
    reads of a group beside its node and size: a plan keeps its step and memory fit, or improves,
    when such a group replaces the other)."""
    layers = model.workload.num_layers
    for relief in model.relief_options:
        mine, theirs = model.layer_costs(group, 1, relief), model.layer_costs(other, 1, relief)
        if mine.capacity_bytes < theirs.capacity_bytes or mine.transient_bytes > theirs.transient_bytes \
                or (mine.static_bytes > theirs.static_bytes).any() \
                or (mine.activation_bytes > theirs.activation_bytes).any():
            return False
        for first in range(layers):
            for end in range(first + 1, layers + 1):
                fast, slow = model.stage_times(group, first, end, relief), model.stage_times(other, first, end, relief)
                if fast[0] > slow[0] or fast[1] > slow[1] or \
                        model.optimizer_time(group, first, end, relief) > model.optimizer_time(other, first, end, relief):
                    return False
    return True


def _covers(mine: tuple[str, ...], theirs: tuple[str, ...], better: dict[tuple[str, str], bool]) -> bool:
    """Whether each group type of `theirs` can be matched to its own group type of `mine` that
    dominates it (`better[a, b]`: a dominates b); a bipartite matching by augmenting paths."""
    owner: dict[int, int] = {}  # index in mine -> index in theirs matched to it

    def augment(j: int, seen: set[int]) -> bool:
        for i, name in enumerate(mine):
            if i not in seen and better[name, theirs[j]]:
                seen.add(i)
                if i not in owner or augment(owner[i], seen):
                    owner[i] = j
                    return True
        return False

    return len(mine) == len(theirs) and all(augment(j, set()) for j in range(len(theirs)))


def inventories(instance: Instance, model: PerfModel, failed: frozenset[int], tp: int,
                deadline: Deadline = Deadline.never()) -> list[list[tuple[int, ...]]] | None:
    """Distinct sets of TP groups the survivors can form (one per combination of the nodes'
    group-type multisets up to renaming nodes, less those dominated: a node's multiset whose groups each map to their
    own group of another multiset of the same node with a type that dominates theirs, `_dominates`,
    is dropped, since every plan on it has one no slower on the other); None when a node has too
    many groupings to enumerate, when the combinations up to renaming alike nodes number more than
    INVENTORY_BUDGET (counted before any is built), or past `deadline`."""
    per_node: list[list[list[tuple[int, ...]]]] = []
    better: dict[tuple[str, str], bool] = {}  # (type a, type b): a group of type a dominates one of b
    sample: dict[str, tuple[int, ...]] = {}   # a group of each stage device type met so far
    combinations = 1
    for node in range(instance.spec.cluster.nodes):
        if deadline.expired():
            return None
        live = [d for d in range(node * instance.devices_per_node, (node + 1) * instance.devices_per_node)
                if d not in failed]
        if len({model.stage_device((d,)).name for d in live}) <= 1 or tp == 1:
            per_node.append([[tuple(live[i:i + tp]) for i in range(0, len(live) - tp + 1, tp)]])
            continue
        options = _groupings(live, tp, GROUPING_BUDGET)
        if options is None:
            return None
        distinct: dict[tuple[str, ...], list[tuple[int, ...]]] = {}
        for option in options:
            key = tuple(sorted(model.stage_device(g).name for g in option))
            distinct.setdefault(key, option)
            for g in option:
                sample.setdefault(model.stage_device(g).name, g)
        for a, b in itertools.product(sample, repeat=2):
            if (a, b) not in better:
                better[a, b] = a == b or _dominates(model, sample[a], sample[b])
        keys = list(distinct)
        # a multiset goes when another covers it, strictly or (mutually) with a lower index
        for i, key in reversed(list(enumerate(keys))):
            if any(j != i and _covers(other, key, better) and (j < i or not _covers(key, other, better))
                   for j, other in enumerate(keys) if other in distinct):
                del distinct[key]
        per_node.append(list(distinct.values()))
    # Combinations equal up to renaming nodes (the same group types on each node, nodes in another order)
    # are one: the model sees a node only through its links, the same between every two nodes, so each
    # plan on one maps onto a plan on the other with the same step (32-64 seed 119: 64 -> 7, 155: 144 -> 48).
    # Nodes offering the same multisets are interchangeable, so only multisets of their choices are built
    # and counted against INVENTORY_BUDGET (32-64 seed 285: eight nodes of two or three multisets each, 576
    # combinations in node order, 216 up to renaming alike nodes, 102 inventories).
    # Each is built as the first combination in node order that realises it (each node of a class in turn
    # takes the multiset left that it lists first), and they come in that order, as when every combination
    # was walked: the trees' order, and so their incumbents, stay those of before (32-64 seed 155).
    def types(option: list[tuple[int, ...]]) -> tuple:
        return tuple(sorted(Counter(model.stage_device(g).name for g in option).items()))

    kinds = [[types(option) for option in options] for options in per_node]  # per node, in its own order
    alike: dict[tuple, list[int]] = {}  # the nodes offering each set of multisets
    for node, names in enumerate(kinds):
        alike.setdefault(tuple(sorted(names)), []).append(node)
    for names, nodes in alike.items():
        combinations *= math.comb(len(nodes) + len(names) - 1, len(nodes))
    if combinations > INVENTORY_BUDGET:
        return None
    parts = []  # per class, per multiset of its nodes' choices: (node, index of its option)
    for names, nodes in alike.items():
        part = []
        for choice in itertools.combinations_with_replacement(names, len(nodes)):
            left, assigned = list(choice), []
            for node in nodes:
                pick = min(left, key=kinds[node].index)
                left.remove(pick)
                assigned.append((node, kinds[node].index(pick)))
            part.append(assigned)
        parts.append(part)
    found: dict[tuple, tuple[int, ...]] = {}  # per inventory up to renaming: its first combination in node order
    for choice in itertools.product(*parts):
        index = [0] * len(per_node)
        for assigned in choice:
            for node, i in assigned:
                index[node] = i
        key = tuple(sorted(kinds[node][i] for node, i in enumerate(index)))
        if key not in found or tuple(index) < found[key]:
            found[key] = tuple(index)
    return [[g for node, i in enumerate(index) for g in per_node[node][i]] for index in sorted(found.values())]


def _profiles(counts: list[int], stages: int) -> list[tuple[int, ...]]:
    """Every way to take `stages` groups from kinds of these counts: groups per kind."""
    if len(counts) == 1:
        return [(stages,)] if stages <= counts[0] else []
    return [(k,) + rest for k in range(min(counts[0], stages) + 1) for rest in _profiles(counts[1:], stages - k)]


def _multinomial(profile: tuple[int, ...]) -> int:
    """Distinct orders of a pipeline's stages with these groups per kind."""
    return math.factorial(sum(profile)) // math.prod(math.factorial(k) for k in profile)


def _orders(profile: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every distinct sequence of kinds along a pipeline with these groups per kind."""
    if not sum(profile):
        return [()]
    return [(kind,) + rest for kind, k in enumerate(profile) if k
            for rest in _orders(profile[:kind] + (k - 1,) + profile[kind + 1:])]


@functools.lru_cache(maxsize=1024)
def _largest_stage(sizes: tuple[float, ...], stages: int) -> float:
    """The least largest part of any split of `sizes` into at most `stages` contiguous parts (cached:
    every inventory's floor asks the same, 0.26 s of 32-64 seed 45's 192 inventories uncached)."""
    prefix = list(itertools.accumulate(sizes, initial=0.0))
    best = [prefix[end] for end in range(len(sizes) + 1)]  # best[end]: one part over [0, end)
    for _ in range(stages - 1):
        best = [min([best[end]] + [max(best[cut], prefix[end] - prefix[cut]) for cut in range(1, end)])
                for end in range(len(sizes) + 1)]
    return best[-1]


def _crossing_sets(stages: int, most: int, least: int = 0) -> list[tuple[int, ...]]:
    """The minimal sets of node-crossing boundaries (boundary b: between stages b and b + 1) of a
    pipeline of `stages` stages when no node holds more than `most` of its groups: stages between
    two crossings share a node, so every run is at most `most` long, and every placement crosses
    at least the boundaries of one of these sets (more crossings only send more). `least`: the
    pipeline also crosses at least that often (none when it has too few boundaries)."""
    found: list[tuple[int, ...]] = []

    def extend(start: int, chosen: tuple[int, ...]) -> None:
        if stages - start <= most:  # the rest fits in one node: minimal if no crossing can be dropped
            runs = [b - a for a, b in zip((0,) + tuple(c + 1 for c in chosen), tuple(c + 1 for c in chosen) + (stages,))]
            if all(x + y > most for x, y in zip(runs, runs[1:])):
                found.append(chosen)
        for boundary in range(start, min(start + most, stages - 1)):  # this run: stages start..boundary
            extend(boundary + 1, chosen + (boundary,))

    extend(0, ())
    if not least:
        return found
    # minimal: those above with enough crossings, and every allowed set of exactly `least` (none
    # of its subsets has enough)
    exact = [chosen for chosen in itertools.combinations(range(stages - 1), least)
             if all(b - a <= most for a, b in zip((0,) + tuple(c + 1 for c in chosen),
                                                   tuple(c + 1 for c in chosen) + (stages,)))]
    return [chosen for chosen in found if len(chosen) > least] + exact


def _compositions(layers: int, stages: int) -> list[tuple[int, ...]]:
    """Every boundary tuple (0, b1, ..., layers) of `stages` non-empty contiguous stages."""
    return [(0,) + cut + (layers,) for cut in itertools.combinations(range(1, layers), stages - 1)]


@dataclass(frozen=True)
class Priced:
    """What one placed pipeline shape costs wherever it is placed: for each micro-batch count that
    fits in memory and can still beat the incumbent, (m, schedule time, optimizer step), m
    ascending; and its largest per-stage gradient bytes."""

    times: tuple[tuple[int, float, float], ...]
    grad_bytes: float


def _by_micro_batches(splits: list[tuple[tuple[int, ...], Priced]]
                      ) -> list[list[tuple[float, float, tuple[int, ...], float]]]:
    """A shape's priced splits (`ExactSearch.price`) regrouped by micro-batch count: row m holds
    (schedule time, optimizer step, boundaries, largest stage's gradient bytes) of every split that
    runs m micro-batches, fastest first (the master's floors grow with the time, so it stops at the
    first that is cut); the rows end at the largest m any split runs."""
    rows: list[list[tuple[float, float, tuple[int, ...], float]]] = [[]]
    for bounds, priced in splits:
        for m, time_s, optimizer_s in priced.times:
            rows.extend([] for _ in range(m + 1 - len(rows)))
            rows[m].append((time_s, optimizer_s, bounds, priced.grad_bytes))
    for row in rows:
        row.sort()
    return rows


def _fitting(items: list[tuple[int, np.ndarray, int, np.ndarray]], parts: np.ndarray, groups: int
             ) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """The cover programmes' pipeline items (`_programme`) that fit some state of `parts` (states of
    `groups` groups): (stages, offset among the states, lower time by m, the states it fits)."""
    for stages, profile, offset, times in items:
        if stages > groups:
            continue
        fit = (parts >= profile).all(axis=1)
        if fit.any():
            yield stages, offset, times, fit


def _member(values: np.ndarray, chosen: Iterable[int]) -> np.ndarray:
    """`np.isin(values, chosen)` for the few layer indices the floors test: one broadcast comparison
    (np.isin's sorting set-up dominated the pattern tables, thousands of calls on arrays of tens of rows)."""
    return (values[..., None] == np.fromiter(chosen, dtype=int)).any(axis=-1)


def _choice_rows(array: np.ndarray, pairs: int, choices: int, splits: int, c: int) -> np.ndarray:
    """Choice c's rows of a batched `_closed_forms` array (pair-major, then choice, then split)."""
    return array.reshape(pairs, choices, splits, -1)[:, c].reshape(pairs * splits, -1)


def _largest_below(costs: Iterable[float | None], least: float) -> float | None:
    """The largest of `costs`, read lazily only until it reaches `least` (a minimax over assignments needs no
    more: that assignment cannot lower the least largest); None as soon as a cost is out of reach."""
    worst = 0.0
    for value in costs:
        if value is None:
            return None
        worst = max(worst, value)
        if worst >= least:
            break
    return worst


def interleaved_closed(forward: np.ndarray, backward: np.ndarray, sends: np.ndarray, most: int,
                       virtual: int) -> np.ndarray:
    """closed[candidate, m - 1] for m = 1..most: a lower bound on PerfModel.pipeline_time under
    interleaving (v > 1) from each candidate's compute (forward, backward: candidate x stage, sends
    excluded) and sends (candidate x boundary). pipeline_time is LP(f / v, b / v, m) + m (v - 1)
    max_s (f_s + b_s) / v + E, with E = v sum (send_forward + send_backward) + 2 (v - 1) max
    send_forward = 2 v sum sends + 2 (v - 1) max sends, taken exactly here; LP, the 1F1B longest path
    of the chunk operations (one_f_one_b_time on f / v, b / v), is at least `one_f_one_b_floors` on
    them: the same 1F1B operation graph, other durations. The plain 1F1B form on folded sends is no
    bound here: interleaving shrinks the bubble to (p - 1) / v of plain 1F1B's and exposes each send a
    fixed number of times, not per micro-batch (bench/brute_force.py --virtual-stages 2 found floors
    above the optimum with it)."""
    stages = forward.shape[1]
    counts = np.arange(1, most + 1)
    chunk_f, chunk_b = forward / virtual, backward / virtual
    path = one_f_one_b_floors(chunk_f, chunk_b, counts)
    heaviest = (chunk_f + chunk_b).max(axis=1)
    exposed = 2 * virtual * sends.sum(axis=1) + 2 * (virtual - 1) * (sends.max(axis=1) if stages > 1 else 0.0)
    return path + counts[None, :] * (virtual - 1) * heaviest[:, None] + exposed[:, None]


class Relaxation:
    """The branch and bound's relaxation, one for every inventory of the same survivors (their
    group counts per device type differ, nothing else it reads does): kinds of groups, each
    pipeline's least time per groups of each kind (`lower`), and the cover and completion tables
    over states, the groups left of each kind, up to the most any inventory has (see `cover_tables`)."""

    def __init__(self, model: PerfModel, options: list[list[tuple[int, ...]]], total: int, live: list[int]) -> None:
        self.model, self.total, self.live = model, total, live
        self.layers = model.workload.num_layers
        self.virtual = model.options.virtual_stages or 1
        self.sample = options[0]
        self.groups = len(options[0])  # every inventory forms as many groups (maximal groupings)
        self.longest = min(self.layers, self.groups)
        self.splits = {s: _compositions(self.layers, s) for s in range(1, self.longest + 1)}
        per_node = Counter(model.instance.node_of(g[0]) for g in options[0])
        self.most_per_node = max(per_node.values())
        self.representative: dict[str, tuple[int, ...]] = {}
        most: Counter = Counter()  # per device type: the most groups any inventory has of it
        for groups in options:
            here = Counter()
            for group in groups:
                name = model.stage_device(group).name
                self.representative.setdefault(name, group)
                here[name] += 1
            most |= here
        self._kinds(most)
        self.kinds = [[name for name in most if self.kind_of[name] == k] for k in range(len(self.kind_count))]
        # per node: the most groups of each kind it holds in any inventory (a run of stages in one node fits them)
        holds: dict[int, Counter] = {}
        for groups in options:
            here: dict[int, Counter] = {}
            for group in groups:
                kind = self.kind_of[model.stage_device(group).name]
                here.setdefault(model.instance.node_of(group[0]), Counter())[kind] += 1
            for node, counts in here.items():
                holds[node] = holds.get(node, Counter()) | counts
        self.node_kinds = {tuple(counts[k] for k in range(len(self.kind_count))) for counts in holds.values()}
        self._held_runs: dict[tuple[int, ...], bool] = {}  # `_held_in_node`
        self._pair_arrays: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # `_least_times`' (orders, crossed)
        self._closed_cache: dict[tuple, np.ndarray] = {}  # `_pair_closed_forms`
        self.lower: dict[tuple[int, ...], list[float]] = {}
        # split_lower[r, c][v][i, m - 1]: the least time of such a pipeline on the i-th split of its length
        # when no run of its stages in one node is longer than r and it crosses nodes at least c times
        # (`lower_times`)
        self.split_lower: dict[tuple[int, int], dict[tuple[int, ...], np.ndarray]] = {}
        self.cover: list[list[float]] = []
        # prefix_lower[kinds][m]: a floor on the time of every pipeline whose first stages are of these kinds,
        # in this order, running m micro-batches (`_least_times`' closed forms, interleaved ones under interleaving)
        self.prefix_lower: dict[tuple[int, ...], list[float]] = {}
        self.capped: list[list[list[float]]] = []
        self.completion: list[list[list[float]]] = []
        # counted[s][P][state]: with the pipelines counted and each of at least s + 1 stages, when affordable
        self.counted: list[list[list[float]]] = []
        # per P, built on demand (`coupled`): each pipeline priced with its own split's all-reduce and step
        # by (P, longest run, fewest crossings, every ring crossing, forced kinds, least ring, held layer)
        self._coupled: dict[tuple, list[float]] = {}
        # per `coupled` key a deadline cut with every table it reads already built: the seconds it had.
        # `coupled` skips a window no longer (what it computes then is not kept, so it would be cut
        # again; 32-64 seed 285's 56 trees each retried the same reaching tables in a 1 ms window,
        # 0.19 s of their 0.52 s); `_tables_built` tells whether an attempt built one (a retry then
        # starts further on)
        self._cut_within: dict[tuple, float] = {}
        self._tables_built = 0
        # beyond LOWER_SIMULATION_UNITS: the simulation units left to every `lower_times` table (`_least_times`)
        self._simulation_left = [DEEP_SIMULATION_UNITS]
        self._ranges: tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, np.ndarray]] | None = None  # `_range_tables`
        self._grid: tuple[np.ndarray, np.ndarray, np.ndarray, list] | None = None  # `_programme`'s fixed part
        # per ((layers, q), kind): split_lower with q of those layers' stages of another kind (`lower_times`' `pinned`)
        self._held: dict[tuple[tuple[tuple[int, ...], int], int], dict[tuple[int, ...], np.ndarray]] = {}
        self._near: dict[tuple[int, int], dict[tuple[int, ...], np.ndarray]] = {}  # `lower_times`' reach 1
        self._paired: dict[tuple, list[float]] = {}  # `paired_level` by (P, least stages, forced, paired)
        self._move_cache: dict[int, list] = {}  # per least stage count: `counted_table`'s steps (`_moves`)
        self._pairs: dict[tuple[int, int], dict] = {}  # per (runs, least crossings): `lower_times`' pairs
        # per (layers, q): split_lower with the stages of some q of those layers crossing at both ends
        self._isolated: dict[tuple[tuple[tuple[int, ...], int], bool], dict[tuple[int, ...], np.ndarray]] = {}
        # per (layer, kind): split_lower with a send before that layer between two stages of that kind crossing
        self._kept: dict[tuple[int, ...], dict[tuple[int, ...], np.ndarray]] = {}
        # per (runs, least crossings, sends C, sends F): split_lower on the splits sending before C's layers
        # (across nodes) and before none of F's (`lower_times`' `pattern`)
        self._patterned: dict[tuple, dict[tuple[int, ...], np.ndarray]] = {}
        # per P: every split's all-reduce + optimizer step floor (`coupled`), ascending; per (P, U), those of
        # the splits inside U with U's rings (`coupled`'s `union`)
        self.extra_values: dict[int | tuple, list[float]] = {}
        self._extras: dict[tuple, dict[int | None, Any]] = {}  # `_split_extras`
        self.round_steps = 0  # steps of one round of the counted programme (what `coupled` costs per P)
        # counted tables of larger least stage counts than `build` could afford, built on demand (`level`)
        self._levels: dict[int, list[list[float]]] = {}
        self._level_steps = 0  # what they took, within COUNTED_BUDGET
        self.overlapped = bool(model.options.overlap_grad_reduce)
        links = (model.intra, model.inter)
        self.best_link = Link(max(link.bandwidth for link in links), min(link.latency for link in links))
        # per layer, rank: the TP degree searched is the groups' size, not the model's instance's (a search for
        # another degree shares the model: decision.reconfigure_candidate)
        self.grad = (model.workload.params * model.grad_bytes / len(self.sample[0])).tolist()
        # per layer: its least optimizer step over the device types and reliefs (a stage's is a sum),
        # unsharded: a floor for P pipelines divides it by model.optimizer_shards(P) (ZeRO >= 1)
        self.update = [min(model.optimizer_time(group, layer, layer + 1, relief)
                           for group in self.representative.values() for relief in model.relief_options)
                       for layer in range(self.layers)]

    def _kinds(self, per_type: Counter) -> None:
        """Kinds of groups the relaxation counts: one per stage device type when its tables fit
        TYPED_BUDGET, else one for all (every stage then at the fastest type, as many as there are
        groups). A state is the number of groups left of each kind, in mixed radix (`stride`). With
        one per type but more (split, order of kinds) pairs than CROSSING_BUDGET (deep pipelines),
        while KINDS_BUDGET allows, every boundary's send takes its faster link (`free_sends`: no
        crossing is forced, a placement's sends are only slower) instead of merging the kinds: a
        lower bound still, since both only drop constraints, and the device types, not the sends,
        decide the floor at depth (8-24-device seed 4: 76.82 typed with free sends, 68.19 one kind)."""
        names = sorted(per_type)
        self.free_sends = False
        for kinds in ([[name] for name in names], [names]):
            counts = [min(sum(per_type[name] for name in kind), self.groups) for kind in kinds]
            profiles = {s: _profiles(counts, s) for s in range(1, self.longest + 1)}
            states = math.prod(c + 1 for c in counts)
            table = states * sum(map(len, profiles.values())) * self.total ** 2
            placements = sum(len(self.splits[s]) * sum(_multinomial(v) for v in vs) for s, vs in profiles.items())
            if len(kinds) == 1 or (table <= TYPED_BUDGET and placements <= CROSSING_BUDGET):
                break
            if table <= TYPED_BUDGET and placements * self.total * self.longest <= KINDS_BUDGET:
                self.free_sends = True
                break
        self.kind_of = {name: k for k, kind in enumerate(kinds) for name in kind}
        self.table_steps = table // states  # per state: pipelines' kinds x micro-batches^2
        self.kind_count = counts
        self.profiles = profiles
        self.stride = [math.prod(c + 1 for c in counts[k + 1:]) for k in range(len(counts))]

    def state(self, types: list[str]) -> int:
        """The state of these groups (their stage device types)."""
        return sum(self.stride[self.kind_of[name]] for name in types)

    def build(self, deadline: Deadline) -> bool:
        """Fills the tables; False when `deadline` passed first."""
        prefixes: dict[tuple[int, ...], np.ndarray] = {}
        found = self.lower_times(deadline, self.most_per_node, prefixes=prefixes)
        if found is None:
            return False
        lower, self.split_lower[self.most_per_node, 0] = found
        self.prefix_lower = {kinds: [math.inf] + times.tolist() for kinds, times in prefixes.items()}
        self.lower = lower
        self.capped, self.completion = self.cover_tables(lower)
        self.cover = self.capped[self.longest]
        self.round_steps = len(self.cover) * self.table_steps
        steps = self.round_steps * min(self.groups, self.total)  # one counted table: a round per pipeline
        for least in range(1, self.longest + 1):  # least stage count: the first is the plain counted table
            if least * steps > COUNTED_BUDGET or deadline.expired():
                break
            self.counted.append(self.counted_table(lower, least))
        return True

    def level(self, least: int, deadline: Deadline | None = None) -> tuple[list[list[float]], bool]:
        """(table, exact): the counted table of pipelines of at least `least` stages
        (`counted_table`) when built (`build` builds one for every least count in turn while
        affordable; others are built here on demand, given a `deadline`, while their steps, the
        items of at least `least` stages only, stay within a second COUNTED_BUDGET), else the
        largest built below it (a lower table: fewer stages allowed) and False."""
        if least <= len(self.counted):
            return self.counted[least - 1], True
        if least not in self._levels and deadline is not None and not deadline.expired() and self.counted:
            items = sum(len(self.profiles[stages]) for stages in range(least, self.longest + 1))
            cost = self.round_steps * min(self.groups, self.total) * items \
                // max(sum(map(len, self.profiles.values())), 1)
            table = self.counted_table(self.lower, least, None, deadline) \
                if self._level_steps + cost <= COUNTED_BUDGET else None
            if table is not None:
                self._level_steps += cost
                self._levels[least] = table
        if least in self._levels:
            return self._levels[least], True
        below = max((k for k in self._levels if k < least), default=len(self.counted))
        return (self._levels[below] if below in self._levels else self.counted[below - 1]), False

    def paired_level(self, pipelines: int, least: int, deadline: Deadline, forced: tuple[int, int],
                     paired: tuple[int, int], runs: int | None = None) -> list[float] | None:
        """`level(least)`'s row of P pipelines with `forced` = (kind, R): R of them, if of at least s
        stages all of that kind, cross nodes at least c times (`paired` = (c, s); `ExactSearch.paired`).
        Pipeline times alone: the caller adds the ring and step of `least` stages, so a pipeline that
        crosses more cannot buy a smaller ring of its own with a finer split (`coupled` prices each
        pipeline's own ring). `runs`: those pipelines hold no longer run of stages in one node (default:
        a node's groups; `ExactSearch.long_runs`). None beyond COUNTED_BUDGET or past `deadline`."""
        runs = self.most_per_node if runs is None else runs
        key = (pipelines, least, forced, paired) + ((runs,) if runs != self.most_per_node else ())
        if key in self._paired:
            return self._paired[key]
        if deadline.expired() or not self.counted or self.round_steps * pipelines > COUNTED_BUDGET:
            return None
        crossings, stages = paired
        crossing = self._split_times(self.split_lower, (runs, crossings), deadline, runs, crossings)
        if crossing is None:
            return None
        kind, rounds = forced
        mixed = {v: times if v[kind] < sum(v) or sum(v) < stages else [math.inf] + crossing[v].min(axis=0).tolist()
                 for v, times in self.lower.items()}
        table = self.counted_table(self.lower, least, pipelines, deadline, mixed, rounds, last=True)
        if table is None:
            return None
        self._paired[key] = table[pipelines]
        return self._paired[key]

    def shareable(self, first: int, second: int) -> bool:
        """Whether some pipeline can hold these two layers in one stage: a split putting them together
        fits the relaxed memory (`split_lower` finite) for some kinds and micro-batch count."""
        for v, per_split in self.split_lower[self.most_per_node, 0].items():
            b = np.array(self.splits[sum(v)])
            together = (b[:, 1:] > first).argmax(axis=1) == (b[:, 1:] > second).argmax(axis=1)
            if np.isfinite(per_split[together]).any():
                return True
        return False

    def ring_bound(self, pipelines: int, grad_bytes: float) -> float:
        """Least gradient all-reduce of a plan with this many pipelines one of whose stages holds
        `grad_bytes` (a slot reduces its layers over every pipeline's holder of them, and buckets
        only add latency; the fastest link unless no node can hold a slot of every pipeline)."""
        link = self.best_link if pipelines <= self.most_per_node else self.model.inter
        return self.ring_time(grad_bytes, pipelines, link)

    def stage_ring(self, pipelines: int, nbytes: float, crossed: float) -> float:
        """Least all-reduce of a slot holding `nbytes` of gradients, `crossed` of them in layers whose
        rings cross nodes, with this many pipelines. A slot reduces its groups (layers of one replica
        set) one after another (PerfModel.slot_reduce_times), the crossed ones' on the inter-node
        link; the ring time is affine in the bytes with a non-negative constant, so merging the
        groups on each link only lowers it: at least the crossed bytes' ring across plus the rest's on
        `ring_bound`'s link, or, the rest crossing too, all of it across (y bytes more across cost at
        least their time on the faster link, so the least is at one of the two ends)."""
        if crossed <= 0:
            return self.ring_bound(pipelines, nbytes)
        inter = self.model.inter
        link = self.best_link if pipelines <= self.most_per_node else inter
        return min(self.ring_time(crossed, pipelines, inter) + self.ring_time(nbytes - crossed, pipelines, link),
                   self.ring_time(nbytes, pipelines, inter))

    def ring_time(self, nbytes: float, pipelines: int, link: Link) -> float:
        """The least the model charges a slot that reduces `nbytes` of gradients over `pipelines`
        replicas on `link` (PerfModel.slot_reduce_times): the all-reduce, or only its reduce-scatter
        half under overlap_param_gather (the all-gather hides behind the next forward); 0 when the
        reduction overlaps the backward (only its exposed part counts) or under ZeRO-3 (shards reduce
        among fewer copies: no floor kept)."""
        model = self.model
        if pipelines <= 1 or nbytes <= 0 or self.overlapped or model.zero_stage >= 3:
            return 0.0
        reduce = ring_allgather_time if model.overlap_param_gather else ring_allreduce_time
        return reduce(nbytes, pipelines, link)

    def coupled(self, pipelines: int, deadline: Deadline | None, runs: int | None = None, least: int = 0,
                crossing: bool = False, forced: tuple[int, int] = (0, 0), crossed: tuple[int, ...] = (),
                held: tuple[tuple[int, ...], int] | None = None, isolate: tuple[tuple[int, ...], int] | None = None,
                neighbours: int = 0, paired: tuple[int, int] | None = None,
                within: tuple[tuple[int, ...], int, int] | None = None,
                strict: tuple[int, int, int, int] | None = None,
                shortest: int = 1, short_runs: int | None = None, kept: tuple[int, ...] | None = None,
                ring_cap: float | None = None,
                pattern: tuple[tuple[tuple[int, ...], ...], tuple[int, ...], tuple[int, ...]]
                | tuple[tuple[tuple[int, ...], ...], tuple[int, ...], tuple[int, ...], tuple[tuple[int, ...], ...]]
                | None = None,
                reaching: int = 0, union: tuple[int, ...] | None = None,
                whole: tuple[int, ...] | None = None, kind_alone: bool = False) -> list[float] | None:
        """coupled[state]: least makespan of exactly `pipelines` (P) pipelines running the whole
        batch on at most the groups of `state`, each pipeline priced at its time plus the all-reduce
        of P replicas of its own largest stage's gradients plus its own slowest optimizer step, least
        over its splits (`split_lower`). The step of a plan is at least that of each of its
        pipelines: its slowest time, all-reduce and step are at least that pipeline's. The counted
        floor takes the least time, ring and step over splits apart (`ExactSearch.floor`), so a
        split that saves a send (a boundary of no bytes) and another that halves the ring both count
        there; here one split pays for both. A counted programme of P rounds, built on first use
        (the floor asks only for the P that may hold its minimum); None beyond COUNTED_BUDGET,
        past `deadline` or, without one, when not built yet. `runs`: the pipelines' times with no
        run of stages in one node longer than this (default: a node's groups; `lower_times`);
        `least`: every pipeline crosses nodes at least that often; `crossing`: every ring crosses
        nodes (a slot's rings take the inter-node link: at least one ring of all its bytes there, the
        ring time being affine in the bytes with a non-negative constant); `forced`: see
        `counted_table` (with `held`, (layers, q): at least q of the forced pipelines' stages holding
        these layers are of another kind, `lower_times`' `pinned`; with `isolate`, (layers, q): the
        stages holding some q of these layers cross nodes at both their boundaries; with `neighbours`
        r, one layer: that stage crosses nodes at every boundary it has (r = 1) or at one at least (r =
        2), or it or one next to it is of another kind than `kind`, the lesser; with `paired` (c, s): a
        pipeline of at least s stages all of kind `kind` crosses nodes at least c times,
        `ExactSearch.paired`; with `within` (layers, t, u): every pipeline holds these layers on at
        most t stages, the forced ones on at most u, and with `strict` (r, kind k, q, w) the first r
        forced ones on at most w stages, at least q of them of another kind than k,
        `ExactSearch.single`); `crossed`: these layers' rings cross nodes (a slot holding some of them
        rings at least their bytes on the inter-node link, as with `crossing`: `stage_ring`);
        `shortest`: every pipeline has at least that many stages; `short_runs` r: the forced pipelines, if
        all of kind `kind`, hold no run of more than r stages in one node (`ExactSearch.long_runs`);
        `kept` (layer l, the forced kind), or (l, a, b): a forced pipeline whose stages on both sides of the send
        before l are of that kind (of kinds a and b) crosses nodes there (`lower_times`' `boundary`, `ExactSearch.boundaries`);
        `ring_cap` E: each pipeline priced at its time alone, on the splits whose all-reduce and step are at
        most E (`ExactSearch.thresholds`).
        The all-reduce + step values of P's splits are kept (`extra_values`, the rings as unconstrained, or
        with `crossed` and `union` as given: `values_key`).
        `pattern` (C, F, G) or (C, F, G, H): every pipeline sends before some layer of each group of C, across nodes,
        and before none of F; given G, the `forced` ones (any kind) before none of G either (`ExactSearch.spans`), and
        given H, they send across nodes before some layer of each group of H too; with `kind_alone` only the
        forced ones whose every stage is of kind `kind` are held to G and H, the others priced as any
        (`ExactSearch._node_runs`); else they are priced as `held` says. `reaching` S: the forced pipelines (any kind) have at least S stages each
        (`ExactSearch.reaching`). `union` U: every pipeline's boundaries (the layers its stages start at,
        but 0) lie in U, and a stage reduces one group per run of its layers between U's boundaries
        (`ExactSearch.union_rings`), a run with a `crossed` layer across nodes (its holders are that
        layer's: no pipeline splits the run); not with `crossing`. `whole` u (groups per kind): the forced
        pipelines that take at least u[k] groups of every kind k cross nodes at least once
        (`ExactSearch.whole_nodes`)."""
        runs = self.most_per_node if runs is None else runs
        key = (pipelines, runs, least, crossing, forced, crossed, held, isolate, neighbours, paired, within, strict,
               shortest, short_runs, kept, ring_cap, pattern) + ((reaching,) if reaching else ()) \
            + ((union,) if union is not None else ()) + ((whole,) if whole is not None else ()) \
            + (("kind_alone",) if kind_alone else ())
        if key in self._coupled:
            return self._coupled[key]
        if deadline is None or deadline.expired() or not self.counted or self.round_steps * pipelines > COUNTED_BUDGET \
                or deadline.left() <= self._cut_within.get(key, 0.0):
            return None
        window, built = deadline.left(), self._tables_built
        if self._split_times(self.split_lower, (runs, least), deadline, runs, least) is None:
            return None
        extras = self._split_extras(pipelines, crossing, crossed, union, within)
        if not crossing:
            self.extra_values[self.values_key(pipelines, union, crossed)] = extras[None]
        kind, rounds = forced
        forcing = None
        if rounds and paired is not None and \
                self._split_times(self.split_lower, (runs, paired[0]), deadline, runs, paired[0]) is None:
            return None
        if rounds and short_runs is not None and \
                self._split_times(self.split_lower, (short_runs, 0), deadline, short_runs) is None:
            return None
        if rounds and whole is not None and self._split_times(self.split_lower, (runs, 1), deadline, runs, 1) is None:
            return None
        node_runs = self.most_per_node
        if rounds and held is not None:
            forcing = self._split_times(self._held, (held, kind), deadline, node_runs, pinned=(held[0], kind, held[1]))
            if forcing is None:
                return None
        elif rounds and kept is not None:
            forcing = self._split_times(self._kept, kept, deadline, node_runs, boundary=kept)
            if forcing is None:
                return None
        elif rounds and isolate is not None:
            sided = neighbours == 2
            forcing = self._split_times(self._isolated, (isolate, sided), deadline, node_runs, isolate=isolate,
                                        sided=sided)
            if forcing is None:
                return None
            if neighbours:  # or the stage holding the layer, or one next to it, of another kind: the lesser
                near = (isolate[0][0], kind)
                nearby = self._split_times(self._near, near, deadline, node_runs, pinned=((near[0],), kind, 1), reach=1)
                if nearby is None:
                    return None
                forcing = {v: np.minimum(times, nearby[v]) for v, times in forcing.items()}
        pinned: dict[tuple[int, ...], np.ndarray] = {}
        if rounds and within is not None and strict is not None:
            found = self._split_times(self._held, ((within[0], strict[2]), strict[1]), deadline, node_runs,
                                      pinned=(within[0], strict[1], strict[2]))
            if found is None:
                return None
            pinned = found
        source, alternative = self.split_lower[runs, least], None
        if pattern is not None:  # the splits with those sends (across) and without those
            sends, barred, alone, *rest = pattern
            across = rest[0] if rest else ()  # the forced ones' sends across nodes, as C's
            source = self._patterned_times(runs, least, sends, barred, deadline)
            if rounds and (alone or across) and source is not None:
                alternative = self._patterned_times(runs, least, tuple(sorted(sends + across)), barred + alone,
                                                    deadline)
            if source is None or (rounds and (alone or across) and alternative is None):
                return None
        # per kinds of a pipeline: by m, its least time + ring + step over its splits
        priced, mixed, stricter = {}, {}, {}
        for v, per_split in source.items():
            rings, update, holding = extras[sum(v)]
            extra = (rings + update)[:, None]
            if ring_cap is not None:  # the splits within the cap, at their time alone (inf: outside `union`)
                extra = np.where((extra <= ring_cap) & (extra < np.inf), 0.0, np.inf)
            if within is not None:  # `within`'s layers on at most t stages (u forced, w strict), of any kind
                barred = {most: np.where(holding <= most, 0.0, np.inf) for most in (within[1], within[2])
                          + ((strict[3],) if strict is not None else ())}
                priced[v] = [math.inf] + (per_split + extra + barred[within[1]]).min(axis=0).tolist()
                mixed[v] = [math.inf] + (per_split + extra + barred[within[2]]).min(axis=0).tolist()
                if strict is not None:  # and q of them of another kind
                    stricter[v] = [math.inf] + (np.maximum(per_split, pinned[v]) + extra + barred[strict[3]]
                                                ).min(axis=0).tolist()
                continue
            priced[v] = [math.inf] + (per_split + extra).min(axis=0).tolist()
            if alternative is not None and kind_alone and v[kind] < sum(v):  # not all of kind `kind`: free
                mixed[v] = priced[v]
            elif alternative is not None:  # `pattern`'s forced pipelines: none of G's sends either
                mixed[v] = [math.inf] + (alternative[v] + extra).min(axis=0).tolist()
            elif forcing is not None:  # the held layer's stage of another kind than `kind`, or isolated stages
                mixed[v] = [math.inf] + (np.maximum(per_split, forcing[v]) + extra).min(axis=0).tolist()
            elif paired is not None:  # all of kind `kind` and at least s stages: at least c crossings
                crossings, stages = paired
                mixed[v] = priced[v] if v[kind] < sum(v) or sum(v) < stages else \
                    [math.inf] + (self.split_lower[runs, crossings][v] + extra).min(axis=0).tolist()
            elif reaching:  # at least S stages, of any kinds
                mixed[v] = priced[v] if sum(v) >= reaching else [math.inf] * (self.total + 1)
            elif short_runs is not None:  # all of kind `kind`: no run longer than r stages in one node
                mixed[v] = priced[v] if v[kind] < sum(v) else \
                    [math.inf] + (self.split_lower[short_runs, 0][v] + extra).min(axis=0).tolist()
            elif whole is not None:  # at least u[k] groups of each kind k: at least one crossing
                mixed[v] = priced[v] if any(have < need for have, need in zip(v, whole)) else \
                    [math.inf] + (self.split_lower[runs, 1][v] + extra).min(axis=0).tolist()
            else:  # some stage of another kind
                mixed[v] = priced[v] if v[kind] < sum(v) else [math.inf] * (self.total + 1)
        table = self.counted_table(priced, shortest, pipelines, deadline, mixed, rounds,
                                   (stricter, strict[0]) if stricter else None, last=True)
        if table is None:
            if self._tables_built == built:
                self._cut_within[key] = window
            return None
        self._coupled[key] = table[pipelines]
        return self._coupled[key]

    def _split_extras(self, pipelines: int, crossing: bool, crossed: tuple[int, ...], union: tuple[int, ...] | None,
                      within: tuple[tuple[int, ...], int, int] | None) -> dict[int | None, Any]:
        """`coupled`'s per stage count (its slowest stage's all-reduce, its slowest stage's step, per split
        how many stages hold `within`'s layers (0: no constraint)) per split, and under None the sorted
        finite all-reduce + step values (`extra_values`). Memoised on every argument they read (the
        gradient and step tables, splits and links are fixed): `coupled` is asked for hundreds of
        keys that differ only in what prices its pipelines, 0.4 ms a build. Read-only arrays."""
        key = (pipelines, crossing, crossed, union, within)
        found = self._extras.get(key)
        if found is not None:
            return found
        update_prefix = np.concatenate([[0.0], np.cumsum(self.update)])
        # ring[first, end]: the least all-reduce of a stage holding layers first..end - 1 (`stage_ring`)
        ring = np.zeros((self.layers + 1, self.layers + 1))
        for first in range(self.layers):
            for end in range(first + 1, self.layers + 1):
                nbytes = sum(self.grad[first:end])
                across = sum(self.grad[layer] for layer in crossed if first <= layer < end)
                ring[first, end] = self.ring_time(nbytes, pipelines, self.model.inter) if crossing else \
                    self.stage_ring(pipelines, nbytes, across)
                if union is not None:  # one ring per run of the stage's layers between U's boundaries
                    cuts = [first] + [layer for layer in union if first < layer < end] + [end]
                    ring[first, end] = sum(self.stage_ring(pipelines, sum(self.grad[a:b]),
                                                           sum(self.grad[layer] for layer in crossed if a <= layer < b))
                                           for a, b in zip(cuts, cuts[1:]))
        extras: dict[int | None, Any] = {}
        for stages, splits in self.splits.items():
            b = np.array(splits)
            update = (update_prefix[b[:, 1:]] - update_prefix[b[:, :-1]]).max(axis=1)
            rings = ring[b[:, :-1], b[:, 1:]].max(axis=1)
            if union is not None:  # the splits whose boundaries all lie in U
                rings = np.where(_member(b[:, 1:-1], union).all(axis=1), rings, np.inf)
            # per split: how many stages hold `within`'s layers (0: no constraint)
            holding = np.zeros(len(splits), dtype=int)
            if within is not None:
                held_by = np.sort(np.stack([(b[:, 1:] > layer).argmax(axis=1) for layer in within[0]], axis=1), axis=1)
                holding = 1 + (np.diff(held_by, axis=1) > 0).sum(axis=1)
            found_here = (rings, update / self.model.optimizer_shards(pipelines), holding[:, None])
            for array in found_here:
                array.flags.writeable = False
            extras[stages] = found_here
        extras[None] = sorted({float(x) for rings, update, _ in (extras[s] for s in self.splits)
                               for x in rings + update if x < math.inf})
        self._extras[key] = extras
        return extras

    @staticmethod
    def values_key(pipelines: int, union: tuple[int, ...] | None, crossed: tuple[int, ...] = ()) -> int | tuple:
        """`extra_values`' key: P alone without `union` and `crossed` rings."""
        if crossed:
            return pipelines, union, crossed
        return pipelines if union is None else (pipelines, union)

    def _patterned_times(self, runs: int, least: int, sends: tuple[tuple[int, ...], ...], barred: tuple[int, ...],
                         deadline: Deadline) -> dict[tuple[int, ...], np.ndarray] | None:
        """`lower_times`' per-split table under `pattern` (sends, barred); without sends, the
        unconstrained table with the barred splits masked (a split's floor does not depend on the
        others), a numpy pass instead of a build."""
        key = (runs, least, sends, barred)
        if sends:
            return self._split_times(self._patterned, key, deadline, runs, least, pattern=(sends, barred))
        if key not in self._patterned:
            masked = {}
            for v, per_split in self.split_lower[runs, least].items():
                inner = np.array(self.splits[sum(v)])[:, 1:-1]
                masked[v] = np.where(_member(inner, barred).any(axis=1)[:, None], np.inf, per_split)
            self._patterned[key] = masked
        return self._patterned[key]

    def _split_times(self, cache: dict[Any, dict[tuple[int, ...], np.ndarray]], key: Any, deadline: Deadline,
                     runs: int, least: int = 0, **options: Any) -> dict[tuple[int, ...], np.ndarray] | None:
        """`lower_times`' per-split table for these arguments, built once into `cache[key]`; None when
        `deadline` stopped it (the callers' tables are then not built either)."""
        if key not in cache and self.free_sends and cache is self.split_lower and not options \
                and (self.most_per_node, 0) in cache:  # no crossings: every (runs, least) has the build's pairs
            cache[key] = cache[self.most_per_node, 0]
        if key not in cache:
            found = self.lower_times(deadline, runs, least, **options)
            if found is None:
                return None
            cache[key] = found[1]
            self._tables_built += 1
        return cache[key]

    def lower_times(self, deadline: Deadline, runs: int, least: int = 0,
                    pinned: tuple[tuple[int, ...], int, int] | None = None,
                    isolate: tuple[tuple[int, ...], int] | None = None, reach: int = 0, sided: bool = False,
                    prefixes: dict[tuple[int, ...], np.ndarray] | None = None,
                    boundary: tuple[int, ...] | None = None,
                    pattern: tuple[tuple[tuple[int, ...], ...], tuple[int, ...]] | None = None
                    ) -> tuple[dict[tuple[int, ...], list[float]], dict[tuple[int, ...], np.ndarray]] | None:
        """(lower, split_lower): lower[v][m], a lower bound on the schedule time of every pipeline
        whose stages take v[k] groups of each kind k, running m micro-batches, and split_lower[v][i,
        m - 1] the same on its i-th split only (`_least_times`; None past `deadline`). Each stage
        range takes its fastest forward and backward over its kind's device types and the supported
        reliefs, for every order of the kinds along the pipeline; each boundary its send on the
        faster link, except that a pipeline longer than `runs` (a node's groups, or fewer where the
        floor knows more) crosses nodes so that no run of stages between crossings is longer
        (`_crossing_sets`: every minimal such choice is tried; with at least `least` crossings,
        so shorter pipelines cannot run: inf). The time of
        those operations, minimised over the layer splits and orders, is the exact 1F1B longest path
        (monotone in every operation) when that is affordable (LOWER_SIMULATION_UNITS), else the
        per-stage bounds of `one_f_one_b_floors` (plain 1F1B; interleaved: T >= W + (m - 1) b_s +
        max(m - 1 - k_s, 0) f_s); that bound also skips the simulations that cannot lower the minimum.
        A split counts only where every stage fits the relaxed memory (MemoryRelaxation) of its kind's
        device types with the micro-batches 1F1B holds in flight there: inf where none does. `pinned` (layers L, kind k, q):
        only orders in which at least q of the stages holding L's layers (distinct stages: one holding
        two of them counts once) are of another kind than k count, by the closed form alone (with
        `reach` r, one layer: some stage within r of it is).
        `isolate` (layers, q): the stages holding some q of these layers each cross nodes at both
        their boundaries (every crossing set with those boundaries added: a placement's crossings
        hold a minimal set and those, and sends only grow with crossings), simulated while the
        simulations of every choice of q stay within ISOLATED_SIMULATION_UNITS, else by the closed form;
        `sided`: each at one of its boundaries at least (the least over the sides; a first or last
        stage's outer side is no boundary, so it is not constrained). `prefixes`: filled by
        `_least_times` (unpinned, not isolated only). `boundary` (layer l, kind k): where a split sends
        before l between two stages of kind k, that send crosses nodes (`_kept_times`). `pattern` (C, F):
        only the splits with a send before some layer of each group of C, across nodes (the least
        over the choices), and before none of F count."""
        fastest, inter, cheap, split_fits = self._range_tables()
        # per kinds of a pipeline: the (crossings, order of kinds) tried, kept as built (the deadline is read
        # before each kinds': 24-32-device deep seed 51 spent 0.3 s of a 1 s search here before its first
        # check, and a call cut here resumes where it stopped); with free sends (no crossings) every
        # (runs, least) shares one dict
        if self.free_sends and self._pairs:
            pairs = self._pairs.setdefault((runs, least), next(iter(self._pairs.values())))
        else:
            pairs = self._pairs.setdefault((runs, least), {})
        for stages, splits in self.splits.items():
            crossings = None
            for v in self.profiles[stages]:
                if v in pairs:
                    continue
                if prefixes is None and deadline.expired():  # the build's table finishes (below)
                    return None
                orders = _orders(v)
                if self.free_sends:  # every send cheap, for every (runs, least)
                    pairs[v] = [((), order) for order in orders]
                    continue
                crossings = _crossing_sets(stages, runs, least) if crossings is None else crossings
                if len(crossings) * len(splits) > CROSSING_BUDGET:  # every send cheap
                    pairs[v] = [((), order) for order in orders]
                elif 2 ** (stages - 1) * len(splits) > CROSSING_BUDGET:  # a node's groups, any kinds
                    pairs[v] = [(crossing, order) for crossing in crossings for order in orders]
                else:  # each run of stages within one node's groups of each kind
                    pairs[v] = self._placements(stages, runs, least, orders)
        units = sum(len(splits) * sum(len(pairs[v]) for v in self.profiles[s]) * s * m
                    for s, splits in self.splits.items() for m in range(1, self.total + 1))
        simulate = self.virtual > 1 or units <= LOWER_SIMULATION_UNITS
        lower: dict[tuple[int, ...], list[float]] = {}
        split_lower: dict[tuple[int, ...], np.ndarray] = {}
        for stages, splits in self.splits.items():
            if deadline.expired():
                return None
            b = np.array(splits)
            ranges = fastest[:, b[:, :-1], b[:, 1:]]  # (kinds, splits, stages, forward/backward)
            fits = split_fits[stages]
            for k, profile in enumerate(self.profiles[stages]):
                if k and prefixes is None and deadline.expired():  # a floor's kinds table (deep: up to seconds
                    return None  # per length); the build's (`prefixes`), which every floor needs, finishes its length
                if not pairs[profile]:  # it must cross that often and cannot, or its kinds fit no runs
                    lower[profile] = [math.inf] * (self.total + 1)
                    split_lower[profile] = np.full((len(splits), self.total), np.inf)
                    continue
                if isolate is not None:  # per q of the layers: their stages cross at both boundaries
                    per_split = np.full((len(splits), self.total), np.inf)
                    # simulated where affordable for every choice: the closed form can miss the sends
                    # (32-64 seed 0: two 100 MB sends across nodes, 30.038 closed, 30.1275 with none)
                    sides = [(0,), (1,)] if sided else [(0, 1)]  # the boundaries before / after it to cross
                    choices = [(chosen, each) for chosen in itertools.combinations(isolate[0], isolate[1])
                               for each in itertools.product(sides, repeat=isolate[1])]
                    exact = simulate and len(choices) * units <= ISOLATED_SIMULATION_UNITS
                    tried, rows = pairs[profile], np.arange(len(splits))
                    holder = {layer: (b[:, 1:] > layer).argmax(axis=1) for layer in isolate[0]}  # its stage, per split
                    # the choices' closed forms in batches (a candidate's row reads its own pair and split
                    # alone): the least over them, or each choice's own rows simulated; the deadline is
                    # read between batches (24-32-device deep seed 4: 330 choices of 4 of 11 layers, 1.3 s
                    # in one call, 0.9 s past its share)
                    batch = max(1, ISOLATED_BATCH_ELEMENTS // (len(tried) * len(splits) * self.total))
                    for first in range(0, len(choices), batch):
                        if first and deadline.expired():
                            return None
                        crossings = []
                        for chosen, each in choices[first:first + batch]:
                            alone = np.zeros((len(splits), stages + 1), dtype=bool)  # boundary t: before stage t
                            for layer, offsets in zip(chosen, each):
                                for offset in offsets:
                                    alone[rows, holder[layer] + offset] = True
                            crossings.append(alone[:, 1:-1])
                        copies = len(crossings)
                        forms = self._closed_forms(
                            np.tile(ranges, (1, copies, 1, 1)), np.tile(fits, (1, copies, 1, 1)), np.tile(b, (copies, 1)),
                            tried, cheap, inter, np.concatenate(crossings))
                        if not exact:
                            per_split = np.minimum(per_split, forms[0].reshape(
                                len(tried), copies, len(splits), self.total).min(axis=(0, 1)))
                            continue
                        closed, fit, forward, backward, bare = forms
                        for c in range(copies):
                            own = tuple(_choice_rows(array, len(tried), copies, len(splits), c)
                                        for array in (closed, fit, forward, backward))
                            bare_own = None if bare is None else \
                                tuple(_choice_rows(array, len(tried), copies, len(splits), c) for array in bare)
                            per_split = np.minimum(per_split, self._least_times(
                                ranges, fits, b, tried, cheap, inter, True, crossings[c], forms=own + (bare_own,))[1])
                    best = np.concatenate([[np.inf], per_split.min(axis=0)])
                elif boundary is not None:
                    per_split = self._kept_times(ranges, fits, b, pairs[profile], cheap, inter, boundary)
                    best = np.concatenate([[np.inf], per_split.min(axis=0)])
                elif pattern is not None:  # per choice of one send of each group: the splits with those, across
                    inner = b[:, 1:-1]
                    free = ~_member(inner, pattern[1]).any(axis=1)
                    per_split = np.full((len(splits), self.total), np.inf)
                    # every choice's splits in one call (a split's floor reads its own row alone), each row
                    # then lowered by its own choices' floors
                    rows, crossing = [], []
                    for chosen in itertools.product(*pattern[0]):
                        sends = _member(inner, chosen)  # (split, boundary): a send before a chosen layer
                        picked = np.flatnonzero((sends.sum(axis=1) == len(set(chosen))) & free)
                        rows.append(picked)
                        crossing.append(sends[picked])
                    picked = np.concatenate(rows) if rows else np.zeros(0, dtype=int)
                    if picked.size:
                        np.minimum.at(per_split, picked, self._least_times(
                            ranges[:, picked], fits[:, picked], b[picked], pairs[profile], cheap, inter, False,
                            np.concatenate(crossing))[1])
                    best = np.concatenate([[np.inf], per_split.min(axis=0)])
                elif pinned is None:
                    best, per_split = self._least_times(ranges, fits, b, pairs[profile], cheap, inter, True,
                                                        prefixes=prefixes, allowance=None if simulate else self._simulation_left)
                else:  # per set of stages holding the layers: the splits where they do, the orders allowed there
                    layers, kind, least_other = pinned
                    per_split = np.full((len(splits), self.total), np.inf)
                    # the stages holding the layers on each split, as a sorted set (a stage may hold several)
                    holding = [tuple(sorted(set(row))) for row in
                               np.stack([(b[:, 1:] > layer).argmax(axis=1) for layer in layers], axis=1).tolist()]
                    for held_by in sorted(set(holding)):
                        near = [range(max(t - reach, 0), min(t + reach, stages - 1) + 1) for t in held_by]
                        allowed = [i for i, pair in enumerate(pairs[profile])
                                   if sum(any(pair[1][u] != kind for u in span) for span in near) >= least_other]
                        rows = np.flatnonzero([stages_of == held_by for stages_of in holding])
                        if allowed and rows.size:  # the least closed form of the allowed orders on those splits
                            closed = self._pair_closed_forms(runs, least, profile, ranges, fits, b, pairs[profile],
                                                             cheap, inter)
                            per_split[rows] = closed[allowed][:, rows].min(axis=0)
                    best = np.concatenate([[np.inf], per_split.min(axis=0)])
                lower[profile] = best.tolist()
                split_lower[profile] = per_split
        return lower, split_lower

    def _range_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        """What every `lower_times` call reads and none of its arguments changes, built on the first
        (a fifth of its time where the floors build dozens of tables: 32-64 seed 324 builds 71):
        fastest[kind, first, end], the least (forward, backward) of a stage holding layers first..end - 1
        over the kind's device types and the reliefs; the send before each layer across nodes and on
        the cheaper link; and per stage count fits[kind, split, stage, m - 1], whether that stage fits
        the relaxed memory (MemoryRelaxation) of the kind's device types with the micro-batches 1F1B
        holds in flight there."""
        if self._ranges is not None:
            return self._ranges
        model = self.model
        fastest = np.full((len(self.kind_count), self.layers + 1, self.layers + 1, 2), np.inf)
        for name, group in self.representative.items():
            kind = self.kind_of[name]
            for first in range(self.layers):
                for end in range(first + 1, self.layers + 1):
                    times = [model.stage_times(group, first, end, r)[:2] for r in model.relief_options]
                    fastest[kind, first, end] = np.minimum(fastest[kind, first, end],
                                                           (min(t[0] for t in times), min(t[1] for t in times)))
        inter = np.array([model.boundary_send_on(model.inter, layer) for layer in range(self.layers)])
        intra = np.array([model.boundary_send_on(model.intra, layer) for layer in range(self.layers)])
        names = model.instance.device_types
        memories = [MemoryRelaxation(model, self.sample, self.total, [d for d in self.live if names[d].name in kind])
                    for kind in self.kinds]
        split_fits = {}
        for stages, splits in self.splits.items():
            b = np.array(splits)
            fits = np.zeros((len(self.kinds), len(splits), stages, self.total), dtype=bool)
            for k, memory in enumerate(memories):
                for s in range(stages):
                    for m in range(1, self.total + 1):
                        held = in_flight_micro_batches(s, stages, m, 0.0, self.virtual)
                        fits[k, :, s, m - 1] = memory.needs(b[:, s], b[:, s + 1], held) <= memory.budget
            split_fits[stages] = fits
        self._ranges = fastest, inter, np.minimum(intra, inter), split_fits
        return self._ranges

    def _kept_times(self, ranges: np.ndarray, fits: np.ndarray, b: np.ndarray,
                    pairs: list[tuple[tuple[int, ...], tuple[int, ...]]], cheap: np.ndarray, inter: np.ndarray,
                    boundary: tuple[int, int]) -> np.ndarray:
        """per_split[i, m - 1]: `_least_times`' floor on split i where, if the split sends before layer
        l (`boundary` (l, k), or (l, a, b)) between two stages of kind k (of kinds a and b, in either
        order), that send crosses nodes: per position t of
        that send, the orders with kind k on stages t and t + 1 take the crossing (added to their
        minimal sets: sends only grow), the others and the splits with no send there are as before;
        by the closed form alone (tables per layer and kind: simulating them cost more than it raised)."""
        layer, *kinds = boundary
        ends = sorted(kinds * 2 if len(kinds) == 1 else kinds)
        stages = b.shape[1] - 1
        per_split = np.full((len(b), self.total), np.inf)
        inner = b[:, 1:-1] == layer  # (split, boundary): the send before `layer`
        at = np.where(inner.any(axis=1), inner.argmax(axis=1), -1) if stages > 1 else np.full(len(b), -1)
        for t in sorted(set(at.tolist())):
            rows = np.flatnonzero(at == t)
            kept = [pair for pair in pairs if t >= 0 and sorted(pair[1][t:t + 2]) == ends]
            rest = [pair for pair in pairs if pair not in kept]
            found = per_split[rows]
            if kept:
                crossing = np.zeros((len(rows), stages - 1), dtype=bool)
                crossing[:, t] = True
                found = np.minimum(found, self._least_times(ranges[:, rows], fits[:, rows], b[rows], kept, cheap,
                                                            inter, False, crossing)[1])
            if rest:
                found = np.minimum(found, self._least_times(ranges[:, rows], fits[:, rows], b[rows], rest, cheap,
                                                            inter, False)[1])
            per_split[rows] = found
        return per_split

    def _placements(self, stages: int, runs: int, least: int, orders: list[tuple[int, ...]]
                    ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """(crossing boundaries, order of kinds) of a pipeline of `stages` stages: for each order,
        the minimal sets of at least `least` crossings whose runs of stages (in one node) are at
        most `runs` long and each within one node's groups of each kind (`node_kinds`); sends only
        grow with crossings. 32-64-device seed 13: nodes of at most two fast groups, so a four-stage
        fast pipeline crosses between its second and third stages, not at its free boundary."""
        sets, bounds = [], []  # each set of crossings with its runs of stages (start, end), each in one node
        for count in range(least, stages):
            for chosen in itertools.combinations(range(stages - 1), count):
                cuts = list(zip((0,) + tuple(c + 1 for c in chosen), tuple(c + 1 for c in chosen) + (stages,)))
                if all(end - start <= runs for start, end in cuts):
                    sets.append(chosen)
                    bounds.append(cuts)
        found = []
        for order in orders:
            held_in_node: dict[tuple[int, int], bool] = {}  # (start, end): one node's groups hold that run

            def fits(start: int, end: int) -> bool:
                if (start, end) not in held_in_node:
                    held_in_node[start, end] = self._held_in_node(tuple(sorted(order[start:end])))
                return held_in_node[start, end]
            valid = [chosen for chosen, cuts in zip(sets, bounds) if all(fits(start, end) for start, end in cuts)]
            # minimal: with no valid set one crossing short (the valid sets are closed upwards within `sets`:
            # a crossing added splits a run into shorter ones, each within its node's groups too, so a valid
            # proper subset would leave one such set valid)
            held = set(valid)
            found += [(chosen, order) for chosen in valid
                      if not any(chosen[:i] + chosen[i + 1:] in held for i in range(len(chosen)))]
        return found

    def _held_in_node(self, kinds: tuple[int, ...]) -> bool:
        """Whether one node's groups hold a run of stages of these kinds (a sorted multiset; memoised:
        `_placements` asks the same runs for every order and every (runs, least))."""
        found = self._held_runs.get(kinds)
        if found is None:
            counts = Counter(kinds)
            found = self._held_runs[kinds] = any(all(n <= held[k] for k, n in counts.items())
                                                 for held in self.node_kinds)
        return found

    def _least_times(self, ranges: np.ndarray, fits: np.ndarray, b: np.ndarray,
                     pairs: list[tuple[tuple[int, ...], tuple[int, ...]]], cheap: np.ndarray, inter: np.ndarray,
                     simulate: bool, crossing: np.ndarray | None = None,
                     prefixes: dict[tuple[int, ...], np.ndarray] | None = None,
                     forms: tuple | None = None, allowance: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(best, per_split): best[m], the least time of m micro-batches over every split (`b`),
        crossing choice and order of kinds, with each stage's range times per kind (`ranges`) and
        whether it fits in memory with m micro-batches (`fits`: kind, split, stage, m - 1); and
        per_split[i, m - 1], a lower bound on that time on split i alone (its candidates' least
        closed form, and never below best[m]: no extra simulation). The closed-form bound of
        every candidate comes first (numpy; under interleaving `interleaved_closed`); the simulation
        then visits candidates by it, skipping those whose bound cannot lower the minimum.
        `crossing` (split, boundary): boundaries that also cross nodes on that split.
        `prefixes`: per leading kinds of the orders tried (every length), lowered to
        the least closed form by m - 1 of the candidates whose order starts with them. Each closed form
        is at most its candidate's time (1F1B: the longest path passes through those operations;
        interleaved: `interleaved_closed`), and
        the candidates of an order cover every split and node placement, so a pipeline whose first
        stages are of those kinds takes at least that long, whatever its further stages. `forms`: these
        arguments' `_closed_forms`, when the caller computed them (a batch of several calls' candidates).
        `allowance` (one-item list, spent in place): stage x micro-batch operations left to simulate;
        then each count's candidates go best first by closed form, and once it is spent the least closed
        form not simulated stands for the rest (each is at least its own closed form); None: no cap."""
        stages, total = b.shape[1] - 1, self.total
        closed, fit, forward, backward, bare = forms if forms is not None else \
            self._closed_forms(ranges, fits, b, pairs, cheap, inter, crossing)
        per_split = closed.reshape(-1, len(b), total).min(axis=0)  # candidates come in blocks of every split
        if prefixes is not None:
            for (_, order), times in zip(pairs, closed.reshape(len(pairs), len(b), total).min(axis=1)):
                for k in range(1, stages + 1):
                    known = prefixes.get(order[:k])
                    prefixes[order[:k]] = times if known is None else np.minimum(known, times)
        best = np.full(total + 1, np.inf)
        if not simulate:
            best[1:] = closed.min(axis=0)
            return best, per_split

        def simulated(k: int, m: int) -> float:
            """Candidate k's exact 1F1B time with m micro-batches."""
            if bare is None:
                ops = [_Ops(forward[k, s], backward[k, s]) for s in range(stages)]
            else:
                ops = [_Ops(bare[0][k, s], bare[1][k, s], forward[k, s] - bare[0][k, s],
                            backward[k, s] - bare[1][k, s]) for s in range(stages)]
            return self.model.pipeline_time(ops, m, self.virtual)
        if allowance is None:
            whole = forward.sum(axis=1) + backward.sum(axis=1)  # W per candidate
            for k in np.argsort(whole, kind="stable"):  # the least work first: low minima early
                for m in range(1, total + 1):
                    if fit[k, m - 1] and closed[k, m - 1] < best[m]:  # else no plan, or at least the closed form
                        best[m] = min(best[m], simulated(k, m))
            return best, np.maximum(per_split, best[1:])
        for m in range(1, total + 1):  # best first by closed form: the fewest simulations that settle the least
            for k in np.argsort(closed[:, m - 1], kind="stable").tolist():
                if closed[k, m - 1] >= best[m]:
                    break  # this candidate and every later one take at least their closed form
                if allowance[0] < stages * m:
                    best[m] = closed[k, m - 1]  # unsimulated: this candidate and every later one take at least this
                    break
                allowance[0] -= stages * m
                best[m] = min(best[m], simulated(k, m))
        return best, np.maximum(per_split, best[1:])

    def shape_floors(self, shape: tuple[tuple[str, ...], tuple[bool, ...]]) -> np.ndarray:
        """floors[i]: a lower bound on the 1F1B time of a pipeline of this shape (stage device types,
        whether each boundary crosses nodes) on the i-th split of its length with any micro-batch
        count, inf where no count fits the relaxed memory: each count's closed form (`_closed_forms`:
        each stage at its type's fastest range times, each send on its own link or the cheaper one)
        is at most its time, so a split whose least floor meets the incumbent has no count that
        could beat it. All zeros where the relaxation has no table for that length."""
        stages = len(shape[0])
        fastest, inter, cheap, split_fits = self._range_tables()
        if stages not in split_fits:
            return np.zeros(len(_compositions(self.layers, stages)))
        b = np.array(self.splits[stages])
        order = tuple(self.kind_of[name] for name in shape[0])
        crossed = tuple(boundary for boundary, across in enumerate(shape[1]) if across)
        closed = self._closed_forms(fastest[:, b[:, :-1], b[:, 1:]], split_fits[stages], b, [(crossed, order)],
                                    cheap, inter)[0]
        return closed.min(axis=1)

    def _pair_closed_forms(self, runs: int, least: int, profile: tuple[int, ...], ranges: np.ndarray,
                           fits: np.ndarray, b: np.ndarray, pairs: list[tuple[tuple[int, ...], tuple[int, ...]]],
                           cheap: np.ndarray, inter: np.ndarray) -> np.ndarray:
        """closed[pair, split, m - 1]: `_closed_forms` of every pair of `pairs` (those of (runs, least) for
        `profile`) on every split of its length, no extra crossings; memoised on (runs, least, profile),
        which fix all of them (`lower_times`' pinned tables read their orders' rows: dozens of tables
        per (runs, least), each a call per set of holding stages before)."""
        key = (runs, least, profile)
        found = self._closed_cache.get(key)
        if found is None:
            found = self._closed_forms(ranges, fits, b, pairs, cheap, inter)[0].reshape(len(pairs), len(b), self.total)
            found.flags.writeable = False
            self._closed_cache[key] = found
        return found

    def _closed_forms(self, ranges: np.ndarray, fits: np.ndarray, b: np.ndarray,
                      pairs: list[tuple[tuple[int, ...], tuple[int, ...]]], cheap: np.ndarray, inter: np.ndarray,
                      crossing: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """`_least_times`' candidates (pair-major, then split, as its arguments say): (closed, fit,
        forward, backward, bare), closed[c, m - 1] the closed form of candidate c (inf where it does not
        fit in memory with m micro-batches, fit[c, m - 1]), its per-stage operation times with the sends
        (and without them, `bare`, under interleaving). Each candidate's row reads its own pair and split
        alone, so a caller may take any pairs' and splits' rows of one call."""
        stages, total = b.shape[1] - 1, self.total
        counts = np.arange(1, total + 1)
        position = np.arange(stages)
        # every candidate at once, (pair, split, stage): one numpy pass instead of a loop over the pairs
        orders, crossed = self._candidates(pairs, stages)
        inner = b[:, 1:-1] - 1  # the last layer before each boundary, per split
        sends = np.where(crossed[:, None, :], inter[inner][None], cheap[inner][None])
        if crossing is not None and stages > 1:
            sends = np.where(crossing[None], inter[inner][None], sends)
        placed = ranges[orders, :, position]  # (pair, stage, split, forward/backward)
        forward = placed[..., 0].transpose(0, 2, 1).copy()
        backward = placed[..., 1].transpose(0, 2, 1).copy()
        # interleaving prices compute and sends apart (a send exposed once per chunk boundary crossed,
        # not per micro-batch): its relaxation keeps them apart too, or folded sends would exceed it
        bare = (forward.reshape(-1, stages).copy(), backward.reshape(-1, stages).copy()) if self.virtual > 1 else None
        forward[:, :, :-1] += sends
        backward[:, :, 1:] += sends
        fitting = fits[orders, :, position].all(axis=1)  # (pair, split, m - 1)
        forward = forward.reshape(-1, stages)
        backward = backward.reshape(-1, stages)
        if bare is None:  # also a slow stage's own m forwards and backwards (one_f_one_b_floors)
            closed = one_f_one_b_floors(forward, backward, counts)
        else:
            closed = interleaved_closed(bare[0], bare[1], sends.reshape(len(pairs) * len(b), stages - 1),
                                        self.total, self.virtual)
        fit = fitting.reshape(-1, total)
        closed[~fit] = np.inf  # no plan: that split does not fit that kind's memory
        return closed, fit, forward, backward, bare

    def _candidates(self, pairs: list[tuple[tuple[int, ...], tuple[int, ...]]], stages: int
                    ) -> tuple[np.ndarray, np.ndarray]:
        """`_least_times`' (orders, crossed) of these pairs: the kind of each stage, (pair, stage), and
        whether boundary s crosses nodes, (pair, boundary); memoised on the pairs (read-only arrays: the
        floors ask the same pairs thousands of times, and a loop over them cost a fifth of a call)."""
        key = tuple(pairs)
        found = self._pair_arrays.get(key)
        if found is None:
            orders = np.array([order for _, order in pairs]).reshape(len(pairs), stages)
            crossed = np.array([[boundary in chosen for boundary in range(stages - 1)] for chosen, _ in pairs],
                               dtype=bool).reshape(len(pairs), stages - 1)
            orders.flags.writeable = crossed.flags.writeable = False
            found = self._pair_arrays[key] = orders, crossed
        return found

    def _programme(self, lower: dict[tuple[int, ...], list[float]]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, np.ndarray, int, np.ndarray]]]:
        """What the cover programmes share: every state (groups left of each kind) with its group
        count, the index of n - m for each (n, m) (total + 1, an infinite column, when m > n), and
        each pipeline item as (stages, kinds it takes, its offset among the states, lower time by m)."""
        if self._grid is None:  # what no pricing changes, built once (`counted_table` asks up to three times a table)
            total, kinds = self.total, len(self.kind_count)
            comps = np.array(list(itertools.product(*(range(c + 1) for c in self.kind_count)))).reshape(-1, kinds)
            shift = np.arange(total + 1)[:, None] - np.arange(1, total + 1)[None, :]
            shift = np.where(shift >= 0, shift, total + 1)
            kinds_of = [(s, v, np.array(v), sum(x * y for x, y in zip(v, self.stride)))
                        for s, vs in self.profiles.items() for v in vs]
            self._grid = comps, comps.sum(axis=1), shift, kinds_of
        comps, level, shift, kinds_of = self._grid
        return comps, level, shift, [(s, taken, offset, np.array(lower[v][1:])) for s, v, taken, offset in kinds_of]

    def cover_tables(self, lower: dict[tuple[int, ...], list[float]]) -> tuple[list[list[list[float]]],
                                                                                list[list[list[float]]]]:
        """capped[c][state][n]: least makespan of pipelines of at most c stages running n
        micro-batches on at most the groups of `state` (of each kind), each pipeline at its lower
        time for its kinds (a relaxation: no memory beyond `lower`'s, no node placement; c = longest
        is the cover itself); completion[S][state][n]: the same when one pipeline has at least S
        stages and the others no more than it (a pipeline being grown past S - 1 stages is cut when
        this cannot beat the incumbent: the master lists pipelines by non-increasing stages, so the
        ones after a pipeline of S stages have at most S). A dynamic programme over states by their
        group count, vectorised over the caps, the states of one count and the micro-batch counts."""
        total, longest = self.total, self.longest
        comps, level, shift, items = self._programme(lower)
        capped = np.full((longest + 1, len(comps), total + 1), np.inf)
        capped[:, :, 0] = 0.0
        here = np.full((longest + 2, len(comps), total + 1), np.inf)  # here[S]: the largest has S stages
        for g in range(1, self.groups + 1):
            rows = np.flatnonzero(level == g)
            parts = comps[rows]
            best = np.full((longest + 1, rows.size, total + 1), np.inf)
            for stages, offset, times, fit in _fitting(items, parts, g):
                source = rows[fit] - offset
                previous = np.concatenate([capped[stages:, source], np.full((longest + 1 - stages, source.size, 1),
                                                                             np.inf)], axis=2)
                value = np.maximum(previous[:, :, shift], times).min(axis=3)  # (caps >= stages, states, n)
                here[stages, rows[fit]] = np.minimum(here[stages, rows[fit]], value[0])
                best[stages:, fit] = np.minimum(best[stages:, fit], value)
            for k, stride in enumerate(self.stride):  # groups may idle
                fewer = parts[:, k] >= 1
                best[:, fewer] = np.minimum(best[:, fewer], capped[:, rows[fewer] - stride])
            capped[:, rows] = np.minimum(capped[:, rows], np.minimum.accumulate(best, axis=0))
        completion = np.minimum.accumulate(here[::-1], axis=0)[::-1]
        return capped.tolist(), completion.tolist()

    def _moves(self, least: int, items: list[tuple[int, np.ndarray, int, np.ndarray]], comps: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, np.ndarray, np.ndarray]]]:
        """Every (state, item) pair where the item fits the state, sorted by state, as arrays: the
        item's index, the state it leaves; and chunks of whole states' pairs (at most CHUNK_ELEMENTS
        pair x n elements each, one state at least): first pair, end pair, where each state's
        pairs start (from the first) and the states. What `counted_table` steps over each
        round; it depends on the items' kinds only (every table lists them in `profiles` order,
        those of at least `least` stages), so it is built once per `least`."""
        if least in self._move_cache:
            return self._move_cache[least]
        index, source, target = [], [], []
        reachable = comps.sum(axis=1) <= self.groups  # no inventory has more groups
        for k, (_, profile, offset, _) in enumerate(items):
            hit = np.flatnonzero((comps >= profile).all(axis=1) & reachable)
            index.append(np.full(hit.size, k))
            source.append(hit - offset)
            target.append(hit)
        empty = np.zeros(0, dtype=int)
        target_all = np.concatenate(target) if target else empty
        order = np.argsort(target_all, kind="stable")
        target_all = target_all[order]
        starts = np.flatnonzero(np.concatenate([[True], target_all[1:] != target_all[:-1]])) if target_all.size \
            else empty
        limit = max(1, CHUNK_ELEMENTS // ((self.total + 1) * (self.total + 2) // 2))  # pairs x (m, n)
        ends = np.append(starts[1:], target_all.size)
        chunks, first = [], 0
        while first < starts.size:  # whole states, at least one, up to `limit` pairs
            last = max(first + 1, int(np.searchsorted(ends, starts[first] + limit, side="right")))
            lo, hi = int(starts[first]), int(ends[last - 1])
            chunks.append((lo, hi, starts[first:last] - lo, target_all[starts[first:last]]))
            first = last
        moves = (np.concatenate(index)[order] if index else empty, np.concatenate(source)[order] if source else empty,
                 chunks)
        self._move_cache[least] = moves
        return moves

    def counted_table(self, lower: dict[tuple[int, ...], list[float]], least: int = 1,
                      rounds: int | None = None, deadline: Deadline = Deadline.never(),
                      mixed: dict[tuple[int, ...], list[float]] | None = None, forced: int = 0,
                      strict: tuple[dict[tuple[int, ...], list[float]], int] | None = None,
                      last: bool = False) -> list[list[float]] | None:
        """counted[P][state]: least makespan of exactly P pipelines of at least `least` stages each
        running the whole batch on at most the groups of `state` (the cover relaxation with the
        pipelines counted: the all-reduce floor grows with P, and with the shortest pipeline's stage
        count it falls, `ExactSearch.floor`). The same programme as `cover_tables`, once per P up to
        `rounds` (default: every P); None when `deadline` passes first. The first `forced` rounds
        price their pipeline by `mixed` instead (a multiset: at least that many of the P pipelines
        are priced so, `coupled`), the first `strict` (pricing, rounds) of them by that pricing (at
        least that many of those pipelines meet a stricter condition too, `ExactSearch.single`). Each
        round prices every fitting (state, item) pair at once from the last round's table, then lets
        groups idle: a state's value is the least over the states below it (fewer of some kinds), a
        running minimum along each kind's axis of the state grid (the same values as a pass over states
        by group count, minima being exact). `last`: only counted[rounds] is wanted (`coupled`,
        `paired_level`): each earlier round computes only the micro-batch counts it feeds (up to the
        total less one per round left; 32-64 seed 53's tables 1.50 -> 0.33 s) and its row is left empty."""
        total = self.total
        comps, _, _, items = self._programme(lower)
        items = [item for item in items if item[0] >= least]
        special = [item for item in self._programme(mixed)[3] if item[0] >= least] if forced else items
        times = np.array([item[3] for item in items]).reshape(len(items), total)
        special_times = np.array([item[3] for item in special]).reshape(len(special), total) if forced else times
        rounds = min(self.groups, total) if rounds is None else rounds
        if forced and rounds and not np.isfinite(special_times).any():
            # no pipeline priced by `mixed` runs anything: no state runs the batch in any round (32-64
            # seed 324: `spans`' kept runs that no stage of any kind holds whole; 51 of its 59 pattern
            # tables are all inf)
            return [[math.inf] * len(comps) for _ in range(rounds + 1)]
        index, source, chunks = self._moves(least, items, comps)
        priced = (times[index], special_times[index])
        if strict is not None:
            strictest = [item for item in self._programme(strict[0])[3] if item[0] >= least]
            priced += (np.array([item[3] for item in strictest]).reshape(len(strictest), total)[index],)
        grid = tuple(c + 1 for c in self.kind_count) + (total + 1,)
        previous = np.full((len(comps), total + 1), np.inf)
        previous[:, 0] = 0.0  # no pipeline runs nothing
        counted = [[math.inf] * len(comps)]
        for round_ in range(rounds):
            if deadline.expired():
                return None
            pick = priced[2 if strict is not None and round_ < strict[1] else int(round_ < forced)]
            best = np.full((len(comps), total + 1), np.inf)
            # the rest's micro-batch counts any state runs (round r: r pipelines, at least r of them; the
            # first round's none): the others are inf for every state, and max(inf, item) lowers nothing
            ran = np.flatnonzero(np.isfinite(previous).any(axis=0))
            first, end = (int(ran[0]), int(ran[-1]) + 1) if ran.size else (total + 1, total + 1)
            ranging = previous[:, first:end]  # value[:, j]: n = first + 1 + j (below, inf)
            # `last`: each round after this one adds at least a micro-batch, so the last round's n = total
            # reads this round's n only up to total - (rounds left); the columns past it stay inf
            upto = total - (rounds - 1 - round_) if last else total
            # every (m, n) at once: the item runs m of the n = first + 1 + j micro-batches, the rest n - m
            # (column i = j + 1 - m of `ranging`), grouped by j (`_runs_of`)
            items_at, rest_at, groups, columns = _runs_of(first, end, upto)
            for lo, hi, starts, targets in chunks:  # per state: least over its items of max(item, the rest)
                if columns.size:
                    paired = np.maximum(ranging[source[lo:hi]][:, rest_at], pick[lo:hi][:, items_at])
                    value = np.minimum.reduceat(np.minimum.reduceat(paired, groups, axis=1), starts, axis=0)
                    best[targets[:, None], first + 1 + columns] = value
            below = best.reshape(grid)  # a view of `best`: groups may idle
            for axis in range(len(grid) - 1):
                np.minimum.accumulate(below, axis=axis, out=below)
            counted.append(best[:, total].tolist() if not last or round_ == rounds - 1 else [])
            previous = best
        return counted


@functools.lru_cache(maxsize=4096)
def _runs_of(first: int, end: int, upto: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`counted_table`'s pairs for one round, whose rest ran `first`..`end` - 1 micro-batches: per column j
    of n = first + 1 + j up to `upto`, every m (the item's micro-batches, m - 1 in `items_at`) with the
    rest's n - m among those (column j + 1 - m in `rest_at`), grouped by j (`groups`: each group's first
    pair, for `np.minimum.reduceat`; `columns`: the j of each group, every j with a pair)."""
    items, rests, columns, groups = [], [], [], []
    for j in range(max(upto - first, 0)):
        pairs = [(m, j + 1 - m) for m in range(1, j + 2) if j + 1 - m < end - first]
        if pairs:
            groups.append(len(items))
            columns.append(j)
            items += [m - 1 for m, _ in pairs]
            rests += [i for _, i in pairs]
    found = tuple(np.array(x, dtype=np.intp) for x in (items, rests, groups, columns))
    for array in found:
        array.flags.writeable = False
    return found


class ExactSearch:
    """Branch and bound for one inventory of TP groups (see the module docstring)."""

    def __init__(self, instance: Instance, model: PerfModel, groups: list[tuple[int, ...]], tp: int,
                 relaxation: Relaxation, prices: dict[tuple, Priced] | None = None) -> None:
        """`relaxation`: built for these survivors; `prices`: shapes already priced (by another
        inventory of the same survivors: a shape's terms do not depend on which groups realise it)."""
        self.instance, self.model, self.tp = instance, model, tp
        self.total = instance.global_micro_batches
        self.layers = instance.workload.num_layers
        # classes: interchangeable groups (same stage device type, same node), each a pool used in order
        keys: dict[tuple[str, int], int] = {}
        self.pools: list[list[tuple[int, ...]]] = []
        self.class_type: list[str] = []
        self.class_node: list[int] = []
        for group in groups:
            key = (model.stage_device(group).name, instance.node_of(group[0]))
            if key not in keys:
                keys[key] = len(self.pools)
                self.pools.append([])
                self.class_type.append(key[0])
                self.class_node.append(key[1])
            self.pools[keys[key]].append(group)
        self.counts = [len(pool) for pool in self.pools]
        self.groups = len(groups)
        # families: nodes whose surviving groups have the same types are interchangeable
        composition: dict[int, Counter] = {}
        for c, node in enumerate(self.class_node):
            composition.setdefault(node, Counter())[self.class_type[c]] += self.counts[c]
        self._composition = composition  # `node_groups`: read by most floors, never changed
        self._kind_counts: dict[tuple, list[int]] = {}  # `of_kind`, per groups' (type, count) items
        self._slot_deficits: dict[tuple[int, int], list[int]] = {}  # `_run_slots`, per (P, kind)
        families: dict[tuple, list[int]] = {}
        for node in sorted(composition):
            families.setdefault(tuple(sorted(composition[node].items())), []).append(node)
        # a node's family and its rank there (`solve`: a family's untouched nodes are taken in rank order)
        self.family_of = {node: f for f, members in enumerate(families.values()) for node in members}
        self.family_rank = {node: rank for members in families.values() for rank, node in enumerate(members)}
        self.families = len(families)
        self.most_per_node = max(sum(counts.values()) for counts in composition.values())
        speed = {name: sum(model.stage_times(self.pools[c][0], 0, self.layers)[:2])
                 for c, name in enumerate(self.class_type)}
        self.order = sorted(range(len(self.pools)), key=lambda c: (speed[self.class_type[c]], self.class_node[c]))
        self.most_pipelines = min(self.groups, self.total)
        self.virtual = model.options.virtual_stages or 1
        self.overlapped = bool(model.options.overlap_grad_reduce)
        self.longest = min(self.layers, self.groups)
        self.splits = {s: _compositions(self.layers, s) for s in range(1, self.longest + 1)}
        self.prices: dict[tuple, Priced] = {} if prices is None else prices
        # `price`'s per-stage terms, keyed by every argument of the model calls they stand for (the
        # group's device ids, not its type: the model reads its nodes too); the model, its reliefs and
        # `most_pipelines` are fixed for this search. (group, first, end): per relief (forward,
        # backward, step); (group, first, end, stage, stages, m): per relief, whether it fits.
        self._stage_terms: dict[tuple, list[tuple[float, float, float]]] = {}
        self._stage_fits: dict[tuple, tuple[bool, ...]] = {}
        self.relaxation = relaxation
        self.root = relaxation.state([model.stage_device(g).name for g in groups])
        self.class_stride = [relaxation.state([name]) for name in self.class_type]
        # (type a, type b): a group of type a may stand in for one of type b in a regular run's copy
        sample = {name: self.pools[c][0] for c, name in enumerate(self.class_type)}
        self.stands_in = {(a, b): a == b or _dominates(model, sample[a], sample[b]) for a in sample for b in sample}
        # per pipeline count P: a floor on every plan of exactly P pipelines (`floor`; 0 where none is known)
        self.by_count: dict[int, float] = {}
        # First pipelines (groups, bounds, micro-batches) whose every plan a run of `solve` searched to the
        # end (short runs included; regular and focus runs not: what they cut is no proof). Later runs,
        # and later calls (`exact_search`'s second pass, whose incumbent is at most every earlier call's
        # best), skip them: each subtree was searched with floors valid for it and an incumbent at least
        # the current one, so every plan there that could beat it was found and returned then. A short
        # run cut by its share leaves that much less to the runs after it (32-64 seed 172: its short run
        # of four-stage pipelines is cut at 0.45 s of 1.3, and the full run redid that part).
        self.exhausted: set[tuple[tuple[tuple[int, ...], ...], tuple[int, ...], int]] = set()

    def floor(self, refine: Deadline | None = None, cap: float = math.inf) -> float:
        """The relaxation's floor on the step of every plan on these groups: with the pipelines
        counted (`Relaxation.counted`), min over P pipelines and the shortest one's stage count s
        (at most G / P) of the least makespan of P pipelines of at least s stages each, plus the
        least all-reduce of P replicas and the least optimizer step (one of the shortest pipeline's
        stages holds at least `_largest_stage(., s)` of the gradients and of the layers' least
        optimizer steps); else the pipeline-time floor alone. Coupling s matters: the fewest
        stages make the cheapest pipelines (no sends) but the largest rings. Per P it is raised to
        the coupled table's (`Relaxation.coupled`: each pipeline's time, ring and step on one split)
        where affordable, P by P from the lowest counted value while it may still lower the floor:
        both hold for every plan of P pipelines. Where P pipelines could ring inside one node, the
        floor also splits plans by whether some layer's ring crosses nodes (see below). The tables this needs beyond `Relaxation.build`'s
        (`Relaxation.level`, `Relaxation.coupled`: tenths of a second at 50 groups) are built only
        given `refine`, a deadline (`exact_search` asks before its branch and bound);
        without it the floor uses the tables built so far. Raising a count's floor stops at `cap`
        (the incumbent, less PRUNE_TOLERANCE): a floor there already cuts every plan of that count,
        and the inventory once every count's does, so more tables decide nothing (32-64 seeds 4, 21,
        56, 94, 123: 0.7-0.8 s of refining before). Once the floor is known, in the refine time left,
        every P whose floor is still below `cap` is refined up to it, not only those below the least
        floor so far: each P's floor (`by_count`) that meets it cuts every plan of P pipelines from
        the tree (8-24-device seed 16: the plans of three and four pipelines are 6.3e-7 apart, so both
        must be floored)."""
        relaxation = self.relaxation
        if not relaxation.counted:
            return relaxation.cover[self.root][self.total]
        grad = (self.model.workload.params * self.model.grad_bytes / self.tp).tolist()
        longest = min(self.groups, self.layers)
        # per shortest stage count s: the largest stage's gradient bytes and optimizer step at least
        largest = {s: (_largest_stage(tuple(grad), s), _largest_stage(tuple(relaxation.update), s))
                   for s in range(1, longest + 1)}

        def counted(p: int, build: Deadline | None, least_ring: float = 0.0) -> float:
            """P pipelines: the least over the shortest one's stage count s of its table (`level`:
            given `build`, the table of the s at the minimum is built while affordable, until the
            minimum sits on a table of its own least count) + the ring (at least `least_ring`) and
            step of s stages."""
            shards = self.model.optimizer_shards(p)  # every layer has P replicas
            extra = {s: max(self.ring_bound(p, largest[s][0]), least_ring) + largest[s][1] / shards
                     for s in range(1, min(self.groups // p, self.layers) + 1)}
            while True:
                value = {s: relaxation.level(s)[0][p][self.root] + e for s, e in extra.items()}
                shortest = min(value, key=value.get)
                if build is None or relaxation.level(shortest)[1] or not relaxation.level(shortest, build)[1]:
                    return value[shortest]

        cheap = {p: counted(p, None) for p in range(1, len(relaxation.counted[0]))}  # on the tables built
        for p, value in cheap.items():
            self.by_count[p] = max(self.by_count.get(p, 0.0), value)

        def refined(p: int, limit: float) -> float:
            """P's floor from its own tables, raised while below `limit` (its methods stop there)."""
            coupled = relaxation.coupled(p, refine)  # first: one table, and it often decides
            value = max(cheap[p], coupled[self.root] if coupled is not None else 0.0)
            if refine is not None and value < limit:
                value = max(value, counted(p, refine))
            if refine is not None and value < limit and 2 <= p <= self.most_per_node and not self.overlapped \
                    and min(grad) > 0:
                # Rings inside nodes (the counted floor's link here) or node crossings, not both: either
                # some layer's P holders span nodes, and its slot's ring takes the inter-node link with
                # at least that layer's bytes (`spanning`), or every layer's holders share a node, which
                # then holds a stage of every pipeline, so no pipeline runs more than most - P + 1 of
                # its stages in one node (`columns`: the times with those crossings), and every stage
                # sits in a node of at least P groups (each holds a layer whose P holders share its
                # node): the plan runs on those nodes' groups alone (8-24-device seed 53: 8 one-stage
                # pipelines fit only the one node of 8, 12.4584 -> 12.4906, the optimum).
                spanning = max(coupled[self.root] if coupled is not None else 0.0,
                               counted(p, refine, relaxation.ring_time(min(grad), p, self.model.inter)))
                columns = self.columns(p, refine, limit) if value < min(spanning, limit) else 0.0
                if value < min(spanning, limit) and columns > spanning:
                    spanning = max(spanning, self.spanning(p, refine))
                value = max(value, min(spanning, columns))
                # each builds tables before it checks; `spans` right after `held`: it floors every case of the
                # layers whose holders span nodes with the run-slot, node-run and holder tables, and is often the
                # one that meets the plan (24-32-device seed 8022: before it, `isolated`, `neighboured` and `kept`
                # took 0.8 s of the 2 s and raised 30.6585 to 30.6766; `spans` then met the plan's 31.7566 too
                # late; spans first, 8022 and 3113 are proven at 2 s)
                for split in (self.held, self.spans, self.isolated, self.neighboured, self.kept, self.single):
                    if value < limit:
                        value = max(value, split(p, refine, value, limit))
            if refine is not None and value < limit:  # one table per run length: before the paired tables
                value = max(value, self.long_runs(p, refine, value, limit))
            if refine is not None and value < limit and 2 <= p <= self.most_per_node and not self.overlapped \
                    and min(grad) > 0:  # after `long_runs`: its tables pick the run length
                value = max(value, self.held_runs(p, refine, value, limit))
                if value < limit:
                    value = max(value, self.held_whole(p, refine, value, limit))
            if refine is not None and value < limit:
                value = max(value, self.paired(p, refine, value, limit))
            if refine is not None and value < limit:
                value = max(value, self.whole_nodes(p, refine, value, limit))
            if refine is not None and value < limit:
                value = max(value, self.thresholds(p, refine, value, limit))
            if refine is not None and value < limit:
                value = max(value, self.boundaries(p, refine, value, limit))
            if refine is not None and value < limit:
                value = max(value, self.union_rings(p, refine, value, limit))
            self.by_count[p] = max(self.by_count[p], value)
            return value

        floor = math.inf
        for p in sorted(cheap, key=cheap.get):
            limit = min(floor, cap)  # P's floor raised past this changes neither the result nor a cut
            if cheap[p] >= limit:
                floor = min(floor, cheap[p])
                break  # every P left is at least that already (its own tables only raise it)
            floor = min(floor, refined(p, limit))
        if refine is None or cap <= floor:
            return floor
        # then, in the time left, every P still below the incumbent up to it (tables built above are cached)
        for p in sorted(cheap, key=self.by_count.get):
            if self.by_count[p] >= cap or refine.expired():
                break
            refined(p, cap)
        return max(floor, min(self.by_count[p] for p in cheap))

    def spanning(self, pipelines: int, refine: Deadline) -> float:
        """Floor of the plans of P pipelines in which some layer's P holders span nodes (0 when its
        tables are out of reach): either every layer's do, and every slot's rings take the
        inter-node link (the coupled table with inter-node rings), or some layer's P holders are P
        groups of one node of at least P groups, of which at most f_k are of kind k: then at least
        P - f_k pipelines have a stage of another kind (the coupled table with that many such
        pipelines, for the kind whose count is the largest). Seed 154 (8-24 devices): five
        pipelines, nodes of at most four fast groups; seed 21: nodes of 3 and 5 fast groups among 7."""
        relaxation = self.relaxation
        forced = self.forced(pipelines)
        if not forced:
            return 0.0
        crossing = relaxation.coupled(pipelines, refine, crossing=True)
        if crossing is None:
            return 0.0
        local = self.local(pipelines, refine, forced)
        return min(crossing[self.root], local) if local is not None else 0.0

    def forced(self, pipelines: int) -> list[tuple[int, int]]:
        """Every (kind k, r) with r > 0: a layer whose P holders share a node has at least r = P - f_k
        of them of another kind than k, f_k the most groups of kind k on a node of at least P groups.
        Each kind's r holds at once, so the floors of them all stand together (`local`): 32-64 seed
        173's nodes hold at most 2 slow and 3 fast of four groups, and only the fast kind's r = 1 (a
        slow holder) costs anything. Empty when the relaxation has one kind."""
        relaxation = self.relaxation
        if len(relaxation.kind_count) < 2:
            return []  # one kind for all types: no kind to force
        wide = [groups for groups in self.node_groups().values() if sum(groups.values()) >= pipelines]
        forced = [(kind, pipelines - max((self.of_kind(groups, kind) for groups in wide), default=pipelines))
                  for kind in range(len(relaxation.kind_count))]
        return [(kind, r) for kind, r in forced if r > 0]

    def local(self, pipelines: int, refine: Deadline, forced: list[tuple[int, int]], held: int | None = None,
              crossed: tuple[int, ...] = ()) -> float | None:
        """The largest over `forced`'s kinds of the coupled table with r pipelines whose stage holding
        layer `held` (any layer when None) is of another kind than k: each floors every plan of P
        pipelines keeping that layer's holders in one node (and ringing the `crossed` layers across
        nodes). None when a table is out of reach."""
        best = 0.0
        for kind, rounds in forced:
            table = self.relaxation.coupled(pipelines, refine, forced=(kind, rounds), crossed=crossed,
                                            held=None if held is None else ((held,), 1))
            if table is None:
                return None
            best = max(best, table[self.root])
        return best

    def held(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """Floor of the plans of P pipelines from where their layers' rings cross nodes, while it may
        raise `value` below `floor`. A layer l's P holders either span nodes or are one node's
        groups, at least r of them of another kind than k (`forced`): local[l], the coupled table
        with r pipelines whose stage holding l is of another kind, floors the plans of the second
        case. With the layers by local[l] descending, a plan either keeps one of the first j inside
        a node (at least the j-th local[l]) or rings all of them across nodes (the coupled table
        with those rings crossing); the lesser holds for every plan, for each j. 8-24-device seed
        154: a slow group holding layer 2 or 3 costs 16.4 or 16.2 s, layer 1 14.8 s, so below that
        layers 1-3 ring across nodes (the optimum's 0.256 s)."""
        forced = self.forced(pipelines)
        return self._held_branches(pipelines, refine, value, floor, forced, {}) if forced else 0.0

    def _held_branches(self, pipelines: int, refine: Deadline, value: float, floor: float,
                       forced: list[tuple[int, int]], crossed_terms: dict) -> float:
        """`held`'s least over j of min(the j-th largest local[l], the coupled table with those j
        layers' rings crossed and `crossed_terms`, `coupled`'s keywords every plan of that branch meets)."""
        local = {}
        for layer in range(self.layers):
            kept = self.local(pipelines, refine, forced, layer)
            if kept is None:
                return 0.0
            local[layer] = kept
        best, crossed = 0.0, []
        for layer in sorted(local, key=local.get, reverse=True):
            if local[layer] <= max(best, value) or max(best, value) >= floor:
                break  # later layers keep a lower first term
            crossed.append(layer)
            table = self.relaxation.coupled(pipelines, refine, crossed=tuple(sorted(crossed)), **crossed_terms)
            if table is None:
                break
            best = max(best, min(local[layer], table[self.root]))
        return best

    def held_runs(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """`held` with its crossed branch also counting the long runs the nodes hold (`long_runs`): a
        plan that rings the first j layers across nodes still has at most sum over nodes of f_k // L
        pipelines all of kind k with a run of L stages in one node, so its pipelines are floored by the
        coupled table with those rings crossed and the other P - x_L pipelines of another kind or of
        no run longer than L - 1 (both hold for every plan of the branch; the (k, L) whose table
        without crossed rings is the largest is the one used).
        24-32-device seed 3039: four four-stage fast pipelines of one micro-batch on nodes of at most
        three fast groups, each of which holds a slow one: a slow holder costs a layer more than its
        ring across nodes, so every ring crosses (1.5 s), and then only three pipelines run three
        stages in one node (the crossing before layer 4 is the cheapest): 13.5195 -> the optimum."""
        forced = self.forced(pipelines)
        if not forced:
            return 0.0
        limits = {}  # (kind, forced pipelines, run length): P - x_L pipelines of another kind or shorter runs
        for kind, rounds, length in self._run_limits(pipelines):
            table = self.relaxation.coupled(pipelines, refine, forced=(kind, rounds), short_runs=length - 1)
            if table is not None:  # `long_runs`' own (cached): the one that floors most is used below
                limits[kind, rounds, length] = table[self.root]
        if not limits:
            return 0.0
        kind, rounds, length = max(limits, key=limits.get)
        return self._held_branches(pipelines, refine, value, floor, forced,
                                   {"forced": (kind, rounds), "short_runs": length - 1})

    def _across(self, pipelines: int, refine: Deadline) -> dict[int, float] | None:
        """Per layer, the root floor of P pipelines whose plans ring that layer across nodes
        (`Relaxation.coupled` with it crossed); None when a table runs out of time."""
        across = {}
        for layer in range(self.layers):
            table = self.relaxation.coupled(pipelines, refine, crossed=(layer,))
            if table is None:
                return None
            across[layer] = table[self.root]
        return across

    def isolated(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """Floor of the plans of P pipelines from which layers ring inside a node, while it may raise
        `value` below `floor`. A layer l whose P holders share a node (of n groups, n >= P) has at
        least r = 2P - n of them alone there among their pipeline's stages (the node's other n - P
        groups each serve at most one pipeline's stage), and those cross nodes at both their
        boundaries; n is at most the largest node of at least P groups. With the layers by their
        crossing floor descending (the coupled table with l's ring across nodes), a plan either
        rings one of the first k across nodes (at least the k-th's floor) or keeps all k inside
        nodes (k from the most whose floor exceeds `value`, down): then k r such stages fall on P
        pipelines, so one pipeline isolates the stages of at least q = ceil(k r / P) of those layers
        (the coupled table with one pipeline so priced, `Relaxation.lower_times`' `isolate`); and
        either every layer rings inside a node (`columns`) or one of the others rings across nodes
        (that table with its ring across as well). The lesser holds for every plan, for each k.
        32-64-device seed 22: three pipelines, nodes of four groups; layers 0, 2, 3 and 4 ring
        across nodes at 26.886 s or more, so below that the plan keeps them all inside nodes."""
        relaxation = self.relaxation
        wide = [n for n in (sum(groups.values()) for groups in self.node_groups().values()) if n >= pipelines]
        alone = 2 * pipelines - max(wide, default=2 * pipelines)
        if alone <= 0:
            return 0.0
        across = self._across(pipelines, refine)
        if across is None:
            return 0.0
        order = sorted(across, key=across.get, reverse=True)
        best, columns = 0.0, None
        # from the most layers whose ring across alone raises `value` (the most constrained first: 32-64
        # seed 22's four; the refine deadline may stop the rest), down to one
        for k in range(sum(across[layer] > value for layer in order), 0, -1):
            if max(best, value) >= floor:
                break
            isolate = (tuple(sorted(order[:k])), -(-k * alone // pipelines))
            table = relaxation.coupled(pipelines, refine, forced=(0, 1), isolate=isolate)
            if table is None:
                break
            local = table[self.root]
            if local < across[order[k - 1]]:  # every layer inside nodes (`columns`), or another one across
                columns = self.columns(pipelines, refine, floor) if columns is None else columns
                others = [relaxation.coupled(pipelines, refine, forced=(0, 1), isolate=isolate, crossed=(layer,))
                          for layer in order[k:]]
                if all(other is not None for other in others):
                    local = max(local, min([columns] + [other[self.root] for other in others]))
            best = max(best, min(across[order[k - 1]], local))
        return best

    def neighboured(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """Floor of the plans of P pipelines from which layer's holders share a node, while it may raise
        `value` below `floor`. If layer l's P holders sit on one node N (n groups, f_k of kind k),
        call a pipeline r-plain when its stage holding l and r neighbouring stages of its own that
        share N are all of kind k (r = 1: one side; r = 2: both sides): it puts r + 1 groups of
        kind k in N and r groups besides the P holders, so at most min(f_k // (r + 1), (n - P) // r)
        pipelines are r-plain (the most over the nodes of at least P groups). Every other one has
        its stage holding l or one next to it of another kind, or that stage crosses nodes at every
        boundary it has (r = 1) or at one at least (r = 2; a first or last stage counts), priced by
        the lesser (`coupled`'s `neighbours`), so the coupled table with P - that many such
        pipelines floors those plans; a plan either does that or rings l across nodes (the coupled
        table with l's ring across). With the layers by that second floor descending, each gives the
        lesser of the two, for each kind k and r. 32-64-device seed 0: two five-stage fast
        pipelines, nodes of at most three fast groups, and the sends around layers 2 and 4 are 100
        MB: ringing layer 4 (500 MB) across costs 30.632 s, keeping it in a node makes one pipeline
        pay a slow stage or two 100 MB sends across nodes. Seed 89: two pipelines, nodes of at most
        five fast groups: two pipelines cannot both hold layer 2 between two stages in its node."""
        relaxation = self.relaxation
        wide = [groups for groups in self.node_groups().values() if sum(groups.values()) >= pipelines]
        forced = []  # (kind, pipelines priced so, r)
        for kind in range(len(relaxation.kind_count)):
            for reach in (1, 2):
                plain = max((min(self.of_kind(groups, kind) // (reach + 1), (sum(groups.values()) - pipelines) // reach)
                             for groups in wide), default=pipelines)
                if pipelines - plain > 0:
                    forced.append((kind, pipelines - plain, reach))
        if not forced:
            return 0.0
        across = self._across(pipelines, refine)
        if across is None:
            return 0.0
        best = 0.0
        for layer in sorted(across, key=across.get, reverse=True):
            if across[layer] <= max(best, value) or max(best, value) >= floor:
                break  # later layers keep a lower first term
            kept = 0.0
            for kind, rounds, reach in forced:
                table = relaxation.coupled(pipelines, refine, forced=(kind, rounds), isolate=((layer,), 1),
                                           neighbours=reach)
                if table is None:
                    return best
                kept = max(kept, table[self.root])
            best = max(best, min(across[layer], kept))
        return best

    def kept(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """Floor of the plans of P pipelines from pairs of layers whose rings stay inside nodes, while it
        may raise `value` below `floor`. For layers a and b, a plan either rings a across nodes (the
        coupled table with a's ring across), or keeps a's holders in one node and rings b across (the
        `local` table of a with b's ring across), or keeps both inside nodes (`both`); the least of
        the three holds for every plan, for each pair (a: the layer whose ring across costs the most).
        8-24-device seed 220: four pipelines on nodes of
        four groups, at most three fast; keeping layer 3 (the largest ring) inside a node costs one
        slow layer-3 stage, and keeping layer 1 as well costs two slow stages holding layers 1 or 3
        (on two nodes, at most six fast holders of eight), which no plan of one pipeline of one
        micro-batch and three of two absorbs."""
        forced = self.forced(pipelines)
        if not forced:
            return 0.0
        across = self._across(pipelines, refine)
        if across is None:
            return 0.0
        order = sorted(across, key=across.get, reverse=True)
        best = 0.0
        first = order[0]  # the costliest ring across (every pair took 0.3 s at 32-64 seed 198, for nothing)
        if across[first] > value:
            for second in order:
                if second == first or max(best, value) >= floor:
                    continue
                one = self.local(pipelines, refine, forced, first, crossed=(second,))
                if one is None:
                    return best
                if min(across[first], one) <= max(best, value):
                    continue
                both = self.both(pipelines, refine, (min(first, second), max(first, second)))
                if both is None:
                    return best
                best = max(best, min(across[first], one, both))
        return best

    def both(self, pipelines: int, refine: Deadline, layers: tuple[int, int]) -> float | None:
        """Floor of the plans of P pipelines keeping the P holders of each of these two layers in one
        node (of at least P groups; None when a table is out of reach). Per kind k: on two nodes, at
        most the two largest counts of kind-k groups among such nodes hold them, so at least R = 2P
        minus that of the holders are of another kind; on one node N, its P holders of each, which
        are 2P groups when no stage can hold both layers (`Relaxation.shareable`, then N needs 2P
        groups) and at least P otherwise, so R is that minus N's kind-k groups. R such stages (each
        pipeline's distinct stages holding the layers) fall either on at least min(R, P) pipelines or,
        fewer pipelines taking more than one, two on one: the lesser of those two coupled tables.
        Infinite when no node, nor two, can hold them."""
        relaxation = self.relaxation
        wide = [groups for groups in self.node_groups().values() if sum(groups.values()) >= pipelines]
        shared = relaxation.shareable(*layers)
        best = 0.0
        for kind in range(len(relaxation.kind_count)):
            counts = [(self.of_kind(groups, kind), sum(groups.values())) for groups in wide]
            two = sorted((f for f, _ in counts), reverse=True)
            others = [2 * pipelines - two[0] - two[1]] if len(two) >= 2 else []
            for f, size in counts:
                if shared:
                    others.append(pipelines - f)
                elif size >= 2 * pipelines:
                    others.append(2 * pipelines - f)
            if not others:
                return math.inf  # no node, nor two, can hold both layers' holders
            rounds = min(others)
            if rounds <= 0:
                continue
            table = relaxation.coupled(pipelines, refine, forced=(kind, min(rounds, pipelines)), held=(layers, 1))
            if table is None:
                return None
            value = table[self.root]
            if rounds >= 2:
                table = relaxation.coupled(pipelines, refine, forced=(kind, 1), held=(layers, 2))
                if table is None:
                    return None
                value = min(value, table[self.root])
            best = max(best, value)
        return best

    def single(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """Floor of the plans of P pipelines from whether one of them runs every layer on one stage, while
        it may raise `value` below `floor` (0 when a table is out of reach or the layers are more than
        SINGLE_LAYERS). Either none does (the coupled table of pipelines of two stages or more), or such
        a pipeline S sits on a node N, and every layer whose P holders share a node (the set K) has
        them on N, since S holds it there; every other layer rings across nodes. K empty: every ring
        crosses. Else each pipeline j holds K's layers on d_j >= 1 stages, all on N: the d_j sum to at
        most |N|, and at most f_k (N's kind-k groups) of those stages are of kind k. With n1 pipelines
        of d = 1 (S among them, n1 >= 2P - |N|), the others have d >= 2, so the d sum to at least
        2P - n1 and each d is at most t = |N| - 2P + n1 + 2; when R_k = 2P - n1 - f_k > 0, one of
        those stages is of another kind than k, on one of the n1 pipelines or on another. Per K, N and
        n1 the coupled table (every pipeline holding K's layers on at most t stages, n1 on one; the
        layers outside K ringing across), raised to the lesser of the two tables with that stage of
        another kind, floors those plans; the least over them all, and over the plans with no
        one-stage pipeline, holds for every plan. 8-24-device seed 16: the slowest pipeline is
        one fast stage of two micro-batches, on nodes of at most four groups (three fast): keeping
        layers 0-3 inside node 0 makes a pipeline hold them on its slow group or on two stages."""
        relaxation = self.relaxation
        if self.layers > SINGLE_LAYERS or value >= floor:
            return 0.0
        none = relaxation.coupled(pipelines, refine, shortest=2)
        across = relaxation.coupled(pipelines, refine, crossing=True)  # K empty
        if none is None or across is None or none[self.root] <= value:
            return 0.0
        nodes = {(sum(groups.values()),
                  tuple(self.of_kind(groups, kind) for kind in range(len(relaxation.kind_count))))
                 for groups in self.node_groups().values() if sum(groups.values()) >= pipelines}
        best, kept = across[self.root], {}
        for size in range(1, self.layers + 1 if nodes else 0):
            for layers in itertools.combinations(range(self.layers), size):
                table = relaxation.coupled(pipelines, refine, crossed=tuple(sorted(set(range(self.layers)) - set(layers))))
                if table is None:
                    return 0.0
                kept[layers] = table[self.root]
        for layers in sorted(kept, key=kept.get):
            if min(best, none[self.root]) <= value:
                return 0.0
            if kept[layers] >= best:
                break  # the rest ring more across, so none lowers `best`
            crossed = tuple(sorted(set(range(self.layers)) - set(layers)))
            least = math.inf  # over N and n1
            for size, kinds in nodes:
                for ones in range(max(2 * pipelines - size, 1), pipelines + 1):
                    most = size - 2 * pipelines + ones + 2 if ones < pipelines else 1
                    # each entry: tables of which the least floors these plans; the largest entry is taken
                    entries: list[list[tuple[int, tuple[int, int, int, int] | None]]] = [[(ones, None)]]
                    for kind, fast in enumerate(kinds):
                        if 2 * pipelines - ones - fast > 0 and len(kinds) > 1:  # R_k > 0: among the n1, or not
                            entries.append([(ones, (1, kind, 1, 1))]
                                           + ([(ones + 1, (1, kind, 1, most))] if ones < pipelines else []))
                    found = kept[layers]
                    for entry in entries:
                        if found >= min(best, least):
                            break
                        values = []
                        for rounds, strict in entry:
                            table = relaxation.coupled(pipelines, refine, forced=(0, rounds), crossed=crossed,
                                                       within=(layers, most, 1), strict=strict)
                            if table is None:
                                return 0.0
                            values.append(table[self.root])
                        found = max(found, min(values))
                    least = min(least, found)
            best = min(best, least)
        return min(none[self.root], best)

    def paired(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """Floor of the plans of P pipelines from how few neighbouring stages can share a node, while it
        may raise `value` below `floor`. Two consecutive stages of one pipeline either cross nodes or
        share one; in a node whose f_k groups are of kind k, the pipelines of kind k alone hold runs of
        consecutive stages there on distinct groups, so at most max(f_k - 1, 0) of their boundaries
        share it (a run of r groups has r - 1), B_k over the nodes. A pipeline of s >= s0 stages, all
        of kind k, crossing nodes fewer than c times keeps at least s - c >= s0 - c boundaries inside
        nodes, so at most B_k // (s0 - c) pipelines are so; the other P - that many are of another
        kind somewhere, shorter than s0 stages, or cross at least c times (`coupled`'s `paired`),
        which floors every plan of P pipelines, priced with rings of their own (`coupled`) or with the
        shortest one's stage count (`Relaxation.paired_level`: a forced pipeline cannot then take a
        finer split for a smaller ring of its own). c runs above the crossings a pipeline of s0
        stages must make anyway (runs of at most a node's groups). Fewer than c crossings also leave at
        most c runs, one of at least ceil(s0 / c) stages in one node: at most the sum over the nodes
        of f_k // ceil(s0 / c) pipelines do (8-24-device seed 162: seven 3-stage pipelines, nodes of
        four groups; for c = 1, whole pipelines in one node, then priced with `thresholds` too, since a
        2-stage split of one micro-batch is as fast but rings more). 32-64-device seed 91: seven
        four-stage fast pipelines on nodes of at most three fast groups; B = 13 lets six cross once,
        the seventh crosses twice (17.264283 -> 17.264493, its plan); 94 (three stages, nodes of at
        most two fast groups, B = 5): 19.469159 -> 19.469369 (its plan) by the counted form."""
        relaxation = self.relaxation
        extra = self._least_extras(pipelines)
        best = 0.0
        for kind, stages, crossings, rounds, by_runs in self._paired_cases(pipelines):
            if max(best, value) >= floor:
                continue
            table = relaxation.coupled(pipelines, refine, forced=(kind, rounds), paired=(crossings, stages))
            if table is None:
                return best
            best = max(best, table[self.root])
            if crossings == 1 and by_runs and max(best, value) < floor:
                best = max(best, self.thresholds(pipelines, refine, max(best, value), floor,
                                                 forced=(kind, rounds), paired=(crossings, stages)))
            if max(best, value) >= floor:
                continue
            # or with the pipeline times counted by the shortest one's stage count (`floor`'s counted)
            least = math.inf
            for shortest, paid in extra.items():
                row = relaxation.paired_level(pipelines, shortest, refine, (kind, rounds), (crossings, stages))
                if row is None:
                    return best
                least = min(least, row[self.root] + paid)
            best = max(best, least)
        return best

    def whole_nodes(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """Floor of the plans of P pipelines from how few pipelines of mixed kinds fit whole in one node,
        while it may raise `value` below `floor`. A pipeline that never crosses nodes has all its
        stages' groups in one node; one taking at least u_k groups of every kind k there leaves that
        node's f_k groups of kind k to the others, so at most N_u = the sum over the nodes of the least
        over the kinds of u of f_k // u_k pipelines take at least u and cross no node; the other P - N_u
        take less of some kind than u or cross at least once (`coupled`'s `whole`), which floors every
        plan of P pipelines. u runs over the pipelines' kind profiles of at least two kinds and two
        groups, the fewest groups first (`paired` and `long_runs` count pipelines of one kind).
        24-32-device seed 8138: seven fast-slow-fast pipelines, nodes of (3, 3), (3, 4), (7, 0) and
        (3, 4) fast and slow groups: at most 3 fit whole in a node, and at most two are all fast, so
        two cross: 15.088774 -> 15.090784, its plan."""
        best = value
        for u, rounds in self._whole_cases(pipelines):
            if best >= floor:
                break
            table = self.relaxation.coupled(pipelines, refine, forced=(0, rounds), whole=u)
            if table is None:
                return best
            best = max(best, table[self.root])
        return best

    def _whole_cases(self, pipelines: int) -> Iterator[tuple[tuple[int, ...], int]]:
        """(u, R) for `whole_nodes`: per kind profile u of at least two kinds, the fewest groups first, with
        N_u < P pipelines taking at least u whole in a node: R = P - N_u."""
        relaxation = self.relaxation
        per_node = list(self.node_groups().values())
        kinds = range(len(relaxation.kind_count))
        cases = sorted({u for profiles in relaxation.profiles.values() for u in profiles
                        if sum(1 for k in kinds if u[k]) >= 2}, key=lambda u: (sum(u), u))
        for u in cases:
            fits = sum(min(self.of_kind(groups, k) // u[k] for k in kinds if u[k]) for groups in per_node)
            if fits < pipelines:
                yield u, pipelines - fits

    def held_whole(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """`held` with its crossed branch also counting the pipelines of mixed kinds that fit whole in a
        node (`whole_nodes`), as `held_runs` counts the long runs: the case u whose table without
        crossed rings is the largest is the one used. 24-32-device seed 8138: seven fast-slow-fast
        pipelines, whose rings cross nodes unless a layer's seven holders share the one node of seven
        fast groups (`held`), and two of which cross nodes: 15.088774 -> 15.090784, its plan."""
        forced = self.forced(pipelines)
        if not forced:
            return 0.0
        cases = {}
        for u, rounds in self._whole_cases(pipelines):
            table = self.relaxation.coupled(pipelines, refine, forced=(0, rounds), whole=u)
            if table is not None:  # `whole_nodes`' own (cached)
                cases[u, rounds] = table[self.root]
        if not cases:
            return 0.0
        u, rounds = max(cases, key=cases.get)
        return self._held_branches(pipelines, refine, value, floor, forced, {"forced": (0, rounds), "whole": u})

    def _paired_cases(self, pipelines: int) -> Iterator[tuple[int, int, int, int, bool]]:
        """`paired`'s cases (kind k, s0 stages, c crossings, R pipelines forced, whether the runs bind):
        at least R of P pipelines are of another kind than k somewhere, shorter than s0 stages, or
        cross nodes at least c times."""
        relaxation = self.relaxation
        for kind in range(len(relaxation.kind_count)):
            of_kind = [self.of_kind(groups, kind) for groups in self.node_groups().values()]
            shared = sum(max(count - 1, 0) for count in of_kind)
            for stages in range(2, self.longest + 1):
                for crossings in range(-(-stages // relaxation.most_per_node), stages):
                    # fewer than c crossings: at most c runs in nodes, one of at least ceil(s0 / c) stages
                    run = -(-stages // crossings)
                    runs_in_nodes = sum(count // run for count in of_kind)
                    rounds = pipelines - min(shared // (stages - crossings), runs_in_nodes)
                    if rounds > 0:
                        yield kind, stages, crossings, rounds, runs_in_nodes < shared // (stages - 1)

    def paired_union(self, pipelines: int, refine: Deadline, value: float, floor: float,
                     union: tuple[int, ...]) -> float:
        """Floor of the plans of P pipelines whose boundaries lie in U (`union_rings`' sets) by `paired`'s
        argument, which holds for every plan: the coupled table on U's splits with U's rings and R
        pipelines of another kind somewhere, shorter than s0 stages or crossing nodes c times, the
        largest over `paired`'s cases, while below `floor`. `paired` alone lets each pipeline take the
        split that crosses cheapest, and `union_rings` alone keeps every boundary inside a node:
        32-64-device seed 365 (four fast pipelines, nodes of at most two fast groups, a 100 MB send
        before layer 3) had U = {2, 3} floored at 19.013760, one ring start-up below its optimum
        19.013880, the floor of U = {1, 2, 3}: of four three-stage fast pipelines 0-1 | 2 | 3, at most
        two keep a boundary inside a node."""
        best = value
        for kind, stages, crossings, rounds, _ in self._paired_cases(pipelines):
            if best >= floor:
                break
            table = self.relaxation.coupled(pipelines, refine, forced=(kind, rounds), paired=(crossings, stages),
                                            union=union)
            if table is None:
                break
            best = max(best, table[self.root])
        return best

    def limited_union(self, pipelines: int, refine: Deadline, value: float, floor: float,
                      union: tuple[int, ...]) -> float:
        """Floor of the plans of P pipelines whose boundaries lie in U (`union_rings`' sets) by the node
        limits of `long_runs` and `boundaries`, which hold for every plan whatever its boundaries: at
        most sum over nodes of f_k // L pipelines all of kind k run L stages in a row in one node, and
        at most sum over nodes of f_k // 2 send before a layer between two kind-k stages inside one (of
        kinds a and b: min(f_a, f_b), `_kept_cases`); so the coupled table on U's splits with U's rings
        and the other R pipelines forced (`short_runs`, `kept`), raised by `thresholds` on the same
        terms, the largest over those cases, while below `floor`. `union_rings` alone keeps every
        boundary inside a node, the node limits alone ring each stage once: 24-32-device seed 8052 (six
        fast pipelines, 0-1 | 2-3 beside 0 | 1-2 | 3, five nodes of two fast groups) was floored at
        18.121283 by U = {1, 2, 3}, whose rings price the sixth pipeline's send before layer 3 inside
        a node; it must cross (a run of two fast stages in one node takes one of those five nodes),
        18.121313, its plan. Seed 8174: two nodes hold a slow and a fast group, so two of four
        pipelines send before layer 1 across nodes from a slow stage to a fast one, and U = {1, 3, 4}
        rings layers 3 and 4-5 apart: 36.721690 -> 36.721810, its plan."""
        cases = itertools.chain(  # (forced kind and rounds, the case's own terms)
            (((kind, rounds), {"short_runs": length - 1}) for kind, rounds, length in self._run_limits(pipelines)),
            (((kept[1], rounds), {"kept": kept}) for kept, rounds in self._kept_cases(pipelines, union)))
        best = value
        for forced, terms in cases:
            if best >= floor:
                break
            table = self.relaxation.coupled(pipelines, refine, forced=forced, union=union, **terms)
            if table is None:
                return best
            best = max(best, table[self.root])
            if best < floor:
                best = max(best, self.thresholds(pipelines, refine, best, floor, forced=forced, union=union, **terms))
        return best

    def _least_extras(self, pipelines: int) -> dict[int, float]:
        """Per shortest stage count s of P pipelines: the ring and optimizer step one of its stages pays
        at least (`floor`'s counted form)."""
        grad = (self.model.workload.params * self.model.grad_bytes / self.tp).tolist()
        shards = self.model.optimizer_shards(pipelines)
        return {s: self.ring_bound(pipelines, _largest_stage(tuple(grad), s))
                + _largest_stage(tuple(self.relaxation.update), s) / shards
                for s in range(1, min(self.groups // pipelines, self.layers) + 1)}

    def long_runs(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """Floor of the plans of P pipelines from how few long runs of stages the nodes hold, while it may
        raise `value` below `floor`. A pipeline all of kind k whose stages run L or more in a row in one
        node takes L of that node's f_k kind-k groups for the run, and the pipelines' runs are disjoint,
        so at most x_L = sum over nodes of f_k // L pipelines have one; the other P - x_L are of another
        kind somewhere or hold no run longer than L - 1 (`coupled`'s `short_runs`: they cross nodes
        where such runs must end). `paired` counts the boundaries kept inside nodes, pooled over the
        nodes; and a crossing at a boundary of small sends is cheaper than one elsewhere, which a run
        length pins down. 32-64-device seed 380: eight six-stage fast pipelines, whose nodes keep 41 fast
        boundaries inside (enough for eight pipelines that never cross), but only three nodes hold six
        fast groups: five cross nodes. Seed 379: six five-stage fast pipelines, five nodes of four fast
        groups: the sixth cannot cross only after layer 0, where the send is smallest."""
        relaxation = self.relaxation
        best = 0.0
        for kind, rounds, length in self._run_limits(pipelines):
            if max(best, value) >= floor:
                break
            table = relaxation.coupled(pipelines, refine, forced=(kind, rounds), short_runs=length - 1)
            if table is None:
                return best
            best = max(best, table[self.root])
            if max(best, value) >= floor:
                break
            # or with the pipeline times counted by the shortest one's stage count (`paired`'s form: a
            # forced pipeline cannot then take a finer split for a smaller ring of its own)
            least = math.inf
            for shortest, paid in self._least_extras(pipelines).items():
                row = relaxation.paired_level(pipelines, shortest, refine, (kind, rounds), (0, 1), runs=length - 1)
                if row is None:
                    return best
                least = min(least, row[self.root] + paid)
            best = max(best, least)
        return best

    def _run_limits(self, pipelines: int) -> Iterator[tuple[int, int, int]]:
        """(kind k, P - x_L, run length L) for each k and L >= 2 with x_L = sum over nodes of f_k // L < P:
        at most x_L pipelines all of kind k run L stages in a row in one node (`long_runs`)."""
        per_node = self.node_groups()
        for kind in range(len(self.relaxation.kind_count)):
            held = [self.of_kind(groups, kind) for groups in per_node.values()]
            for length in range(min(max(held, default=0), self.longest), 1, -1):
                rounds = pipelines - sum(f // length for f in held)
                if rounds > 0:
                    yield kind, min(rounds, pipelines), length

    def boundaries(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """Floor of the plans of P pipelines from how few sends between stages of two kinds can stay in
        a node, while it may raise `value` below `floor`. A pipeline that sends before layer l between
        two stages of kind k inside a node puts two groups of kind k there, so at most the sum over the
        nodes of f_k // 2 pipelines do (of kinds a != b: a group of each, at most the sum of min(f_a,
        f_b)); each other one has no send there, a stage of another kind on one side of it, or sends it
        across nodes (`coupled`'s `kept`), which floors every plan of P pipelines (`_kept_cases`).
        8-24-device seed 769: six two-stage fast pipelines whose 100 MB send stays in a node beat the
        others by 0.018 s, and five fit in the nodes' fast groups (2, 2, 1, 2, 2, 1, 3)."""
        relaxation = self.relaxation
        best = 0.0
        for kept, rounds in self._kept_cases(pipelines, range(1, self.layers)):
            if max(best, value) >= floor:
                break
            table = relaxation.coupled(pipelines, refine, forced=(kept[1], rounds), kept=kept)
            if table is None:
                return best
            best = max(best, table[self.root], self.thresholds(pipelines, refine, max(best, value), floor,
                                                               forced=(kept[1], rounds), kept=kept))
        return best

    def _kept_cases(self, pipelines: int, layers: Iterable[int]) -> Iterator[tuple[tuple[int, ...], int]]:
        """(`kept`, R) for `boundaries`: per pair of kinds a <= b ((l, a) when a == b) whose pairs in the
        nodes (f_a // 2, or min(f_a, f_b), summed) are fewer than P, and per layer l whose send is faster
        inside a node, the largest gain first: at least R = P - that many pipelines send before l across
        nodes where that send is between stages of those kinds."""
        model, per_node = self.model, list(self.node_groups().values())
        gains = {layer: model.boundary_send_on(model.inter, layer - 1) - model.boundary_send_on(model.intra, layer - 1)
                 for layer in layers}
        kinds = range(len(self.relaxation.kind_count))
        for first, second in itertools.combinations_with_replacement(kinds, 2):
            inside = sum(self.of_kind(groups, first) // 2 if first == second else
                         min(self.of_kind(groups, first), self.of_kind(groups, second)) for groups in per_node)
            if inside >= pipelines:
                continue
            for layer in sorted(gains, key=gains.get, reverse=True):
                if gains[layer] <= 0:
                    break
                yield ((layer, first) if first == second else (layer, first, second)), pipelines - inside

    def union_rings(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """Floor of the plans of P pipelines by the union U of their boundaries, while it may raise
        `value` below `floor`. Every pipeline holds every layer, so layers l - 1 and l have the same
        holders unless some pipeline's stage starts at l (l in U): a stage holding layers f..e - 1
        reduces one group per run of them between U's boundaries (PerfModel.slot_reduce_times), each
        a ring of P replicas with its own latency, and every pipeline's boundaries lie in U. So the
        plans of union U are floored by `coupled` on the splits inside U with those rings (`union`),
        and every plan of P pipelines by the least over the 2^(L-1) sets U. While the least set is
        below `floor` it is raised by `thresholds` on its splits (the plan's largest ring + step
        against the slowest time), once each; a raised set at or below `value` ends it (it cannot
        raise `value`). The other floors ring each stage once: 24-32-device seed 3178's optimum has
        stages of one, three and five layers side by side (U = {3, 4, 5}), whose five-layer stage
        rings three groups, 2 x 8e-5 s of latency above `coupled`'s 34.942887; 3132's slowest
        pipeline rings less than another's three-layer stage of two groups."""
        if self.overlapped or self.layers < 2 or 2 ** (self.layers - 1) > UNION_SETS:
            return 0.0
        floors: dict[tuple[int, ...], float] = {}
        for size in range(self.layers):  # fewer boundaries first: fewer splits, and their tables often the least
            for union in itertools.combinations(range(1, self.layers), size):
                table = None if refine.expired() else self.relaxation.coupled(pipelines, refine, union=union)
                if table is None:
                    return 0.0
                floors[union] = table[self.root]
        raised: set[tuple[int, ...]] = set()
        while True:
            union = min(floors, key=floors.get)
            if floors[union] >= floor or union in raised or refine.expired():
                return floors[union]
            raised.add(union)
            floors[union] = max(floors[union], self.thresholds(pipelines, refine, value, floor, union=union))
            if floors[union] < floor:
                floors[union] = self.paired_union(pipelines, refine, floors[union], floor, union)
            if floors[union] < floor:
                floors[union] = self.limited_union(pipelines, refine, floors[union], floor, union)
            if floors[union] <= value:
                return floors[union]  # it cannot raise `value`

    def spans(self, pipelines: int, refine: Deadline, value: float, floor: float) -> float:
        """`_spans_pass` raised lazily: while its least case is below `floor` (the caller's cap) and not
        raised yet, that case is raised by the nodes its segments sit on (`_assigned`) and the pass is
        run again (its tables cached); so only cases that were the least get those tables (8-24-device
        seed 1502: raising every case below the least so far cost 1.5 s of tables for nothing). S empty is
        first floored by `columns` alone, and by the pairs of held layers too (`_spans_pass`' `empty`)
        once that is the least (24-32-device seed 3199: 0.4 s more tables; none where it is not). Each pass
        skips the cases an earlier one floored at or above its least so far (`known`: a case's floor only
        rises), so a pass after a raise builds only what the cases now below it need (24-32-device seed
        3152: 26 passes, each had run its 5,016 run-slot floors again)."""
        raised: dict[tuple, float] = {}
        known: dict[tuple, float] = {}
        empty = False
        while True:
            best, least = self._spans_pass(pipelines, refine, value, floor, raised, known, empty)
            if least == () and not empty and best < floor and not refine.expired():
                empty = True
                continue
            if not least or best >= floor or refine.expired():
                return best
            spanning, held_runs, crossed, sends, found = least
            if (spanning, crossed) in raised:
                return best
            raised[spanning, crossed] = self._assigned(pipelines, refine, spanning, held_runs, sends, found, floor)
            if raised[spanning, crossed] < floor:
                raised[spanning, crossed] = self._spans_union(pipelines, refine, spanning, held_runs, sends,
                                                              raised[spanning, crossed], floor)

    def _spans_pass(self, pipelines: int, refine: Deadline, value: float, floor: float, raised: dict[tuple, float],
                    known: dict[tuple, float], empty: bool = False) -> tuple[float, tuple | None]:
        """Floor of the plans of P pipelines by the set S of layers whose P holders span nodes, while it
        may raise `value`, with the least case (S, the held layers' runs, which pairs cross, the sends, its value;
        None when the least is no case's, () when it is S empty's `columns`), each case at least its `raised`
        value; S empty is a case only given `empty`, else `columns` alone floors it. S's rings
        cross (`coupled`'s `crossed`) and every other layer's holders sit in one node N_l of at least P
        groups. Two such layers l < l' with only layers of S between: on two nodes, no stage holds
        both (its group would be in both), so every pipeline sends before one of l + 1..l', across
        nodes; on one node N, it holds P holders of each and two groups of every pipeline that sends
        there, so at most e = (the most groups of a node) - P pipelines do, and at most e over a run
        of such pairs in one node. Per choice of those pairs crossed (C) or kept (the rest, in r
        runs): with e = 0 no pipeline sends within the kept ones, else at least P - e r pipelines send
        within none of them (`coupled`'s `pattern`), and P - e within none of one run's pairs, per run
        (32-64-device seed 1026: five pipelines on nodes of eight, runs 1-2 and 3-5: two hold each
        whole, 18.7074 -> 18.7872, its plan 18.8372); and the held layers fall into runs (joined by
        kept pairs), each on its own slot of a node, whose kinds force stages of another kind
        (`_run_slots`; one run: each held layer's P holders, one node's groups, have at least r of
        another kind than k, `forced`): the larger floors the plans of S and C. The least over S and
        C, the cheapest rings first: it stops once under `value`. S empty (every layer held) is also
        floored by `columns`, the larger kept: `columns` lets a node of g groups give each pipeline g - P +
        1 stages, the pairs count them over the pipelines (24-32-device seed 3199: four pipelines on nodes
        of 6, 6, 7 and 7 groups, layers 4 and 5 on one node leave at most three pipelines splitting them;
        P = 4-6 floored 17.3768-17.3789 by `columns`, now 17.4758-17.4779, and the plan's 17.421962 of
        eight pipelines is proven). 8-24-device seed 63: four pipelines on nodes of four groups (at most three fast), 1 Gb/s
        between nodes: letting the 100 M-parameter layer 4 span alone keeps layers 0-3 in nodes."""
        if self.layers > SINGLE_LAYERS:
            return 0.0, None
        every = self.relaxation.coupled(pipelines, refine, crossed=tuple(range(self.layers)))
        if every is None or every[self.root] <= value:
            return 0.0, None  # S = every layer (no held layer) is one of the least's terms already
        columns = self.columns(pipelines, refine, floor)  # S empty: every plan of it is at least this
        # a case at the floor (the caller's cap) is not raised further
        best, least_case = (min(every[self.root], floor), None) if empty or every[self.root] <= columns else \
            (min(columns, floor), ())
        spare = self.most_per_node - pipelines
        grad = self.relaxation.grad
        subsets = sorted((chosen for size in range(0 if empty else 1, self.layers + 1)
                          for chosen in itertools.combinations(range(self.layers), size)),
                         key=lambda chosen: (sum(grad[layer] for layer in chosen), chosen))
        for spanning in subsets:
            if best <= value:
                break
            plain = self.relaxation.coupled(pipelines, refine, crossed=spanning)  # every plan of S: at least this
            if plain is None:
                return 0.0, None
            if plain[self.root] >= best:
                continue
            held = [layer for layer in range(self.layers) if layer not in spanning]
            pairs = [tuple(range(first + 1, second + 1)) for first, second in zip(held, held[1:])]  # the sends between
            for crossed in itertools.product((False, True), repeat=len(pairs)):
                if len(held) - crossed.count(False) > self.column_room(pipelines):
                    continue  # more node runs of held layers than the nodes hold apart: no such plan
                sends = tuple(pair for pair, across in zip(pairs, crossed) if across)
                kept = tuple(layer for pair, across in zip(pairs, crossed) if not across for layer in pair)
                runs = sum(1 for i, across in enumerate(crossed) if not across and (i == 0 or crossed[i - 1]))
                barred, alone, rounds = (kept, (), 0) if spare == 0 or not kept else \
                    ((), kept, max(pipelines - spare * runs, 0))
                pattern = (sends, barred, alone if rounds else ()) if sends or barred or rounds else None
                # each held run on its own slot of a node (one run: `forced`'s per layer), first on tables
                # shared by every S and C (without their rings and sends): it often decides alone
                bounds = [0] + [i + 1 for i, across in enumerate(crossed) if across] + [len(held)]
                held_runs = [held[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
                if known.get((spanning, crossed), -math.inf) >= best:
                    continue  # floored by an earlier pass at the least so far or above (`spans`)
                slots = self._run_slots(pipelines, refine, held_runs, 0.0, best)
                if slots >= best:
                    known[spanning, crossed] = slots
                    continue
                table = self.relaxation.coupled(pipelines, refine, forced=(0, rounds), crossed=spanning, pattern=pattern)
                if table is None:
                    return 0.0, None
                found = max(table[self.root], plain[self.root], raised.get((spanning, crossed), 0.0),
                            0.0 if spanning else columns)
                if runs > 1 and 0 < spare < pipelines and found < best:
                    found = max(found, self.each_kept_run(pipelines, refine, spanning, sends, pairs, crossed, spare))
                # a held layer next to a spanning one: some pipeline holds that one off the held one's
                # node, so it sends across nodes between them (the largest sends first)
                edges = sorted({layer + 1 for layer in held if layer + 1 in spanning}
                               | {layer for layer in held if layer - 1 in spanning},
                               key=lambda edge: -self.model.workload.boundary_bytes_per_sample[edge - 1])
                for edge in edges:
                    if found >= best:
                        break
                    table = self.relaxation.coupled(pipelines, refine, forced=(0, 1), crossed=spanning,
                                                    pattern=(sends, barred, (), ((edge,),)))
                    if table is None:
                        return 0.0, None
                    found = max(found, table[self.root])
                if found < best:
                    found = self._run_slots(pipelines, refine, held_runs, found, best, crossed=spanning,
                                            pattern=(sends, barred, ()) if sends or barred else None)
                if found < best:
                    found = self._node_runs(pipelines, refine, held_runs, found, best, crossed=spanning,
                                            pattern=(sends, barred, ()) if sends or barred else None)
                if found < best:
                    found = self._packed_holders(pipelines, refine, held_runs, self.root, found, best, crossed=spanning,
                                                 pattern=(sends, barred, ()) if sends or barred else None)
                known[spanning, crossed] = found  # every table above floors the plans of this case
                if found < best:
                    best, least_case = found, (spanning, held_runs, crossed, sends, found)
                if best <= value:
                    break
        return best, least_case

    def _spans_union(self, pipelines: int, refine: Deadline, spanning: tuple[int, ...], segments: list[list[int]],
                     sends: tuple[tuple[int, ...], ...], found: float, best: float) -> float:
        """`spans`' case (S spanning, sends C across nodes, held segments) raised by the union U of the
        plan's boundaries (`union_rings`' argument), at least `found`: the least over U of the coupled
        table with S's rings across, C's sends and U's splits and rings (`coupled`'s `union` with
        `crossed`: a stage holding layers of several runs between U's boundaries reduces each run with
        its own ring, across nodes when the run holds a layer of S), raised per segment by `_assigned`'s
        isolation on any node: its P holders take P of a node's groups, at most e = (the most groups of
        a node) - P left, so at least P - e pipelines cross nodes at both boundaries of the stage holding
        its first layer. `found` when a table is out of reach or U's sets are too many. Each alone misses
        the other: `spans` rings a stage's layers once, `union_rings` keeps every ring inside a node.
        24-32-device seed 6139 (four pipelines, nodes of 5, 5, 6, 6 groups): S = {2, 4, 5} floored
        24.192158 with layers 4-5 on one stage (one ring across) in every pipeline; U = {1, .., 4} (no
        pipeline splits 4-5) is 24.192473 with two pipelines isolating layer 3, U = {1, .., 5} (the
        4-5 stages ring twice) 24.192278, its optimum."""
        if self.overlapped or 2 ** (self.layers - 1) > UNION_SETS:
            return found
        relaxation = self.relaxation
        pattern = (sends, (), ()) if sends else None
        isolated = max(pipelines - (self.most_per_node - pipelines), 0)
        least = best
        for size in range(self.layers):
            for union in itertools.combinations(range(1, self.layers), size):
                table = relaxation.coupled(pipelines, refine, crossed=spanning, pattern=pattern, union=union)
                if table is None:
                    return found
                value = table[self.root]
                for segment in segments if isolated else []:
                    if value >= least:
                        break
                    table = relaxation.coupled(pipelines, refine, forced=(0, isolated), crossed=spanning,
                                               isolate=((segment[0],), 1), pattern=pattern, union=union)
                    if table is None:
                        return found
                    value = max(value, table[self.root])
                least = min(least, value)
                if least <= found:
                    return found
        return max(found, least)

    def _assigned(self, pipelines: int, refine: Deadline, spanning: tuple[int, ...], segments: list[list[int]],
                  sends: tuple[tuple[int, ...], ...], found: float, best: float) -> float:
        """`spans`' case (S, which pairs of held layers cross) raised by the nodes its segments sit on (as
        `found` when a table is out of reach): held layers joined by kept pairs form a segment, whose holders
        are one node X's groups, so at most e(X) = (X's groups) - P pipelines send within it and at least
        r = P - (X's groups of kind k) of each layer's holders are of another kind than k (`spans` takes
        the largest node and the largest f_k for every segment). Two segments on one node take 2P of its
        groups (a stage holding layers of both would hold the segment between them, on another node), and
        segments next to each other sit on different nodes. Per assignment of the segments to nodes (nodes of
        equal e and r alike): the pattern table with no pipeline sending within the segments of e = 0 and at
        least P - (the sum of the others' e) within none (`coupled`'s `pattern`), and each segment's
        layers' `held` tables, and at least P - e(X) pipelines isolating the stage holding the segment's
        first layer (its P holders are P of X's groups, each one pipeline's stage: a pipeline with a stage
        next to it on X takes one of the e(X) others, so the rest cross nodes at every boundary it has,
        `coupled`'s `isolate`; 24-32-device seed 3253, layer 0 on a node of seven groups, P = 7: 22.2225
        -> 22.2405, a hand plan's step); the least over the assignments (at least `found`, the case's
        floor so far: it stops once there), each table only while under `best`. 8-24-device
        seed 873 (P = 4, nodes of 4 and 5 groups, one of four fast): layers 0-2 kept in a node, layer 3 in
        another, layer 4 spanning floored 21.138 as if on the largest node and the fastest; as assigned,
        23.74 (every plan of four pipelines: at least 21.6, the optimum 21.154 has six)."""
        relaxation = self.relaxation
        kinds = range(len(relaxation.kind_count))
        # the wide nodes by what the tables see of them, (e, r per kind): how many, how many segments they hold
        nodes: Counter = Counter()
        room: Counter = Counter()
        for groups in self.node_groups().values():
            size = sum(groups.values())
            if size >= pipelines:
                profile = (size - pipelines, tuple(max(pipelines - self.of_kind(groups, k), 0) for k in kinds))
                nodes[profile] += 1
                room[profile] += size // pipelines
        inner = [tuple(layer for first, second in zip(segment, segment[1:]) for layer in range(first + 1, second + 1))
                 for segment in segments]  # the sends within each segment
        values: dict[tuple, float] = {}

        def value(profile: tuple[tuple[int, tuple[int, ...]], ...]) -> float | None:
            """The largest table for segments with these (e, r per kind)."""
            if profile in values:
                return values[profile]
            barred = tuple(sorted(layer for (e, _), pairs in zip(profile, inner) if e == 0 for layer in pairs))
            alone = tuple(sorted(layer for (e, _), pairs in zip(profile, inner) if e > 0 for layer in pairs))
            rounds = max(pipelines - sum(e for (e, _), pairs in zip(profile, inner) if e > 0 and pairs), 0) \
                if alone else 0
            pattern = (sends, barred, alone if rounds else ()) if sends or barred or rounds else None
            table = relaxation.coupled(pipelines, refine, forced=(0, rounds), crossed=spanning, pattern=pattern)
            if table is None:
                return None
            largest = table[self.root]
            plain = (sends, barred, ()) if sends or barred else None
            for (_, others), segment in zip(profile, segments):
                for kind, layer in itertools.product(kinds, segment):
                    if largest >= best or others[kind] <= 0:
                        continue
                    table = relaxation.coupled(pipelines, refine, forced=(kind, min(others[kind], pipelines)),
                                               crossed=spanning, held=((layer,), 1), pattern=plain)
                    if table is None:
                        return None
                    largest = max(largest, table[self.root])
            for (e, _), segment in zip(profile, segments):
                if largest >= best or e >= pipelines:
                    continue
                # the segment's P holders take P of its node's groups, e left: at most e pipelines have
                # another stage there, so at least P - e hold the segment's stage off-node at both its
                # boundaries (a one-stage pipeline has none: `isolate` leaves it free)
                table = relaxation.coupled(pipelines, refine, forced=(0, pipelines - e), crossed=spanning,
                                           isolate=((segment[0],), 1), pattern=plain)
                if table is None:
                    return None
                largest = max(largest, table[self.root])
            if largest < best:
                together = self._isolated_together(pipelines, refine, spanning, profile, segments, plain)
                if together is None:
                    return None
                largest = max(largest, together)
            values[profile] = largest
            return largest

        least = [best]
        used: Counter = Counter()
        order = sorted(nodes, key=lambda node: (-node[0], sum(node[1])))  # the least constrained first: early stops

        def assign(j: int, previous: tuple | None, profile: tuple) -> bool:
            """Segments j.. on nodes (False when a table is out of reach)."""
            if least[0] <= found:
                return True  # an assignment no better than the case's floor so far: nothing to gain
            if j == len(segments):
                reached = value(profile)
                if reached is None:
                    return False
                least[0] = min(least[0], reached)
                return True
            for node in order:
                if used[node] == room[node] or (node == previous and nodes[node] < 2):
                    continue
                used[node] += 1
                fine = assign(j + 1, node, profile + (node,))
                used[node] -= 1
                if not fine:
                    return False
            return True
        if not assign(0, None, ()):
            return found
        return max(found, least[0])

    def _isolated_together(self, pipelines: int, refine: Deadline, spanning: tuple[int, ...],
                           profile: tuple[tuple[int, tuple[int, ...]], ...], segments: list[list[int]],
                           plain: tuple | None) -> float | None:
        """`_assigned`'s isolated stages of every segment on a node of exactly P groups at once (0 when
        fewer than two such; None when the table is out of reach). Such a segment's holders are all its
        node's groups, so every pipeline holds it on a stage whose both boundaries cross nodes; two
        segments never share a stage (`column_room`), so every pipeline has all those stages isolated
        together (`coupled`'s `isolate` with q = their number), where `_assigned` took the largest of
        one segment at a time. 24-32-device seed 6127 (three pipelines, nodes of at most three groups):
        layers 2 and 4 held on the nodes of three fast groups each isolate a stage, four 1 MB sends
        across nodes: 22.593921 -> 22.597941, its optimum."""
        whole = tuple(segment[0] for (e, _), segment in zip(profile, segments) if e == 0)
        if len(whole) < 2:
            return 0.0
        terms = {"forced": (0, pipelines), "crossed": spanning, "isolate": (whole, len(whole)), "pattern": plain}
        table = self.relaxation.coupled(pipelines, refine, **terms)
        if table is None or self.overlapped or 2 ** (self.layers - 1) > UNION_SETS:
            return None if table is None else table[self.root]
        # and per union U of the boundaries (`union_rings`): U's rings, the largest against the slowest time
        # (`thresholds`); the least over U (32-64-device seed 9180: a four-stage pipeline beside five-stage
        # ones rings layers 0 and 1 of its first stage apart, one across nodes: 17.042170 -> 17.046700)
        least = math.inf
        for size in range(self.layers):
            for union in itertools.combinations(range(1, self.layers), size):
                found = self.relaxation.coupled(pipelines, refine, union=union, **terms)
                if found is None:
                    return table[self.root]
                value = found[self.root]
                if value < least:
                    value = max(value, self.thresholds(pipelines, refine, value, least, union=union, **terms))
                least = min(least, value)
                if least <= table[self.root]:
                    return table[self.root]
        return max(table[self.root], least)

    def _run_slots(self, pipelines: int, refine: Deadline, runs: list[list[int]], low: float, best: float,
                   state: int | None = None, crossed: tuple[int, ...] = (), pattern: tuple | None = None) -> float:
        """Floor of the plans of P pipelines whose held layers (every layer's P holders on one node) fall
        into these R runs, each run on one node, two runs next to each other on two nodes (`spans`'
        held layers joined by its kept pairs; `columns`' runs), raised from `low` up to `best` at most:
        inf when the runs fit no nodes. Two runs sit on two nodes or have disjoint holders (a group
        holding layers of both would hold the layers between, among them a run's on another node), so a
        node of n groups holds at most n // P runs: each run takes its own slot, the nodes counted
        n // P times. A run on a slot of f_k kind-k groups has, at each of its layers, d = P - f_k
        holders of another kind, one per pipeline; with T(d, run) the largest over the run's layers of
        the coupled table with d pipelines whose stage holding that layer is of another kind (`local`'s),
        every plan takes at least the largest T over its runs, so at least the least over the ways to
        give the R runs R of the slots (the R smallest d serve every best way) of that largest. Per kind,
        the tables with the caller's `crossed` and `pattern`, read at `state` (the groups the plans run
        on). 32-64-device seed 324: six pipelines on four nodes of which only one holds six fast groups;
        runs 1-2 | 3 | 4-5 (layer 0 spanning) put slow holders on two of the three runs: 20.1433 ->
        21.4632, its plan."""
        relaxation, per_node = self.relaxation, self.node_groups()
        state = self.root if state is None else state
        found = low
        for kind in range(len(relaxation.kind_count) if len(relaxation.kind_count) > 1 else 0):
            if (pipelines, kind) not in self._slot_deficits:
                self._slot_deficits[pipelines, kind] = sorted(
                    max(pipelines - self.of_kind(groups, kind), 0) for groups in per_node.values()
                    for _ in range(sum(groups.values()) // pipelines))
            deficits = self._slot_deficits[pipelines, kind][:len(runs)]
            if len(deficits) < len(runs):
                return math.inf  # no R runs fit the nodes
            if deficits[-1] == 0:
                continue
            costs: dict[tuple[int, int], float] = {}

            def cost(d: int, run: int) -> float | None:
                """T(d, run), up to `best`: 0 for d = 0; None when a table is out of reach."""
                if d == 0:
                    return 0.0
                if (d, run) not in costs:
                    worst = 0.0
                    for layer in runs[run]:
                        table = relaxation.coupled(pipelines, refine, forced=(kind, d), crossed=crossed,
                                                   held=((layer,), 1), pattern=pattern)
                        if table is None:
                            return None
                        worst = max(worst, table[state])
                        if worst >= best:
                            break
                    costs[d, run] = min(worst, best)
                return costs[d, run]

            least = math.inf
            for order in itertools.permutations(range(len(runs))):  # run order[i] on the slot of deficits[i]
                worst = _largest_below((cost(d, run) for d, run in zip(deficits, order)), least)
                if worst is None:
                    return found
                least = min(least, worst)
                if least <= found:
                    break  # this kind raises nothing
            found = max(found, least)
            if found >= best:
                break
        return found

    def _node_runs(self, pipelines: int, refine: Deadline, held_runs: list[list[int]], low: float, best: float,
                   state: int | None = None, split: tuple[bool, ...] = (), **where: Any) -> float:
        """`_run_slots`' floor with each node's kind-k groups shared by the runs it holds (tables: `coupled` with
        `where`, at `state`), raised from `low` up to `best` at most. A run's holders A_r are groups of its
        node, disjoint from other runs' (`_run_slots`), at least P of them, 2P for a run of several layers
        that every pipeline holds on two stages or more (`split[r]`: the caller floors the other plans). The
        runs on a node of n groups, f of kind k, then fit its n groups; give each run a_r <= |A_r| of the f
        (sum <= f): at each of its layers P - a_r holders, one per pipeline, are of another kind (`_run_slots`'
        T(P - a_r, run), which only grows with the count: fewer plans), and with `split` one of its stages
        at least is when a_r < 2P (`coupled`'s `held` on the run's layers). Every plan takes the largest such
        T over its runs, so at least the least, over the ways to put the runs on the nodes and to share each
        node's f among them, of that largest (a min-max over the nodes and the sets of runs placed).
        `_run_slots` gives each of a node's n // P slots the node's whole f. 32-64-device seed 367 (four
        pipelines; nodes of 8, 7, 7 and 8 groups, 5, 3, 3 and 5 fast): with layer 0 across nodes, the held
        layers 1 | 2 | 3 | 4 had two runs on each node of five fast groups, each counted all fast.
        A run of several held layers given a_r < 2P kind-k groups: a pipeline all of kind k that sends
        within it (a boundary between its first and last layer) holds its layers on two stages at least,
        two kind-k groups of A_r, and one that does not, one; with Q pipelines all of kind k, a of them
        sending there, Q + a <= a_r and a <= Q, so 2a <= a_r: at least P - a_r // 2 pipelines have a
        stage of another kind or send within none of the run (`coupled`'s `pattern` G with
        `kind_alone`), where the layers' holders alone let every pipeline split it (24-32-device seed
        3200: four pipelines of one micro-batch, runs 0-1 | 2-3 | 4 | 5 with every layer its own stage
        split two runs on nodes of eight groups, but one node alone holds eight fast ones; its plan
        16.61175 splits one of them, the floor stayed at 16.60889)."""
        relaxation, per_node = self.relaxation, self.node_groups()
        state = self.root if state is None else state
        count, found = len(held_runs), low
        demand = [pipelines * (2 if split and split[r] and len(run) >= 2 else 1) for r, run in enumerate(held_runs)]
        # kind-k holders that can lower a run's floor: up to 2P - 1 for a run of several layers (the sends
        # within it, above), up to P for one layer
        useful = [max(demand[r], 2 * pipelines if len(run) >= 2 else pipelines) for r, run in enumerate(held_runs)]
        inner = [tuple(range(run[0] + 1, run[-1] + 1)) for run in held_runs]  # the sends within each run
        pattern = where.get("pattern")
        others = {key: term for key, term in where.items() if key != "pattern"}
        tables: dict[tuple, float] = {}
        alone_tables: dict[tuple[int, int, tuple[int, ...]], float] = {}  # `alone_value`'s
        shares: dict[tuple, float] = {}  # per (kind, its groups on a node, runs there): `shared`'s

        def table_value(kind: int, rounds: int, held: tuple[tuple[int, ...], int]) -> float | None:
            """One coupled table at `state`, cached; None when out of reach."""
            if (kind, rounds, held) not in tables:
                table = relaxation.coupled(pipelines, refine, forced=(kind, rounds), held=held, **where)
                if table is None:
                    return None
                tables[kind, rounds, held] = table[state]
            return tables[kind, rounds, held]

        def cost(kind: int, given: int, run: int) -> float | None:
            """Run `run`'s floor with `given` of its holders of kind k, up to `best`; None: out of reach."""
            worst = 0.0
            if given < demand[run] and demand[run] > pipelines:
                value = table_value(kind, 1, (tuple(held_runs[run]), 1))
                if value is None:
                    return None
                worst = value
            for layer in held_runs[run] if given < pipelines else ():
                if worst >= best:
                    break
                value = table_value(kind, pipelines - given, ((layer,), 1))
                if value is None:
                    return None
                worst = max(worst, value)
            if inner[run] and given // 2 < pipelines and worst < best:
                value = alone_value(kind, pipelines - given // 2, inner[run])
                if value is None:
                    return None
                worst = max(worst, value)
            return min(worst, best)

        def alone_value(kind: int, rounds: int, sends: tuple[int, ...]) -> float | None:
            """The table with `rounds` pipelines that have a stage of another kind than k or send before
            none of `sends`, at `state`, cached; None when out of reach."""
            if (kind, rounds, sends) not in alone_tables:
                # the caller's sends across (C) and barred (F); its G, if any, is for forced pipelines of its own
                sent, barred = pattern[:2] if pattern is not None else ((), ())
                table = relaxation.coupled(pipelines, refine, forced=(kind, rounds), kind_alone=True,
                                           pattern=(sent, barred, sends), **others)
                if table is None:
                    return None
                alone_tables[kind, rounds, sends] = table[state]
            return alone_tables[kind, rounds, sends]

        def shared(kind: int, fast: int, members: tuple[int, ...]) -> float | None:
            """The least largest cost over the ways to give a node's `fast` kind-k groups to these runs."""
            if (kind, fast, members) in shares:
                return shares[kind, fast, members]
            least = math.inf
            total = min(fast, sum(useful[r] for r in members))
            for given in itertools.product(*(range(min(useful[r], fast) + 1) for r in members)):
                if sum(given) != total:
                    continue  # more kind-k holders never cost more: only the shares of all of them
                worst = _largest_below((cost(kind, share, run) for run, share in zip(members, given)), least)
                if worst is None:
                    return None
                least = min(least, worst)
            shares[kind, fast, members] = least
            return least

        nodes = [(sum(groups.values()), groups) for groups in per_node.values()]
        need = [sum(demand[r] for r in range(count) if mask >> r & 1) for mask in range(1 << count)]
        for kind in range(len(relaxation.kind_count) if len(relaxation.kind_count) > 1 else 0):
            least = {0: 0.0}  # per set of runs placed on the nodes so far: the least largest cost
            for size, groups in nodes:
                fast, grown = self.of_kind(groups, kind), dict(least)
                for placed, value in least.items():
                    free = ((1 << count) - 1) & ~placed
                    here = free
                    while here:
                        if need[here] <= size and value < grown.get(placed | here, math.inf):
                            node_value = shared(kind, fast, tuple(r for r in range(count) if here >> r & 1))
                            if node_value is None:
                                return found
                            if max(value, node_value) < grown.get(placed | here, math.inf):
                                grown[placed | here] = max(value, node_value)
                        here = (here - 1) & free
                least = grown
                if refine.expired():
                    return found
            found = max(found, least.get((1 << count) - 1, math.inf))
            if found >= best:
                return best
        return found

    def column_room(self, pipelines: int) -> int:
        """How many runs of held layers (`spans`: layers whose P holders share a node, consecutive
        held layers on one node forming a run) the nodes can hold: sum over nodes of n // P. Two runs
        on one node use disjoint groups (a group holding layers of both would also hold the run
        between them, on another node), P a run. 24-32-device seed 3113: with layer 0 spanning,
        layers 1-5 held on nodes of 7, 5, 7 and 7 groups by four pipelines need a kept pair."""
        return sum(sum(groups.values()) // pipelines for groups in self.node_groups().values())

    def each_kept_run(self, pipelines: int, refine: Deadline, spanning: tuple[int, ...],
                      sends: tuple[tuple[int, ...], ...], pairs: list[tuple[int, ...]], crossed: tuple[bool, ...],
                      spare: int) -> float:
        """`spans`' floor of one (S, C) choice with r >= 2 kept runs, run by run: the pooled count
        (P - e r pipelines send within none of the runs) is empty once e r >= P, but each run's
        held layers share one node of at most P + e groups, so at least P - e pipelines send within
        none of that run alone: they hold its layers, from the held layer before it to its last, in
        one stage, which must fit memory (`coupled`'s splits fit the relaxed memory of their kinds).
        The largest of the r tables (each floors every plan of S and C); 0 when one is out of reach.
        24-32-device seed 3000: layers 3 and 4 (9.6 and 6.4 GB of state) kept in one node of five
        groups would need one of three pipelines to hold both on a fast device of 10.4 GiB; 32-64-device
        seed 1026: five pipelines on nodes of eight, runs 1-2 and 3-5, two hold each whole (18.7074 -> 18.7872)."""
        best, run = 0.0, ()
        for pair, across in zip(pairs + [()], crossed + (True,)):
            if not across:
                run += pair
                continue
            if run:
                table = self.relaxation.coupled(pipelines, refine, forced=(0, pipelines - spare), crossed=spanning,
                                                pattern=(sends, (), run))
                if table is None:
                    return 0.0
                best = max(best, table[self.root])
            run = ()
        return best

    def thresholds(self, pipelines: int, refine: Deadline, value: float, floor: float,
                   union: tuple[int, ...] | None = None, crossed: tuple[int, ...] = (), **terms: Any) -> float:
        """Floor of the plans of P pipelines with the slowest time and the largest all-reduce + step
        taken apart but on the same splits: a plan whose largest split value (its pipeline's stage
        ring + step, `coupled`'s) is E runs every pipeline on a split of value at most E, so its step
        is at least T(E) + E, T(E) the least makespan on such splits (`coupled`'s `ring_cap`); the
        least over the values E, ascending, stopped once E + T(inf) reaches it or `floor` (the rest
        are at least that). `coupled` charges each pipeline its own split's ring, so a fast split of
        large stages in one pipeline beside small stages elsewhere was priced below either (8-24-device
        seed 769: one pipeline holding layers 1-2 in one stage saves a 100 MB send, 9.4447 + 0.2134 s,
        while the plan's ring is then that stage's, 0.13 s more). `terms` (`forced`, `kept`, `paired`,
        `short_runs`, `isolate`, `pattern`): `coupled`'s, which every plan of the case meets (`boundaries`,
        `paired`, `limited_union`, `_isolated_together` take this form too); `union`: the same over the
        splits inside U with U's rings (`union_rings`); `crossed`: with those layers' rings across nodes
        (the values E are then those of the splits with those rings)."""
        relaxation = self.relaxation
        if (union is not None or crossed) and relaxation.coupled(pipelines, refine, union=union, crossed=crossed) is None:
            return 0.0  # its values are kept by that table
        values = relaxation.extra_values.get(relaxation.values_key(pipelines, union, crossed))
        free = relaxation.coupled(pipelines, refine, ring_cap=math.inf, union=union, crossed=crossed, **terms) \
            if values else None
        if free is None:
            return 0.0
        base, best = free[self.root], math.inf
        for cap in values:
            least = cap + base  # every cap from here on gives at least this
            if least >= min(best, floor):
                return min(best, least)
            table = relaxation.coupled(pipelines, refine, ring_cap=cap, union=union, crossed=crossed, **terms)
            if table is None:
                return min(best, least)
            best = min(best, cap + table[self.root])
            if best <= value:
                return best  # it cannot raise `value`
        return best

    def columns(self, pipelines: int, refine: Deadline, cap: float = math.inf) -> float:
        """Floor of the plans of P pipelines in which every layer's P holders share a node (0 when
        the first two tables are out of reach, K > 1 taken together when a later one is). No pipeline runs more than a node's groups - P + 1 stages in
        one node and every stage sits in a node of at least P groups (`floor`). The layers then
        fall into K runs on one node each, every pipeline crossing nodes between two runs: K - 1
        crossings each, on groups of at most K of those nodes (per device type, at most its K
        largest counts there). K = 1: the plan runs on one node's groups (seed 154's nodes hold at
        most four of its eleven fast groups); seed 120's two four-stage pipelines on nodes of at
        most three fast groups must cross at every boundary (the floor had let them cross once).
        Each run's layer has its P holders on the run's node, so a node of n groups holds at most n // P
        runs, and a run on a node of f_k < P groups of kind k has P - f_k holders of another kind, in
        as many pipelines: with the nodes counted n // P times each, some run sits on one whose f_k is at
        most the K-th largest, so that many pipelines are not all of kind k (`coupled`'s `forced`;
        32-64-device seed 356: seven pipelines, K = 4 and 5 runs need a node of six fast groups).
        """
        runs = self.most_per_node - pipelines + 1
        relaxation, per_node = self.relaxation, self.node_groups()
        wide = [node for node, groups in per_node.items() if sum(groups.values()) >= pipelines]
        one_node, crossing = (relaxation.coupled(pipelines, refine, runs, least) for least in (0, 1))
        if one_node is None or crossing is None:
            return 0.0
        best = min(one_node[self.state_of(per_node[node])] for node in wide)
        # every K > 1 at once (one crossing, every wide node): what holds if the deadline stops the rest
        rough = min(best, crossing[self.state_of(sum((per_node[node] for node in wide), Counter()))])
        room = sum(sum(per_node[node].values()) for node in wide)
        for segments in range(2, min(self.layers, room // pipelines) + 1):  # a node may hold several runs
            table = relaxation.coupled(pipelines, refine, runs, segments - 1)
            if table is None:
                return rough
            most: Counter = Counter()  # per kind: its groups on the (at most) `segments` nodes holding most of it
            for kind in range(len(relaxation.kind_count)):
                held = sorted((self.of_kind(per_node[node], kind) for node in wide), reverse=True)
                most[kind] = sum(held[:segments])
            state = sum(relaxation.stride[kind] * n for kind, n in most.items())
            value = table[state]
            for kind in range(len(relaxation.kind_count) if value < best else 0):
                slots = sorted((self.of_kind(per_node[node], kind)
                                for node in wide for _ in range(sum(per_node[node].values()) // pipelines)),
                               reverse=True)
                if len(slots) < segments:
                    value = math.inf  # no K runs fit the nodes
                    break
                others = pipelines - slots[segments - 1]
                forced = relaxation.coupled(pipelines, refine, runs, segments - 1, forced=(kind, min(others, pipelines))) \
                    if others > 0 else None
                if forced is not None:
                    value = max(value, forced[state])
            if value < min(best, cap):
                value = self._held_columns(pipelines, refine, runs, segments, state, value, min(best, cap))
            if value < min(best, cap):
                value = self._packed_runs(pipelines, refine, runs, segments, state, value, min(best, cap))
            if value < min(best, cap):
                value = self._summed_deficits(pipelines, refine, runs, segments, state, value, min(best, cap))
            if value < min(best, cap):
                value = self._split_runs(pipelines, refine, runs, segments, state, value, min(best, cap))
            best = min(best, value)
        return best

    def _held_columns(self, pipelines: int, refine: Deadline, runs: int, segments: int, state: int,
                      value: float, best: float) -> float:
        """The column floor of K runs (`columns`: `value` at `state`) raised by each layer's holders: they
        are one node's groups, so at least r of them are of another kind than k (`forced`; `coupled`'s
        `held`), for every layer at once (the largest table counts), while below `best` (the least over K
        so far). 8-24-device seed 63: four pipelines on the two nodes of four groups, at most three fast:
        layers 0-3 on one stage of every pipeline, layer 4 on another, let every slow stage hold layer 4
        alone (24.337); a slow holder of layers 0-3 costs 28.47 s, every plan of four pipelines 25.23."""
        for layer, (kind, rounds) in itertools.product(range(self.layers), self.forced(pipelines)):
            if value >= best:
                break
            table = self.relaxation.coupled(pipelines, refine, runs, segments - 1, forced=(kind, rounds),
                                            held=((layer,), 1))
            if table is None:
                break
            value = max(value, table[state])
        return value

    def _summed_deficits(self, pipelines: int, refine: Deadline, runs: int, segments: int, state: int,
                         value: float, best: float) -> float:
        """The column floor of K runs (`columns`: `value` at `state`) raised by the holders of another kind
        summed over the runs, while below `best`. Run r sits on its own slot of a node (`_run_slots`: the
        nodes counted n // P times) of f_r kind-k groups, so at each of its layers d_r = P - f_r holders,
        in as many pipelines, are of another kind; so the plan has D >= the sum of the K least slot deficits
        (stage, run) pairs of another kind, on distinct stages (two runs never share a stage, `column_room`).
        Either no pipeline has two of them, and D <= P pipelines each have a stage of another kind, or one
        pipeline has at least two such stages: the lesser of those two coupled tables (`both`'s argument).
        `columns`' own forced count takes only the K-th slot's deficit, `_run_slots` one run at a time.
        24-32-device seed 6016: three pipelines on nodes of at most three fast groups but one of four, five
        one-layer runs put slow holders on two of them: the plans of three pipelines 12.648 -> 12.896."""
        relaxation, per_node = self.relaxation, self.node_groups()
        every = tuple(range(self.layers))
        for kind in range(len(relaxation.kind_count) if len(relaxation.kind_count) > 1 else 0):
            deficits = sorted(max(pipelines - self.of_kind(groups, kind), 0) for groups in per_node.values()
                              for _ in range(sum(groups.values()) // pipelines))[:segments]
            if len(deficits) < segments:
                return math.inf  # no K runs fit the nodes
            summed = max(sum(deficits), self._node_deficit(pipelines, kind, segments))
            if summed < 2 or summed <= deficits[-1]:
                continue  # at most one run's deficit: `columns`' own forced table counts it
            spread = relaxation.coupled(pipelines, refine, runs, segments - 1, forced=(kind, summed)) \
                if summed <= pipelines else [math.inf] * (state + 1)
            doubled = relaxation.coupled(pipelines, refine, runs, segments - 1, forced=(kind, 1), held=(every, 2))
            if spread is None or doubled is None:
                return value
            value = max(value, min(spread[state], doubled[state]))
            if value >= best:
                break
        return value

    def _node_deficit(self, pipelines: int, kind: int, segments: int) -> int:
        """Fewest holders of another kind than `kind` that K = `segments` runs of held layers (`columns`) have
        in all, their nodes taken together: the j runs on a node have disjoint holders (two runs never share a
        stage, `column_room`), j P groups of the node, of which at most its f kind-k groups are of kind k, so
        at least max(j P - f, 0) are not; the least over the ways to put K runs on the nodes (at most n // P
        on a node of n groups), a knapsack over the nodes. At least the sum of the K least slot deficits
        (`_summed_deficits`, which counts each of a node's slots with its whole f): j max(P - f, 0) <=
        max(j P - f, 0). 32-64-device seed 367: four pipelines, four runs on nodes of 5, 3, 3 and 5 fast
        groups of 8: slot deficits 0, 0, 0, 0 but 2 here (two runs on a node of 5 fast groups leave 3)."""
        least = [0] + [math.inf] * segments  # least[j]: the fewest with j runs placed on the nodes so far
        for groups in self.node_groups().values():
            fast, room = self.of_kind(groups, kind), sum(groups.values()) // pipelines
            least = [min(least[j - here] + max(here * pipelines - fast, 0) for here in range(min(room, j) + 1))
                     for j in range(segments + 1)]
        return int(least[segments]) if least[segments] < math.inf else 0

    def _deficit_floor(self, pipelines: int, refine: Deadline, state: int, kind: int, deficit: int,
                       holders: tuple[int, ...], **where: Any) -> float | None:
        """Floor of the plans (`coupled` with `where`, read at `state`) with at least `deficit` D >= 1 distinct
        stages of another kind than `kind` among the stages holding `holders`' layers: D <= P pipelines with
        one each, or one pipeline with two (`_summed_deficits`' argument), the lesser (`coupled`'s `held`, but
        where the layers are every layer: any stage then holds one); None when a table is out of reach."""
        relaxation, spread = self.relaxation, None
        every = len(holders) == self.layers
        if deficit <= pipelines:
            table = relaxation.coupled(pipelines, refine, forced=(kind, deficit),
                                       held=None if every else (holders, 1), **where)
            if table is None:
                return None
            spread = table[state]
        if deficit < 2:
            return spread
        doubled = relaxation.coupled(pipelines, refine, forced=(kind, 1), held=(holders, 2), **where)
        if doubled is None:
            return None
        return doubled[state] if spread is None else min(spread, doubled[state])

    def _split_runs(self, pipelines: int, refine: Deadline, runs: int, segments: int, state: int,
                    value: float, cap: float) -> float:
        """The column floor of K runs (`columns`: `value` at `state`) raised per way to cut the layers into the
        K runs by the groups its runs of several layers take (`_packed_holders`); the least over the cuts
        with such a run (the others: `_summed_deficits`). At most SINGLE_LAYERS layers."""
        if self.layers > SINGLE_LAYERS:
            return value
        least = math.inf
        for cuts in itertools.combinations(range(1, self.layers), segments - 1):
            if refine.expired():
                return value
            bounds = (0,) + cuts + (self.layers,)
            held_runs = [list(range(first, end)) for first, end in zip(bounds[:-1], bounds[1:])]
            if all(len(run) < 2 for run in held_runs):
                least = value  # one-layer runs: `_summed_deficits` with `_node_deficit` counts them
            else:
                least = min(least, self._packed_holders(pipelines, refine, held_runs, state, value, cap,
                                                        runs=runs, least=segments - 1))
            if least <= value:
                return value
        return max(value, least) if least < math.inf else value

    def _packed_holders(self, pipelines: int, refine: Deadline, held_runs: list[list[int]], state: int,
                        value: float, cap: float, **where: Any) -> float:
        """Floor of the plans (`coupled` with `where`, at `state`) whose held layers (each layer's P holders
        on one node) fall into these runs, each on one node, two runs' holders disjoint (`_run_slots`),
        raised from `value` up to `cap`. Either some pipeline holds a run's first and last layers on one
        stage (the least over the runs of several layers of the coupled table with one forced pipeline doing
        so, `within`; none when no stage can hold both, `Relaxation.shareable`), or every pipeline holds each
        such run on two stages at least, so its holders are 2P distinct groups of its node (P for a run of one
        layer). The runs on a node of n groups, f of kind k, then need at most n groups and have at least
        (their groups - f) holders of another kind: D, the least over the ways to put the runs on the nodes
        (`_packed_deficit`), floors that case (`_deficit_floor`: those stages hold held layers). `_run_slots` counts each of a node's n // P
        slots with the node's whole f and a run's groups as P. 32-64-device seed 367: four pipelines on nodes
        of 8 groups with 5, 3, 3 and 5 fast; runs 0 | 1 | 2 | 3-4, each pipeline splitting 3-4, take a whole
        node for layers 3-4 and leave five slow holders: the column plans 17.7653 -> above the plan, 17.8376.
        A run no stage can hold whole (not shareable) is split by every plan, so the first case also meets the
        same floor with only those runs taking 2P groups (`_split_holders`): 32-64-device seed 9061 (four
        pipelines, runs 0-1 | 2-3, layers 2-3 too large for one stage, no node of eight fast groups) let a
        pipeline holding layers 0-1 on one stage stand for every plan: 14.1821."""
        relaxation = self.relaxation
        several = tuple(len(run) >= 2 for run in held_runs)
        apart = tuple(many and not relaxation.shareable(run[0], run[-1]) for run, many in zip(held_runs, several))
        found = math.inf  # the plans where some pipeline holds a run's first and last layers on one stage
        for run, many, alone in zip(held_runs, several, apart):
            if many and not alone:
                table = relaxation.coupled(pipelines, refine, forced=(0, 1),
                                           within=(tuple(range(run[0], run[-1] + 1)), run[-1] - run[0] + 1, 1),
                                           **where)
                if table is None:
                    return value
                found = min(found, table[state])
        if found < math.inf and any(apart) and value < cap:
            # the runs no stage can hold whole are split by every plan, in both cases
            split = self._split_holders(pipelines, refine, held_runs, state, value, cap, apart, **where)
            if split is None:
                return value
            value = min(max(value, split), max(value, cap))
        if found <= value:
            return value
        split = self._split_holders(pipelines, refine, held_runs, state, value, min(found, cap), several, **where)
        if split is None:
            return value
        return min(max(value, min(found, split)), max(value, cap))

    def _split_holders(self, pipelines: int, refine: Deadline, held_runs: list[list[int]], state: int,
                       value: float, cap: float, split: tuple[bool, ...], **where: Any) -> float | None:
        """`_packed_holders`' floor of the plans in which every pipeline holds each run r with `split[r]` on
        two stages or more (2P distinct groups of its node; P for the other runs), raised from `value` up to
        `cap`: the fewest holders of another kind over the ways to put the runs on the nodes
        (`_packed_deficit`, `_deficit_floor`), then `_node_runs` with those runs split. None when a table
        is out of reach; inf when the runs fit no nodes."""
        relaxation = self.relaxation
        demand = [pipelines * (2 if apart else 1) for apart in split]
        holders = tuple(sorted(layer for run in held_runs for layer in run))
        nodes = [(sum(groups.values()), groups) for groups in self.node_groups().values()]
        for kind in range(len(relaxation.kind_count) if len(relaxation.kind_count) > 1 else 0):
            deficit = self._packed_deficit(demand, [(size, self.of_kind(groups, kind)) for size, groups in nodes])
            if deficit is None:
                return math.inf  # the runs fit no nodes
            if deficit > 0:
                floor = self._deficit_floor(pipelines, refine, state, kind, deficit, holders, **where)
                if floor is None:
                    return None
                value = max(value, floor)
            if value >= cap:
                return value
        return self._node_runs(pipelines, refine, held_runs, value, cap, state, split=split, **where)

    @staticmethod
    def _packed_deficit(demand: list[int], nodes: list[tuple[int, int]]) -> int | None:
        """Fewest holders of another kind when runs needing `demand` groups each (disjoint) go on nodes of
        (groups, groups of the kind) with every node's runs within its groups: the sum over nodes of
        max(their demand - the kind's groups, 0), least over the placements (a DP over the nodes and the
        set of runs placed); None when no placement fits."""
        count = len(demand)
        need = [sum(demand[i] for i in range(count) if mask >> i & 1) for mask in range(1 << count)]
        least = {0: 0}
        for size, fast in nodes:
            grown = dict(least)
            for placed, cost in least.items():
                free = ((1 << count) - 1) & ~placed
                here = free
                while here:
                    if need[here] <= size:
                        total = cost + max(need[here] - fast, 0)
                        key = placed | here
                        if total < grown.get(key, math.inf):
                            grown[key] = total
                    here = (here - 1) & free
            least = grown
        return least.get((1 << count) - 1)

    def _packed_runs(self, pipelines: int, refine: Deadline, runs: int, segments: int, state: int,
                     value: float, cap: float) -> float:
        """The column floor of K runs (`columns`: `value` at `state`) raised by how the runs' stages pack
        into their nodes: a run of several layers on a node of n groups has a stage of each pipeline per
        layer range it splits the run into, so at least 2P - n pipelines hold the whole run on one stage
        (n at most the largest node). Per way to cut the layers into K runs, the largest over its runs of
        the coupled table with that many such pipelines (`within`) and of the runs' slots (`_run_slots`),
        then, while below the least so far, of the table in which every pipeline sends before each cut
        across nodes and of the slots on such tables (two adjacent runs sit on two nodes, so every
        pipeline's stages holding the layers on both sides of a cut differ: `coupled`'s `pattern`; the
        least-crossings table lets each pipeline cross at its own layers: 24-32-device seed 3163, P = 3,
        K = 3, two pipelines crossing before layers 1 and 5 beside one crossing before 2, 4 and 5, 26.17
        -> 28.55); the least over the ways. At most SINGLE_LAYERS layers (2^(L-1) ways at most). 32-64-device seed 221: five pipelines, nodes of at
        most seven groups, so three hold each two-layer run on one stage."""
        relaxation, per_node = self.relaxation, self.node_groups()
        whole = 2 * pipelines - max(sum(groups.values()) for groups in per_node.values())
        if self.layers > SINGLE_LAYERS:
            return value
        least = math.inf
        for cuts in itertools.combinations(range(1, self.layers), segments - 1):
            bounds = (0,) + cuts + (self.layers,)
            found = value
            for first, end in zip(bounds[:-1], bounds[1:]):
                if end - first < 2 or found >= min(least, cap) or whole <= 0:
                    continue
                table = relaxation.coupled(pipelines, refine, runs, segments - 1, forced=(0, min(whole, pipelines)),
                                           within=(tuple(range(first, end)), end - first, 1))
                if table is None:
                    return value
                found = max(found, table[state])
            layers = [list(range(first, end)) for first, end in zip(bounds[:-1], bounds[1:])]
            if found < min(least, cap):
                found = self._run_slots(pipelines, refine, layers, found, min(least, cap), state)
            if found < min(least, cap):  # adjacent runs sit on two nodes: every pipeline sends before each cut, across
                pattern = (tuple((cut,) for cut in cuts), (), ())
                table = relaxation.coupled(pipelines, refine, runs, segments - 1, pattern=pattern)
                if table is None:
                    return value
                found = max(found, table[state])
                if found < min(least, cap):
                    found = self._run_slots(pipelines, refine, layers, found, min(least, cap), state, pattern=pattern)
            if found < min(least, cap):
                found = self._node_runs(pipelines, refine, layers, found, min(least, cap), state, runs=runs,
                                        least=segments - 1)
            least = min(least, found)
        return max(value, least)

    def node_groups(self) -> dict[int, Counter]:
        """Per node: its groups of each stage device type (the inventory's, built once; callers only read it)."""
        return self._composition

    def of_kind(self, groups: Counter, kind: int) -> int:
        """How many of `groups` (per stage device type) are of this relaxation kind. Memoised on the groups'
        (type, count) items, all it reads (32-64 seed 285: 85,000 asks, a tenth of its 2 s, on a few
        dozen nodes' groups), every kind's count at once."""
        key = tuple(groups.items())
        counts = self._kind_counts.get(key)
        if counts is None:
            kind_of = self.relaxation.kind_of
            counts = self._kind_counts[key] = [sum(n for name, n in key if kind_of[name] == k)
                                               for k in range(len(self.relaxation.kind_count))]
        return counts[kind]

    def state_of(self, groups: Counter) -> int:
        """The relaxation's state of these groups (count per stage device type)."""
        return sum(self.relaxation.stride[self.relaxation.kind_of[name]] * n for name, n in groups.items())

    @staticmethod
    def split_count(layers: int, longest: int) -> int:
        """Layer splits of every pipeline length up to `longest` (what each shape is priced over)."""
        return sum(math.comb(layers - 1, s - 1) for s in range(1, longest + 1))

    # -- bounds ----------------------------------------------------------------------------------
    def reach_table(self, lower: dict[tuple[int, ...], list[float]], limit: float) -> list[list[list[int]]]:
        """reach[S][m][g]: the most micro-batches g groups can run in pipelines whose (stages,
        micro-batches) come at or before (S, m) in key order and whose relaxed time (of any kinds)
        is below `limit` (an unbounded knapsack over that prefix of the items). Since the master
        lists pipelines in non-increasing key order, the pipelines after one keyed (S, m) must fit
        within it. Nested lists (row 0 of S and of m unused): the master reads them at every node."""
        reach: list[list[list[int]]] = [[]]
        best = [0] * (self.groups + 1)
        for stages in range(1, self.longest + 1):
            reach.append([[]])
            for m in range(1, self.total + 1):
                if min(lower[v][m] for v in self.relaxation.profiles[stages]) < limit:
                    for g in range(stages, self.groups + 1):
                        best[g] = max(best[g], best[g - stages] + m)
                reach[stages].append(list(best))
        return reach

    def fewest_table(self, lower: dict[tuple[int, ...], list[float]], limit: float
                     ) -> list[list[list[list[float]]]]:
        """fewest[S][m][g][n]: the fewest pipelines, keyed at or before (S, m) and of relaxed time
        below `limit`, that run exactly n micro-batches on at most g groups (inf: none do; an
        unbounded knapsack as `reach_table`). The pipelines after one keyed (S, m) are at least that
        many: every one of them adds a replica to every layer's ring. Nested lists as `reach_table`'s."""
        fewest: list[list[list[list[float]]]] = [[]]
        best = [[0.0] + [math.inf] * self.total for _ in range(self.groups + 1)]
        for stages in range(1, self.longest + 1):
            fewest.append([[]])
            for m in range(1, self.total + 1):
                if min(lower[v][m] for v in self.relaxation.profiles[stages]) < limit:
                    for g in range(stages, self.groups + 1):
                        row, source = best[g], best[g - stages]
                        for n in range(m, self.total + 1):
                            row[n] = min(row[n], source[n - m] + 1)
                fewest[stages].append([list(row) for row in best])
        return fewest

    def ring_bound(self, pipelines: int, grad_bytes: float) -> float:
        """Least gradient all-reduce of a plan with this many pipelines whose largest stage holds
        `grad_bytes` (`Relaxation.ring_bound`: these groups have its node sizes)."""
        return self.relaxation.ring_bound(pipelines, grad_bytes)

    # -- pricing ---------------------------------------------------------------------------------
    def price(self, seq: list[tuple[int, ...]], shape: tuple, bounds: tuple[int, ...], limit: float) -> Priced:
        """The exact terms of a pipeline on these groups with these layer boundaries, shared by every
        placement of the same shape (device types, node changes between neighbours, boundaries).
        With several reliefs a stage takes the smallest forward, backward and step among those that
        fit (the 1F1B time is monotone in every op): a lower bound that the leaf makes exact.
        Micro-batch counts stop at the first whose time reaches `limit` (the incumbent only falls)."""
        key = (shape, bounds, self.most_pipelines)  # memory is checked at the most replicas possible
        known = self.prices.get(key)
        if known is not None:
            return known
        model, stages = self.model, len(seq)
        pipe = Pipeline(tuple(Stage(g, bounds[s], bounds[s + 1]) for s, g in enumerate(seq)), 1)
        costs = model.stage_costs(Plan(self.tp, (pipe,)), 0, [0.0] * stages)
        reliefs = model.relief_options
        per_relief = []
        for st in pipe.stages:
            terms = self._stage_terms.get((st.devices, st.first, st.end))
            if terms is None:  # step: at the most replicas
                terms = self._stage_terms[st.devices, st.first, st.end] = [
                    (*model.stage_times(st.devices, st.first, st.end, r)[:2],
                     model.optimizer_time(st.devices, st.first, st.end, r, self.most_pipelines)) for r in reliefs]
            per_relief.append(terms)
        grad = model.workload.params * model.grad_bytes / self.tp
        grad_bytes = max(float(grad[st.first:st.end].sum()) for st in pipe.stages)
        times: list[tuple[int, float, float]] = []
        lower, optimizer, fitted = costs, 0.0, None
        for m in range(1, self.total + 1):
            if m <= stages * self.virtual:  # past that no stage holds more in flight: same fit
                fits = tuple(self._fits(st, s, stages, m) for s, st in enumerate(pipe.stages))
                if fits != fitted:  # the same fits give the same `lower` and step as the last m's
                    fitting = [[t for ok, t in zip(fit, per_relief[s]) if ok] for s, fit in enumerate(fits)]
                    if not all(fitting):
                        break  # more micro-batches only hold more in flight
                    lower = [replace(c, forward_s=min(t[0] for t in fit), backward_s=min(t[1] for t in fit))
                             for c, fit in zip(costs, fitting)]
                    optimizer = max(min(t[2] for t in fit) for fit in fitting)
                    fitted = fits
            if interleaving_refusal(stages, m, self.virtual) is not None:
                continue  # the model refuses it (Megatron's interleaved schedule needs m >= stages)
            time_s = model.pipeline_time(lower, m, self.virtual)
            if time_s + optimizer >= limit:
                break  # the time grows with m
            times.append((m, time_s, optimizer))
        self.prices[key] = Priced(tuple(times), grad_bytes)
        return self.prices[key]

    def _fits(self, st: Stage, s: int, stages: int, m: int) -> tuple[bool, ...]:
        """Per relief, whether stage s of `stages` (`st`) fits its device's memory with m micro-batches at
        the most replicas (`price`; memoised on those arguments: shapes share their stages' groups and
        ranges, and every split of a shape shares some)."""
        key = (st.devices, st.first, st.end, s, stages, m)
        found = self._stage_fits.get(key)
        if found is None:
            model = self.model
            capacity = model.stage_device(st.devices).memory_gib * GIB
            found = self._stage_fits[key] = tuple(
                model.stage_memory(st.devices, st.first, st.end, s, stages, m, 0.0, self.most_pipelines, r)[0]
                <= capacity for r in model.relief_options)
        return found

    # -- master ----------------------------------------------------------------------------------
    def reaching(self, pipelines: int, stages: int, deadline: Deadline) -> float:
        """A floor on the plans of P pipelines one of which has at least `stages` stages (0 when its
        table is out of reach): `coupled`'s table (each pipeline at its own time, ring and step) with
        one round priced on the pipelines of at least that many stages only. Valid for the tree's
        runs after its short runs, whose first pipeline has more stages than every exhausted short
        run allowed (8-24-device seed 154: the plans of five pipelines of at most three stages hold
        the optimum, 14.186442; the count's floor, 14.186122, left every plan of five with a
        four-stage pipeline to the tree, 771k nodes)."""
        table = self.relaxation.coupled(pipelines, deadline, forced=(0, 1), reaching=stages)
        return table[self.root] if table is not None else 0.0

    def solve(self, incumbent: float, deadline: Deadline, leaf_budget: int = 200_000,
              floor: float | None = None) -> ExactOutcome:
        """Depth-first over pipelines in non-increasing key order (stages, micro-batches, shape,
        boundaries: a multiset, not a sequence), each pipeline grown stage by stage from the groups
        left, the first untouched node of a family standing for all of them. Runs with pipelines of
        at most 1, 2, ... stages come first, within SHORT_SHARE of the time: their trees are small
        and often hold the best plans, which then cut the whole tree (depth first, long first
        pipelines hold most of it). `floor` (default `self.floor()`): a lower bound on every plan
        on these groups; once a plan meets it (PRUNE_TOLERANCE) every node left would be cut, so the
        search stops there, complete (the tree's own bounds are weaker: seeds 28 and 43 of the
        8-24-device brute force found the floor's plan early, then spent the whole deadline)."""
        lower, capped, completion = self.relaxation.lower, self.relaxation.capped, self.relaxation.completion
        reach = self.reach_table(lower, incumbent)  # the incumbent only falls: items only drop out
        layer_grad = [float(b) for b in self.model.workload.params * self.model.grad_bytes / self.tp]
        inter = self.model.inter
        holders = [Counter() for _ in range(self.layers)]  # per layer: nodes of the chosen pipelines' holders
        node_size = {node: sum(groups.values()) for node, groups in self.node_groups().items()}
        largest_grad = [0.0] + [_largest_stage(tuple(layer_grad), k) for k in range(1, self.layers + 1)]
        heaviest = list(itertools.accumulate(layer_grad, max, initial=0.0))  # heaviest[k]: of layers 0..k - 1
        total_grad = list(itertools.accumulate(layer_grad, initial=0.0))  # total_grad[k]: of layers 0..k - 1
        rings: dict[tuple[float, int], float] = {}
        layers, keep, overlapped = self.layers, 1 - PRUNE_TOLERANCE, self.overlapped  # locals: read on every node

        def inter_ring(nbytes: float, replicas: int) -> float:
            """The inter-node ring of these gradient bytes over these replicas (memoised)."""
            if (nbytes, replicas) not in rings:
                rings[nbytes, replicas] = self.relaxation.ring_time(nbytes, replicas, inter)
            return rings[nbytes, replicas]
        fewest = self.fewest_table(lower, incumbent)
        # runs[lo][k]: the least floor of plans of lo..lo + k pipelines (`by_count`): a partial plan that
        # will have that many pipelines is cut when it meets the incumbent (`by_counts`)
        per_count = [self.by_count.get(p, 0.0) for p in range(self.most_pipelines + 1)]
        runs: list[list[float]] = []

        def count_floors(floors: list[float]) -> None:
            """`runs` from these per-count floors."""
            runs[:] = [list(itertools.accumulate(floors[lo:], min)) for lo in range(len(floors))]
        count_floors(per_count)

        def by_counts(lo: int, hi: int) -> float:
            """A floor on every plan of lo..hi pipelines."""
            return runs[lo][min(hi, self.most_pipelines) - lo] if lo <= self.most_pipelines else math.inf
        anything = fewest[self.longest][self.total]  # every pipeline allowed (the first one's)
        cover = np.array(self.relaxation.cover)  # by state, micro-batches
        prefix_floors: dict[tuple[str, ...], tuple[list[float], list[list[float]]]] = {}

        def prefix_floor(types: tuple[str, ...]) -> tuple[list[float], list[list[float]]]:
            """(times, others) for a pipeline whose first stages have these device types: times[m], a
            floor on its time with m micro-batches (`Relaxation.prefix_lower`; 0 where it has none),
            and others[state][n], on the slowest pipeline time of every completion in which it runs
            some m of the n micro-batches left and the groups of `state` (those left once its first
            stages are taken; its further stages only leave fewer) the rest (`cover`)."""
            kinds = tuple(self.relaxation.kind_of[name] for name in types)
            times = self.relaxation.prefix_lower.get(kinds, [0.0] * (self.total + 1))
            others = np.full(cover.shape, np.inf)
            for m in range(1, self.total + 1):
                others[:, m:] = np.minimum(others[:, m:], np.maximum(times[m], cover[:, :self.total + 1 - m]))
            prefix_floors[types] = times, others.tolist()
            return prefix_floors[types]
        best: list = [incumbent, None]
        floor = self.floor() if floor is None else floor
        stats = {"leaves": 0, "nodes": 0, "complete": True, "met": floor >= incumbent * (1 - PRUNE_TOLERANCE)}
        window, cap = [deadline], [self.longest]  # the current run's deadline and longest pipeline
        searched = [0]  # plans whose longest pipeline has at most this many stages: exhausted by a capped run
        by_shape: dict[tuple, list[list[tuple[float, float, tuple[int, ...], float]]]] = {}  # `_by_micro_batches`
        regular = [False]  # the current run copies the first pipeline's shape and split (`copy` below)
        filled = [0]  # pipelines a regular run completed (at full length), to stop at the first placement
        exhausted = self.exhausted
        taken = [0] * len(self.pools)        # groups of each class in use (the pool's first ones)
        touched = Counter(dict.fromkeys(node_size, 0))  # groups in use per node (every node listed: no __missing__)
        chosen: list[tuple[tuple[tuple[int, ...], ...], tuple[int, ...], int]] = []

        def leaf() -> None:
            stats["leaves"] += 1
            plan = Plan(self.tp, tuple(Pipeline(tuple(Stage(g, b[s], b[s + 1]) for s, g in enumerate(seq)), m)
                                       for seq, b, m in chosen))
            relieved = choose_reliefs(self.model, plan)
            if relieved is not None and relieved[1].iteration_time_s < best[0]:
                best[0], best[1] = relieved[1].iteration_time_s, relieved[0]
                # its placement polished at once (ms): the tree meets a better placement of the same shapes
                # late (8-24-device seed 63: 26.58 -> 25.13 by swaps, the optimum 24.97 found 2.4 s later)
                moved, value = polish_placement(self.model, best[1], frozenset(), window[0].share(LEAF_POLISH_SHARE))
                if value < best[0] * (1 - 1e-12):
                    best[0], best[1] = value, moved
                stats["met"] = floor >= best[0] * (1 - PRUNE_TOLERANCE)

        sole = [-1] * self.layers  # per layer: the one node holding it in the chosen pipelines, -1 none, -2 several
        spans: dict[tuple[int, int], int] = {}  # the chosen pipelines' stage layer ranges (first, end): how many
        ring_bounds: dict[tuple[int, float], float] = {}  # `ring_bound` by (replicas, gradient bytes), memoised
        bits = [[sum(1 << layer for layer in range(first, end)) for end in range(self.layers + 1)]
                for first in range(self.layers + 1)]  # bits[f][e]: layers f..e - 1 as a bit set
        running: dict[int, list[float]] = {}  # per bit set of crossing layers: their gradient bytes below each layer
        slot_rings: dict[tuple[int, int, int, int], float] = {}  # `stage_ring` by (replicas, crossing layers, first, end)
        # per set of chosen pipelines (a stack, `hold`): each node's layers that cross unless a stage there holds
        # them, and the crossing floor by (crossing layers, candidate's bounds, replicas)
        memo: list[tuple[dict[int, int], dict[tuple[int, tuple[int, ...], int], float]]] = [({}, {})]

        def ring_floor(pipelines: int, grad_bytes: float, nodes: tuple[int, ...], bounds: tuple[int, ...],
                       future: float, groups_after: int, value: float, cut: float) -> float:
            """A floor on the gradient all-reduce once the candidate (its stages' `nodes`, `bounds`)
            joins with at least `future` pipelines to come (`fewest_table`) on `groups_after` groups:
            every slot reduces its layers over at least `pipelines` + `future` replicas; a layer whose
            holders already sit on two nodes rings over the inter-node link (groups only add), and so
            does one whose holders share a node with fewer unused groups than pipelines to come (each
            of them needs a holder there for the ring to stay inside it); and one of those pipelines
            has at most groups_after / future stages, so one of its slots holds at least
            `_largest_stage` of the gradients (the brute force's future bound). When that last floor
            alone brings the candidate's `value` to `cut`, it is returned as is: the caller cuts the
            candidate either way, and the crossing layers (a third of the search's time) are skipped."""
            if self.overlapped:
                return 0.0
            pipelines += int(future)
            if pipelines <= 1:
                return 0.0
            if future:
                shortest = min(int(groups_after // future), self.layers)
                if shortest == 0:
                    return math.inf  # the pipelines still needed do not fit in the groups left
                grad_bytes = max(grad_bytes, largest_grad[shortest])
            largest = ring_bounds.get((pipelines, grad_bytes))
            if largest is None:
                largest = ring_bounds[pipelines, grad_bytes] = self.ring_bound(pipelines, grad_bytes)
            if value + largest >= cut:
                return largest
            others, floors = memo[-1]
            crossing = 0  # the layers that cross nodes, as a bit set
            for s, node in enumerate(nodes):
                part = bits[bounds[s]][bounds[s + 1]]
                if not future or node_size[node] - touched[node] >= future:  # else the whole stage crosses
                    held = others.get(node)
                    if held is None:
                        held = others[node] = sum(1 << layer for layer, holder in enumerate(sole)
                                                  if holder not in (-1, node))
                    part &= held
                crossing |= part
            known = floors.get((crossing, bounds, pipelines))
            if known is None:
                spanning = running.get(crossing)
                if spanning is None:  # spanning[l]: the crossing layers' gradient bytes below layer l
                    spanning, crossed = [0.0], 0.0
                    for layer, nbytes in enumerate(layer_grad):
                        if crossing >> layer & 1:
                            crossed += nbytes
                        spanning.append(crossed)
                    running[crossing] = spanning
                # each stage's own all-reduce: its crossing layers' bytes across, the rest on the floor's link
                known = 0.0
                for first, end in itertools.chain(zip(bounds, bounds[1:]), spans):
                    slot = slot_rings.get((pipelines, crossing, first, end))
                    if slot is None:  # memoised across the tree (the stack's memo only holds whole floors)
                        slot = slot_rings[pipelines, crossing, first, end] = self.relaxation.stage_ring(
                            pipelines, total_grad[end] - total_grad[first], spanning[end] - spanning[first])
                    known = max(known, slot)
                floors[crossing, bounds, pipelines] = known
            return max(known, largest)

        def hold(nodes: tuple[int, ...], bounds: tuple[int, ...], step: int) -> None:
            """Adds (step 1) or removes (-1) a chosen pipeline's stages from `holders`, `sole`, `spans`, with
            the memo of the ring floor's crossings (`memo`) of the pipelines chosen with it."""
            if step < 0:
                memo.pop()
            else:
                memo.append(({}, {}))
            for s, node in enumerate(nodes):
                span = bounds[s], bounds[s + 1]
                spans[span] = spans.get(span, 0) + step
                if not spans[span]:
                    del spans[span]
                for layer in range(*span):
                    known = holders[layer]
                    known[node] += step
                    if not known[node]:
                        del known[node]
                    sole[layer] = (next(iter(known)) if len(known) == 1 else -2) if known else -1

        opened = [0] * self.families  # per family: its nodes in use, always its first ones (by rank)
        # Symmetry: a node no group uses yet may be taken only as its family's first such node (the nodes
        # in use in a family are then always its first ones, by rank). Per class, read once per child in
        # `grow` (lists, not attribute and dict look-ups: a tenth of the tree's time).
        pools, class_node, class_type, class_stride = self.pools, self.class_node, self.class_type, self.class_stride
        pool_size = [len(pool) for pool in pools]
        class_family = [self.family_of[node] for node in self.class_node]
        class_rank = [self.family_rank[node] for node in self.class_node]

        def master(n_left: int, g_left: int, state: int, worst: float, opt: float, grad: float,
                   last: tuple | None, last_nodes: tuple[int, ...], ring: float) -> None:
            """`last`, `last_nodes`: the previous pipeline's key and the nodes of its stages; `ring`:
            a floor on the gradient all-reduce of every completion (`ring_floor` of the pipelines
            chosen, with one more to come)."""
            if n_left == 0:
                leaf()
                return
            if stats["met"]:
                return  # the incumbent meets the floor: every node left would be cut
            if stats["leaves"] >= leaf_budget or window[0].expired():
                stats["complete"] = False
                return
            if last is not None and reach[last[0]][last[1]][g_left] < n_left:
                return  # the pipelines allowed after `last` cannot run what is left
            coming = fewest[last[0]][last[1]][g_left][n_left] if last is not None else anything[g_left][n_left]
            if coming == math.inf or by_counts(len(chosen) + int(coming), len(chosen) + min(n_left, g_left)) \
                    >= best[0] * (1 - PRUNE_TOLERANCE):
                return  # the plans of as many pipelines as can follow are no better
            # the pipeline to come is the last when no plan of more pipelines can beat the incumbent
            final = min(n_left, g_left) < 2 or by_counts(len(chosen) + 2, len(chosen) + min(n_left, g_left)) \
                >= best[0] * (1 - PRUNE_TOLERANCE)
            grow([], [], ((), ()), (), n_left, g_left, state, state, worst, opt, grad, last, last_nodes, ring, final)

        def crossed(upto: int, nodes: tuple[int, ...], room: int) -> float:
            """The heaviest gradient bytes of one of layers 0..upto - 1 that crosses nodes whatever the split
            (`enters`): layer l may stay inside a node with `room` unused groups (one per pipeline after
            this one) only if that node holds every chosen holder of l and first appears at stage l or
            before; a layer no chosen stage holds may stay in the earliest such node (found lazily)."""
            earliest, crossing = -1, 0.0
            for layer in range(upto):
                nbytes = layer_grad[layer]
                if nbytes > crossing:
                    holder = sole[layer]
                    if holder == -2:
                        continue
                    if holder >= 0:
                        at = nodes.index(holder) if holder in nodes and node_size[holder] - touched[holder] >= room \
                            else layers
                    else:
                        if earliest < 0:
                            earliest = next((i for i, node in enumerate(nodes)
                                             if node_size[node] - touched[node] >= room), layers)
                        at = earliest
                    if at > layer:
                        crossing = nbytes
            return crossing

        def grow(classes: list[int], seq: list[tuple[int, ...]], shape: tuple[tuple[str, ...], tuple[bool, ...]],
                 nodes: tuple[int, ...], n_left: int, g_left: int, state: int, after: int, worst: float, opt: float,
                 grad: float, last: tuple | None, last_nodes: tuple[int, ...], ring: float, final: bool) -> None:
            """`shape`, `nodes`: the pipeline's so far (its stages' device types and node changes, their
            nodes); `state`: the groups of each kind left before this pipeline, `after`: once its stages
            so far are taken; `final`: it is the plan's last pipeline, so it runs every micro-batch left.
            Pipelines of equal keys come with non-decreasing node tuples: swapping two of them and
            renaming the nodes by first use gives the same plan with a smaller tuple first, so the
            lexicographically least such sequence, which every plan has, obeys both this and the
            family rule (`allowed`)."""
            stages = len(classes)
            if not stages:  # from `master`; the loop below counts and cuts every other node before its call
                if not stats["complete"] or stats["met"]:
                    return
                stats["nodes"] += 1
                if stats["nodes"] % 512 == 0 and window[0].expired():
                    stats["complete"] = False
                    return
            if regular[0] and last is not None and stages == last[0]:
                filled[0] += 1
            if stages and (last is not None or stages > searched[0]):
                pipelines = len(chosen) + 1
                candidates = []  # every split and micro-batch count that may beat the incumbent, by bound
                per_m = by_shape.get(shape)
                if per_m is None:  # each split of this shape priced once (the same wherever it is placed)
                    splits = []
                    # a split whose relaxed time (every m) meets the incumbent is not priced: `price` would
                    # return no micro-batch count for it (8-24-device seed 4, 11 layers: 95% of the splits)
                    hopeless = (self.relaxation.shape_floors(shape) >= best[0] * keep).tolist() \
                        if len(self.splits[stages]) > FLOORED_SPLITS else itertools.repeat(False)
                    for bounds, skip in zip(self.splits[stages], hopeless):
                        if skip:
                            continue
                        if (shape, bounds, self.most_pipelines) not in self.prices and window[0].expired():  # 0.1-1 ms
                            stats["complete"] = False
                            return
                        splits.append((bounds, self.price(seq, shape, bounds, best[0] * keep)))
                    per_m = by_shape[shape] = _by_micro_batches(splits)
                # Keys (stages, m, shape, bounds) come in non-increasing order (one equal to `last` only on
                # nodes that do not repeat a plan: `repeats`); a regular run takes `last`'s split instead.
                top, only, tied_m, repeats = min(n_left, len(per_m) - 1), None, 0, False
                if last is not None and regular[0]:
                    if (stages, shape[1]) != (last[0], last[2][1]) or not all(
                            self.stands_in[a, b] for a, b in zip(shape[0], last[2][0])):
                        top = 0  # a regular run: the first pipeline's shape (or dominating types), split
                    only = last[3]
                elif last is not None and stages == last[0]:  # (m, shape, bounds) at most last's
                    top = min(top, last[1] - (shape > last[2]))
                    if shape == last[2]:
                        tied_m, repeats = last[1], nodes < last_nodes  # a key equal to `last` would repeat a plan
                cut, g_after, row = best[0] * keep, g_left - stages, capped[stages][after]
                for m in range(1, top + 1):
                    entries = per_m[m]
                    if not entries:
                        continue
                    rest = n_left - m
                    if rest and reach[stages][m][g_after] < rest:
                        continue  # key order: what follows runs at most this much
                    fixed = row[rest]  # later pipelines: <= stages
                    if max(worst, fixed) + opt + ring >= cut:
                        continue  # every split's value is at least this
                    future = fewest[stages][m][g_after][rest] if rest else 0
                    if future == math.inf or by_counts(pipelines + int(future), pipelines + min(rest, g_after)) >= cut:
                        continue  # no pipelines allowed after this one run exactly the rest, or as many
                    for time_s, optimizer_s, bounds, grad_bytes in entries:  # by time: the values only grow
                        new_worst = max(worst, time_s)
                        if max(new_worst, fixed) + opt + ring >= cut:
                            break
                        if (only is not None and bounds != only) or (m == tied_m and (
                                bounds > last[3] or (bounds == last[3] and repeats))):
                            continue
                        new_opt = max(opt, optimizer_s)
                        value = max(new_worst, fixed) + new_opt
                        if value + ring >= cut:
                            continue
                        new_grad = max(grad, grad_bytes)
                        new_ring = ring_floor(pipelines, new_grad, nodes, bounds, future, g_after, value, cut)
                        if value + new_ring < cut:
                            candidates.append((value + new_ring, (stages, m, shape, bounds), new_worst, new_opt,
                                               new_grad, new_ring))
                candidates.sort()  # the most promising first: good plans early, and the rest cut by them
                for value, key, new_worst, new_opt, new_grad, new_ring in candidates:
                    if value >= best[0] * keep:
                        break
                    _, m, _, bounds = key
                    first = None if chosen else (tuple(seq), bounds, m)
                    if first in exhausted:
                        continue  # every plan it leads has been searched (a run cut later)
                    chosen.append((tuple(seq), bounds, m))
                    hold(nodes, bounds, 1)
                    master(n_left - m, g_left - stages, after, new_worst, new_opt, new_grad, key, nodes, new_ring)
                    hold(nodes, bounds, -1)
                    chosen.pop()
                    if first is not None and stats["complete"] and not stats["met"] and not regular[0]:
                        exhausted.add(first)
            if stages >= min(cap[0], g_left) or (last is not None and stages >= last[0]):
                return
            if max(worst, completion[stages + 1][state][n_left]) + opt + ring >= best[0] * keep:
                return  # no longer pipeline (with the rest and the rings so far) can beat the incumbent
            copy = regular[0] and last is not None  # a regular run: the first pipeline's shape, greedily placed
            order = self.order
            if copy:  # the first pipeline's type at this stage, else one that dominates it (stands in)
                order = sorted(order, key=lambda c: self.class_type[c] != last[2][0][stages])
            too_slow: dict[str, bool] = {}  # per next stage's device type: every child of it is cut at once
            coming = fewest[last[0]][last[1]][g_left][n_left] if last is not None else anything[g_left][n_left]
            if not overlapped and coming != math.inf:  # the children's entry floors (`enters`), alike but for the node
                base = max(worst, completion[stages + 1][state][n_left]) + opt
                replicas, upto = len(chosen) + int(coming), min(stages + 1, layers)
                heavy = rings.get((heaviest[upto], replicas))
                if heavy is None:
                    heavy = inter_ring(heaviest[upto], replicas)
            for c in order:  # fastest device types first: good plans (and cuts) come early
                node = class_node[c]
                if taken[c] == pool_size[c] or (not touched[node] and class_rank[c] != opened[class_family[c]]):
                    continue  # the pool is used up, or an untouched node that is not its family's next
                if copy and (not self.stands_in[class_type[c], last[2][0][stages]] or (stages and (
                        node != class_node[classes[-1]]) != last[2][1][stages - 1])):
                    continue
                name = class_type[c]
                if name not in too_slow or not too_slow[name]:  # a cut stays one: the incumbent only falls
                    types = shape[0] + (name,)
                    times, others = prefix_floors.get(types) or prefix_floor(types)
                    too_slow[name] = max(worst, times[n_left] if final else others[after - class_stride[c]][n_left]) \
                        + opt + ring >= best[0] * keep
                if too_slow[name]:
                    continue  # too slow, whatever this pipeline's further stages, split and crossings (80% of
                    # the children of 32-64 seed 172's tree: cut here, before the call and its tuples)
                group = pools[c][taken[c]]
                taken[c] += 1
                opened[class_family[c]] += not touched[node]
                touched[node] += 1
                before = filled[0]
                # `enters`: the child is counted, and cut here, before its call and its tuples (half the
                # children of 32-64 seed 9061's tree): the child pipeline has stages + 1 stages already,
                # and at least `coming` pipelines, this one included, are still to be chosen, each with a
                # holder of every layer: layer l's ring stays inside a node only on one of those stages'
                # nodes that holds every chosen holder of l and has an unused group for each pipeline
                # after this one; where none does, it crosses nodes, whatever the split (32-64-device
                # seed 3: 1 Gb/s between nodes; 8-24-device seed 21: nodes of 7 groups, 7-8 pipelines)
                enters = False
                if stats["complete"] and not stats["met"]:
                    stats["nodes"] += 1
                    if stats["nodes"] % 512 == 0 and window[0].expired():
                        stats["complete"] = False
                    elif overlapped:
                        enters = True
                    elif coming != math.inf:
                        cut = best[0] * keep
                        if base + ring < cut:  # else every completion of stages + 1 stages is at least that
                            enters = True
                            if heavy > ring and base + heavy >= cut:  # else no layer's crossing can cut
                                crossing = crossed(upto, nodes + (node,), coming - 1)
                                if crossing and base + max(ring, inter_ring(crossing, replicas)) >= cut:
                                    enters = False
                if enters:
                    grow(classes + [c], seq + [group], (shape[0] + (class_type[c],), shape[1] + (
                        (node != nodes[-1],) if stages else ())), nodes + (node,), n_left, g_left, state,
                        after - class_stride[c], worst, opt, grad, last, last_nodes, ring, final)
                taken[c] -= 1
                touched[node] -= 1
                opened[class_family[c]] -= not touched[node]
                if copy and filled[0] > before:
                    return  # the lowest nodes that fit: stages of equal layers pile into nodes in order

        # Short runs first (their incumbents cut the runs after them: 8-24-device seed 722 spent 3.5 s of
        # fruitless regular and focus runs before them, 9.4 s in all, 4.8 s after), then a regular run:
        # every pipeline after the first copies its shape and split, each stage on
        # the lowest node that fits (micro-batches free), on a group of the first's type or, when those
        # run out, of a type that dominates it (inventory dominance leaves fast groups where a
        # dropped inventory had slow ones: seed 5 of the 32-64-device probe). A small tree whose leaves pile a stage's
        # replicas into few nodes (intra-node rings, which the placement-blind relaxation cannot see);
        # only an incumbent, never a proof.
        def root() -> None:
            """The whole tree from its root, on a data-stack chunk of its own (solve/frames.py)."""
            on_fresh_chunk(lambda: master(self.total, self.groups, self.root, 0.0, 0.0, 0.0, None, (), 0.0))

        def reach_floors() -> None:
            """The plans left have a pipeline of more stages than `searched`: their counts' floors."""
            if searched[0] and not stats["met"]:
                reach_window = deadline.share(REACHING_SHARE)
                for p in range(1, self.most_pipelines + 1):
                    if per_count[p] < best[0] * (1 - PRUNE_TOLERANCE) and not reach_window.expired():
                        per_count[p] = max(per_count[p], self.reaching(p, searched[0] + 1, reach_window))
                count_floors(per_count)

        for short in range(1, self.longest):
            if deadline.expired():
                break
            reach_floors()
            window[0], cap[0], stats["complete"] = deadline.share(SHORT_SHARE / (self.longest - short)), short, True
            root()
            if stats["complete"]:  # later runs take only first (longest) pipelines of more stages
                searched[0] = short
        reach_floors()
        cap[0] = self.longest
        window[0], stats["complete"], regular[0] = deadline.share(REGULAR_SHARE), True, True
        root()
        regular[0] = False
        # A regular run over the plans of the count with the least floor alone (the others' floors set to
        # inf: an incumbent, never a proof): where the floor is tight its plans are the likeliest optimum
        # (32-64 seed 198: four 6-stage copies meet the floor of 4 pipelines, 18.489604; the regular run
        # over every count finds them after 34k nodes, 0.6 s, four times its share at 2 s; this one
        # after 13k).
        below = [p for p in range(1, self.most_pipelines + 1) if per_count[p] < best[0] * (1 - PRUNE_TOLERANCE)]
        if len(below) > 1 and not stats["met"] and not deadline.expired():
            focus = min(below, key=per_count.__getitem__)
            count_floors([value if p == focus else math.inf for p, value in enumerate(per_count)])
            window[0], stats["complete"], regular[0] = deadline.share(FOCUS_SHARE), True, True
            root()
            regular[0] = False
            count_floors(per_count)
        window[0], cap[0], stats["complete"] = deadline, self.longest, True
        root()
        complete = stats["complete"] or stats["met"]
        reason = (f"branch and bound over {len(self.prices)} priced pipeline shapes, {stats['nodes']} nodes, "
                  f"{stats['leaves']} plans evaluated" + ("" if complete else " (stopped early)")
                  + ("; a plan met the relaxation's floor" if stats["met"] else ""))
        return ExactOutcome(best[1], best[0], complete, len(self.prices), stats["leaves"], reason,
                            max(floor, self.floor()))


@dataclass(frozen=True)
class _Ops:
    """A stage's operation times for PerfModel.pipeline_time (the relaxation's fastest ones): under
    plain 1F1B sends folded into the operations (op_*_s); under interleaving compute and sends apart,
    as pipeline_time prices them."""

    forward_s: float
    backward_s: float
    send_forward_s: float = 0.0
    send_backward_s: float = 0.0

    @property
    def op_forward_s(self) -> float:
        return self.forward_s + self.send_forward_s

    @property
    def op_backward_s(self) -> float:
        return self.backward_s + self.send_backward_s


@dataclass
class Inventories:
    """Every inventory's branch and bound with its floor (`exact_floors`), kept between calls: the floors
    are refined against the first incumbent, which they may prove before any other incumbent search
    runs (`search_plan`), and the trees searched later (`exact_search`)."""

    searches: list[ExactSearch]
    floors: list[float]
    prices: dict[tuple, Priced]

    def refine(self, incumbent: float, deadline: Deadline) -> bool:
        """Raises the floors below the incumbent, the most promising first, each only up to it
        (`ExactSearch.floor`'s cap; tables built before are kept); True when every floor meets it
        (PRUNE_TOLERANCE): no plan of the space is then faster than the incumbent."""
        cap = incumbent * (1 - PRUNE_TOLERANCE)
        for index in sorted(range(len(self.searches)), key=self.floors.__getitem__):
            if self.floors[index] < cap:
                self.floors[index] = max(self.floors[index], self.searches[index].floor(deadline, cap))
        return min(self.floors, default=math.inf) >= cap


def exact_floors(instance: Instance, model: PerfModel, failed: frozenset[int], deadline: Deadline
                 ) -> Inventories | ExactOutcome | None:
    """Every inventory's search and unrefined floor; None when the space is too large to be searched
    exactly, an outcome (its objective inf: the caller's incumbent stands) when there is nothing to
    search or the relaxation's tables ran out of time."""
    tp = instance.plan.tensor_parallel
    live_groups = (instance.num_devices - len(failed)) // tp
    longest = min(instance.workload.num_layers, live_groups)
    if live_groups > EXACT_GROUPS or ExactSearch.split_count(instance.workload.num_layers, longest) > SPLIT_BUDGET \
            or live_groups * longest * instance.global_micro_batches ** 2 > TABLE_BUDGET:
        return None
    options = inventories(instance, model, failed, tp, deadline)
    if options is None:
        return None
    options = [groups for groups in options if groups]
    if not options:
        return ExactOutcome(None, math.inf, True, 0, 0, "no TP group survives", math.inf)
    relaxation = Relaxation(model, options, instance.global_micro_batches,
                            [d for d in range(instance.num_devices) if d not in failed])
    if not relaxation.build(deadline):
        return ExactOutcome(None, math.inf, False, 0, 0, "the relaxation's tables ran out of time", 0.0)
    prices: dict[tuple, Priced] = {}  # shared: the inventories realise the same shapes
    searches = sorted((ExactSearch(instance, model, groups, tp, relaxation, prices) for groups in options),
                      key=ExactSearch.floor)  # the most promising first: good incumbents early
    return Inventories(searches, [search.floor() for search in searches], prices)


def exact_search(instance: Instance, model: PerfModel, failed: frozenset[int], incumbent: float,
                 deadline: Deadline, prepared: Inventories | ExactOutcome | None = None) -> ExactOutcome | None:
    """Branch and bound over every inventory of TP groups; None when the space is too large to
    be searched exactly (then the caller keeps its incumbent and its relaxation bound). `prepared`:
    `exact_floors`' answer for these survivors, when the caller has one."""
    prepared = exact_floors(instance, model, failed, deadline) if prepared is None else prepared
    if not isinstance(prepared, Inventories):
        return prepared if prepared is None else replace(prepared, objective=incumbent)
    searches, floors, prices = prepared.searches, prepared.floors, prepared.prices
    plan, objective, leaves, reason = None, incumbent, 0, ""
    # each inventory's relaxation floor (its part of the space), the tables built on demand
    below = sum(value < objective * (1 - PRUNE_TOLERANCE) for value in floors)
    prepared.refine(incumbent, deadline.share(REFINE_SHARE if below > 1 else SOLE_REFINE_SHARE))
    # an inventory whose floor meets the incumbent would be cut at its root (PRUNE_TOLERANCE): searched
    pending = [index for index in range(len(searches)) if floors[index] < objective * (1 - PRUNE_TOLERANCE)]
    for _ in range(2):  # a second pass resumes the inventories stopped early, with the better incumbent
        stopped = []
        for k, index in enumerate(pending):  # each gets an even share of what is left
            if floors[index] >= objective * (1 - PRUNE_TOLERANCE):
                continue  # a plan found on another inventory meets this one's floor: nothing here beats it
            if deadline.expired():  # unsearched (a tree's set-up alone costs ms)
                stopped.append(index)
                continue
            outcome = searches[index].solve(objective, deadline.share(1 / (len(pending) - k)), floor=floors[index])
            leaves, reason = leaves + outcome.leaves, outcome.reason
            floors[index] = max(floors[index], outcome.bound)
            if outcome.plan is not None:
                plan, objective = outcome.plan, outcome.objective
                # a boundary moved one layer on the whole step, at once (ms): a lower incumbent cuts the
                # inventories left (32-64 seed 155: a tree's 18.494912 is one move from 18.494752, the
                # floor of its 143 other inventories)
                moved, value = polish_step_splits(model, plan, failed, deadline.share(STEP_POLISH_SHARE))
                if value < objective * (1 - 1e-12):
                    plan, objective = moved, value
            if not outcome.complete:
                stopped.append(index)
        pending = stopped
        if not pending or deadline.expired():
            break
    best = ExactOutcome(plan, objective, not pending, len(prices), leaves, reason, min(floors, default=math.inf))
    if len(searches) > 1:
        best.reason += f"; {len(searches)} ways to form the TP groups"
    return best
