"""Exact plan search for small survivor sets: branch and bound over the whole plan space, priced
by the performance model itself.

The space (the `space` named in `plan --json`): TP groups formed inside each node from any of its
survivors (every grouping whose group types differ is tried), pipelines as ordered sequences of
groups of any device types, survivors left idle, every contiguous layer split, every micro-batch
allocation; 1F1B; step = PerfModel.evaluate (exact 1F1B longest path + gradient all-reduce +
optimizer step), memory checked at the exact replica count.

Decomposition (a master over exact columns):
- column: (sequence of group classes, layer split, micro-batch count m) priced exactly:
  t = the pipeline's schedule time alone (PerfModel.pipeline_time: the 1F1B longest path,
  Eq. 11, blocking sends included, or interleaved 1F1B; it does not depend on the other
  pipelines), u = its slowest optimizer step, g = its largest per-stage
  gradient bytes; memory checked with the most replicas any plan could give it;
- master: a multiset of columns with sum m = N within each class's group count, minimising
  max t + DP + max u, where DP is the exact gradient all-reduce of the assembled plan. Branch and
  bound, columns in a canonical order (multisets, not sequences), pruned by
      max(t so far, cover(g_left, N_left)) + max u so far + ring(max g so far, P, best link)
  where cover(g, n) = least makespan of pipelines covering n micro-batches with g groups of any
  class (a DP over the columns: a relaxation) and ring(...) a lower bound on every slot's
  all-reduce (bucket latencies add, bytes are the stage's). Leaves are evaluated by the model.
When the tree is exhausted the incumbent is optimal over the space; if the deadline or the
column budget stops it first, the caller reports its own valid bound instead.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, replace

from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.comm import Link, ring_allreduce_time
from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.perf.relief import choose_reliefs
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline

COLUMN_BUDGET = 40_000
"""Most (class sequence, split, micro-batch count) columns priced; larger spaces take the scale path."""
GROUPING_BUDGET = 2_000
"""Most groupings of one node's survivors into TP groups enumerated before giving up exactness."""
INVENTORY_BUDGET = 64
"""Most inventories (combinations of the nodes' distinct groupings) searched: each is a branch and
bound of its own, so their count is checked before any is built (a product over 50 heterogeneous
nodes has 2^50 of them)."""
PRUNE_TOLERANCE = 1e-9
"""A node is cut when its bound is within this relative margin of the incumbent (ties)."""


@dataclass(frozen=True)
class Column:
    """One priced pipeline: classes per stage, layer boundaries, micro-batches, exact terms."""

    classes: tuple[int, ...]
    bounds: tuple[int, ...]
    micro_batches: int
    time_s: float
    optimizer_s: float
    grad_bytes: float


@dataclass
class ExactOutcome:
    """What the branch and bound proved: `complete` means the whole space was searched."""

    plan: Plan | None
    objective: float
    complete: bool
    columns: int
    leaves: int
    reason: str


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


def inventories(instance: Instance, model: PerfModel, failed: frozenset[int], tp: int,
                deadline: Deadline = Deadline.never()) -> list[list[tuple[int, ...]]] | None:
    """Distinct sets of TP groups the survivors can form (one per combination of the nodes'
    group-type multisets); None when a node has too many groupings to enumerate, when the
    combinations number more than INVENTORY_BUDGET (counted before any is built), or past
    `deadline`."""
    per_node: list[list[list[tuple[int, ...]]]] = []
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
        combinations *= len(distinct)
        if combinations > INVENTORY_BUDGET:
            return None
        per_node.append(list(distinct.values()))
    return [[g for node in choice for g in node] for choice in itertools.product(*per_node)]


def _compositions(layers: int, stages: int) -> list[tuple[int, ...]]:
    """Every boundary tuple (0, b1, ..., layers) of `stages` non-empty contiguous stages."""
    return [(0,) + cut + (layers,) for cut in itertools.combinations(range(1, layers), stages - 1)]


class ExactSearch:
    """Branch and bound for one inventory of TP groups (see the module docstring)."""

    def __init__(self, instance: Instance, model: PerfModel, groups: list[tuple[int, ...]], tp: int) -> None:
        self.instance, self.model, self.tp = instance, model, tp
        self.total = instance.global_micro_batches
        self.layers = instance.workload.num_layers
        keys: dict[tuple[str, int], int] = {}
        self.pools: list[list[tuple[int, ...]]] = []
        for group in groups:
            key = (model.stage_device(group).name, instance.node_of(group[0]))
            if key not in keys:
                keys[key] = len(self.pools)
                self.pools.append([])
            self.pools[keys[key]].append(group)
        self.counts = [len(pool) for pool in self.pools]
        self.groups = len(groups)
        links = (model.intra, model.inter)
        self.best_link = Link(max(link.bandwidth for link in links), min(link.latency for link in links))
        self.most_pipelines = min(self.groups, self.total)
        self.virtual = model.options.virtual_stages or 1
        self.overlapped = bool(model.options.overlap_grad_reduce)

    # -- columns ---------------------------------------------------------------------------------
    def sequences(self) -> list[tuple[int, ...]]:
        """Every class sequence within the classes' group counts, shortest first. Built by extension
        (never by filtering a product over the classes, which is exponentially larger)."""
        found: list[tuple[int, ...]] = []
        level: list[tuple[tuple[int, ...], list[int]]] = [((), list(self.counts))]
        for _ in range(min(self.layers, self.groups)):
            level = [(seq + (c,), [k - (i == c) for i, k in enumerate(left)])
                     for seq, left in level for c, k in enumerate(left) if k > 0]
            found += [seq for seq, _ in level]
        return found

    def column_count(self) -> int:
        """Columns the space has (before memory pruning), to decide whether exactness is affordable.
        Sequences of each length: interleavings of the classes' uses, counted exactly with integers."""
        longest = min(self.layers, self.groups)
        if self.groups * self.total > COLUMN_BUDGET:  # already more single-stage-per-group choices
            return COLUMN_BUDGET + 1
        ways = [1] + [0] * longest  # ways[s]: sequences of length s over the classes seen so far
        for count in self.counts:
            new = [0] * (longest + 1)
            for length, n in enumerate(ways):
                for extra in range(min(count, longest - length) + 1):
                    new[length + extra] += n * math.comb(length + extra, extra)
            ways = new
        return sum(ways[s] * math.comb(self.layers - 1, s - 1) * self.total for s in range(1, longest + 1))

    def _pipeline(self, seq: tuple[int, ...], bounds: tuple[int, ...], micro_batches: int) -> Pipeline:
        """Concrete groups for a class sequence: each class's pool in order."""
        taken = Counter()
        stages = []
        for s, c in enumerate(seq):
            stages.append(Stage(self.pools[c][taken[c]], bounds[s], bounds[s + 1]))
            taken[c] += 1
        return Pipeline(tuple(stages), micro_batches)

    def price(self, deadline: Deadline) -> list[Column] | None:
        """Every column that fits in memory under some supported relief (at the most replicas any plan
        could give it). With several reliefs a column's time and optimizer step are lower bounds:
        each stage takes the smallest forward, backward and step among the reliefs that fit it (the
        1F1B time is monotone in every op), and the leaf chooses the real reliefs exactly."""
        model, columns = self.model, []
        grad = model.workload.params * model.grad_bytes / self.tp
        reliefs = model.relief_options
        for seq in self.sequences():
            for bounds in _compositions(self.layers, len(seq)):
                if deadline.expired():
                    return None
                pipe = self._pipeline(seq, bounds, 1)
                costs = model.stage_costs(Plan(self.tp, (pipe,)), 0, [0.0] * len(seq))
                per_relief = [[(*model.stage_times(st.devices, st.first, st.end, r)[:2],
                                model.optimizer_time(st.devices, st.first, st.end, r)) for r in reliefs]
                              for st in pipe.stages]
                capacity = [model.stage_device(st.devices).memory_gib * GIB for st in pipe.stages]
                grad_bytes = max(float(grad[st.first:st.end].sum()) for st in pipe.stages)
                for m in range(1, self.total + 1):
                    if m <= len(seq) * self.virtual:  # past that no stage holds more in flight: same fit
                        fitting = [[t for r, t in zip(reliefs, per_relief[s]) if model.stage_memory(
                            st.devices, st.first, st.end, s, len(seq), m, 0.0, self.most_pipelines, r)[0]
                            <= capacity[s]] for s, st in enumerate(pipe.stages)]
                        if not all(fitting):
                            break  # more micro-batches only hold more in flight
                        lower = [replace(c, forward_s=min(t[0] for t in fit), backward_s=min(t[1] for t in fit))
                                 for c, fit in zip(costs, fitting)]
                        optimizer = max(min(t[2] for t in fit) for fit in fitting)
                    columns.append(Column(seq, bounds, m, model.pipeline_time(lower, m, self.virtual), optimizer,
                                          grad_bytes))
        return columns

    # -- master ----------------------------------------------------------------------------------
    def ring_bound(self, pipelines: int, grad_bytes: float) -> float:
        """Least gradient all-reduce of a plan with this many pipelines whose largest stage holds
        `grad_bytes` (buckets only add latency; the fastest link)."""
        if pipelines <= 1 or self.overlapped:  # overlapped: only the exposed part counts, at least 0
            return 0.0
        return ring_allreduce_time(grad_bytes, pipelines, self.best_link)

    def cover_table(self, columns: list[Column]) -> list[list[float]]:
        """cover[g][n]: least makespan of pipelines running n micro-batches on at most g groups,
        classes relaxed (any column, any group)."""
        best: dict[tuple[int, int], float] = {}
        for col in columns:
            key = (len(col.classes), col.micro_batches)
            best[key] = min(best.get(key, math.inf), col.time_s)
        items = sorted(best.items())
        cover = [[0.0] + [math.inf] * self.total for _ in range(self.groups + 1)]
        for g in range(1, self.groups + 1):
            for n in range(1, self.total + 1):
                value = cover[g - 1][n]
                for (stages, m), t in items:
                    if stages <= g and m <= n:
                        value = min(value, max(t, cover[g - stages][n - m]))
                cover[g][n] = value
        return cover

    def solve(self, incumbent: float, deadline: Deadline, leaf_budget: int = 200_000
              ) -> ExactOutcome:
        columns = self.price(deadline)
        if columns is None:
            return ExactOutcome(None, incumbent, False, 0, 0, "pricing the columns ran out of time")
        columns.sort(key=lambda c: (c.time_s, c.optimizer_s))
        cover = self.cover_table(columns)
        usage = [Counter(c.classes) for c in columns]
        stages = [len(c.classes) for c in columns]
        best: list = [incumbent, None]
        stats = {"leaves": 0, "complete": True}
        left = list(self.counts)
        chosen: list[int] = []

        def bound(worst: float, opt: float, grad_bytes: float, pipelines: int, groups_left: int, n_left: int
                  ) -> float:
            rest = cover[groups_left][n_left]
            return max(worst, rest) + opt + self.ring_bound(pipelines + (1 if n_left else 0), grad_bytes)

        def leaf() -> None:
            stats["leaves"] += 1
            pools_taken = Counter()
            pipelines = []
            for i in chosen:
                col = columns[i]
                stages_ = []
                for s, c in enumerate(col.classes):
                    stages_.append(Stage(self.pools[c][pools_taken[c]], col.bounds[s], col.bounds[s + 1]))
                    pools_taken[c] += 1
                pipelines.append(Pipeline(tuple(stages_), col.micro_batches))
            relieved = choose_reliefs(self.model, Plan(self.tp, tuple(pipelines)))
            if relieved is not None and relieved[1].iteration_time_s < best[0]:
                best[0], best[1] = relieved[1].iteration_time_s, relieved[0]

        def dfs(start: int, n_left: int, groups_left: int, worst: float, opt: float, grad_bytes: float) -> None:
            if not stats["complete"]:
                return
            if n_left == 0:
                leaf()
                return
            if stats["leaves"] >= leaf_budget or deadline.expired():
                stats["complete"] = False
                return
            limit = best[0] * (1 - PRUNE_TOLERANCE)
            for i in range(start, len(columns)):
                col = columns[i]
                if col.time_s + opt >= limit:
                    break  # columns are sorted by time: none further can help
                if col.micro_batches > n_left or stages[i] > groups_left:
                    continue
                if any(left[c] < k for c, k in usage[i].items()):
                    continue
                new_worst, new_opt = max(worst, col.time_s), max(opt, col.optimizer_s)
                new_bytes = max(grad_bytes, col.grad_bytes)
                if bound(new_worst, new_opt, new_bytes, len(chosen) + 1, groups_left - stages[i],
                         n_left - col.micro_batches) >= limit:
                    continue
                for c, k in usage[i].items():
                    left[c] -= k
                chosen.append(i)
                dfs(i, n_left - col.micro_batches, groups_left - stages[i], new_worst, new_opt, new_bytes)
                chosen.pop()
                for c, k in usage[i].items():
                    left[c] += k
                limit = best[0] * (1 - PRUNE_TOLERANCE)

        dfs(0, self.total, self.groups, 0.0, 0.0, 0.0)
        reason = (f"branch and bound over {len(columns)} exact columns, {stats['leaves']} plans evaluated"
                  + ("" if stats["complete"] else " (stopped early)"))
        return ExactOutcome(best[1], best[0], stats["complete"], len(columns), stats["leaves"], reason)


def exact_search(instance: Instance, model: PerfModel, failed: frozenset[int], incumbent: float,
                 deadline: Deadline) -> ExactOutcome | None:
    """Branch and bound over every inventory of TP groups; None when the space is too large to
    be searched exactly (then the caller keeps its incumbent and its relaxation bound)."""
    tp = instance.plan.tensor_parallel
    options = inventories(instance, model, failed, tp, deadline)
    if options is None:
        return None
    searches = [ExactSearch(instance, model, groups, tp) for groups in options if groups]
    if sum(search.column_count() for search in searches) > COLUMN_BUDGET:
        return None
    best = ExactOutcome(None, incumbent, True, 0, 0, "no TP group survives")
    for search in searches:
        outcome = search.solve(best.objective, deadline)
        complete = best.complete and outcome.complete
        columns, leaves = best.columns + outcome.columns, best.leaves + outcome.leaves
        if outcome.plan is not None:
            best = ExactOutcome(outcome.plan, outcome.objective, complete, columns, leaves, outcome.reason)
        else:
            best = ExactOutcome(best.plan, best.objective, complete, columns, leaves, outcome.reason)
    if len(searches) > 1:
        best.reason += f"; {len(searches)} ways to form the TP groups"
    return best
