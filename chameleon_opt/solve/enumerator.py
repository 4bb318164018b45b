"""The paper's Algorithm 1 as an exhaustive planner: the exact oracle on small instances and the
baseline the model-based search must match wherever the enumeration finishes.

The space, exactly as the paper restricts it (TP degree fixed at the instance's current one; the
units are the surviving TP groups, `survivor_groups`, G of them):

- DP degree P: every value of `dp_range` (default 1..G).
- Pipeline lengths: every integer partition of G into P parts, each part between 1 and the layer
  count n. Pipelines are unordered, so a partition is a non-increasing tuple; pipeline j takes
  the next S_j groups in survivor order (longest pipeline first, so neighbouring stages share
  nodes where they can).
- Micro-batches: pipeline j gets floor(N S_j / G) of the N = global_micro_batches, and the r
  left over go one each to r distinct pipelines, every placement; placements that differ only
  by which of several equally long pipelines take the +1 are the same (the first ones of each
  length take them). Placements leaving a pipeline without a micro-batch are skipped.
- Layers: a pipeline of S stages splits the B = n - 2 transformer blocks evenly (B // S each,
  B % S stages take one more: every choice of those stages, C(S, B % S)); the embedding joins
  stage 0 and the head the last stage. A pipeline longer than B (S <= n) cannot give every
  stage a block, so it splits all n layers evenly the same way (embedding and head count as
  layers). The default choice, tried first, puts the extra blocks on the last stages (they
  keep fewer micro-batches in flight under 1F1B).
- All pipelines of the same length use the same split (the paper's restriction; it keeps the
  space a product over distinct lengths rather than over pipelines). The space therefore
  contains every plan in which each length uses one split, in particular the one where each
  length uses its best split.
- Plans that overflow memory on any stage (Eq. 14, as the performance model computes it) are
  dropped; of the rest the one with the least `PerfModel.evaluate(plan).iteration_time_s`
  (Eq. 10/11 + DP all-reduce + optimizer step) is kept (the first found on ties).

How it stays fast without losing exactness. A candidate's time is max_j T_j + DP + optimizer,
where T_j (the 1F1B longest path of pipeline j) depends only on that pipeline's groups, split
and micro-batch count, its memory on those and on P (the distributed optimizer's shards: every
layer has P live replicas), and DP + optimizer only on the groups and splits of all pipelines.
Each piece is cached at that grain and computed with the performance model's own functions, so
the sum equals `evaluate` exactly. Before simulating 1F1B, a lower bound is checked: stage s
cannot start before the forwards of the stages before it, runs all its 2m operations one after
another, and its last backward must still cross the stages before it, so
T_j >= sum_{s'<s}(f_s' + b_s') + m (f_s + b_s) for every s. A candidate whose bound exceeds the
incumbent cannot win and is not simulated. Every new incumbent is confirmed by a full
`evaluate` (which decides), and the returned plan passes `assert_sound`.

Order (so that a time-limited run returns a good plan): first every (P, partition, placement)
with the default split of each length; then the remaining splits, partitions whose first pass
was best going first. The reported status is OPTIMAL only when both passes finished.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from chameleon_opt.check import assert_sound
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.perf.pipeline import one_f_one_b_time
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.result import SolveResult, Status

BACKEND = "enumeration"
PROGRESS_EVERY = 100
BOUND_MARGIN = 1e-9
"""A bound must exceed the incumbent by this relative margin to prune: the bound and the
simulation add the same numbers in different orders, so equal values may differ in the last bit."""


# -- the space ---------------------------------------------------------------------------------
def _most_even(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def partitions(total: int, parts: int, largest: int) -> Iterator[tuple[int, ...]]:
    """Non-increasing tuples of `parts` integers in [1, largest] summing to `total`, in
    lexicographic order (the most even first). Iterative: `parts` may run into the thousands."""
    if parts <= 0 or not parts <= total <= parts * largest:
        return
    current = _most_even(total, parts)
    while True:
        yield tuple(current)
        # The next one: raise the rightmost part that can be raised, refill the rest most evenly.
        suffix = current[-1]
        for i in range(parts - 2, -1, -1):
            raised = current[i] + 1
            rest, count = suffix - 1, parts - 1 - i
            if raised <= largest and (i == 0 or raised <= current[i - 1]) and count <= rest <= count * raised:
                current[i:] = [raised] + _most_even(rest, count)
                break
            suffix += current[i]
        else:
            return


def split_count(num_layers: int, stages: int) -> int:
    """How many layer splits `layer_splits` yields for a pipeline of `stages` stages."""
    blocks = num_layers - 2
    units = blocks if stages <= blocks else num_layers
    return math.comb(stages, units % stages)


def _boundaries(num_layers: int, stages: int, extra: tuple[int, ...]) -> tuple[int, ...]:
    blocks = num_layers - 2
    chosen = set(extra)
    if stages <= blocks:  # blocks split evenly; embedding on stage 0, head on the last stage
        base = blocks // stages
        bounds, position = [0], 1
        for s in range(stages):
            position += base + (1 if s in chosen else 0)
            bounds.append(position)
        bounds[-1] = num_layers
    else:  # more stages than blocks: all layers split evenly
        base = num_layers // stages
        bounds, position = [0], 0
        for s in range(stages):
            position += base + (1 if s in chosen else 0)
            bounds.append(position)
    return tuple(bounds)


def layer_splits(num_layers: int, stages: int) -> Iterator[tuple[int, ...]]:
    """Every even split for `stages` stages as layer boundaries (stage s owns
    [b[s], b[s+1])), the default (extras on the last stages) first. Lazy: C(S, r) can be huge."""
    blocks = num_layers - 2
    units = blocks if stages <= blocks else num_layers
    extra = units % stages
    default = tuple(range(stages - extra, stages))
    yield _boundaries(num_layers, stages, default)
    for choice in combinations(range(stages), extra):
        if choice != default:
            yield _boundaries(num_layers, stages, choice)


def placements(lengths: tuple[int, ...], total: int, groups: int) -> list[tuple[int, ...]]:
    """Micro-batches per pipeline: floor(total S_j / groups) each, plus every placement of the
    remainder on distinct pipelines, up to swapping pipelines of the same length (the first
    pipelines of a length take the extras). Every pipeline gets at least one micro-batch."""
    base = [total * s // groups for s in lengths]
    remainder = total - sum(base)
    classes: list[tuple[int, int]] = []  # (first index, count) of each run of equal lengths
    for j, s in enumerate(lengths):
        if j and s == lengths[j - 1]:
            classes[-1] = (classes[-1][0], classes[-1][1] + 1)
        else:
            classes.append((j, 1))
    out: list[tuple[int, ...]] = []

    def place(c: int, left: int, shares: list[int]) -> None:
        if c == len(classes):
            if left == 0:
                out.append(tuple(shares))
            return
        first, count = classes[c]
        rest = sum(k for _, k in classes[c + 1:])
        need = count if base[first] == 0 else 0
        for extra in range(max(need, left - rest), min(count, left) + 1):
            for j in range(first, first + extra):
                shares[j] += 1
            place(c + 1, left - extra, shares)
            for j in range(first, first + extra):
                shares[j] -= 1

    if remainder <= len(lengths):
        place(0, remainder, list(base))
    return out


def one_f_one_b_lower_bound(forward_s: Sequence[float], backward_s: Sequence[float], micro_batches: int) -> float:
    """A lower bound on Eq. 11's 1F1B time: stage s starts no earlier than the forwards of the
    stages before it, runs its 2m operations one after another, and its last backward must then
    cross every stage before it: T >= sum_{s'<s} (f_s' + b_s') + m (f_s + b_s), for every s.
    Exact (Eq. 9) when the stages are identical."""
    best, prefix = 0.0, 0.0
    for f, b in zip(forward_s, backward_s):
        best = max(best, prefix + micro_batches * (f + b))
        prefix += f + b
    return best


# -- cached pieces of the objective --------------------------------------------------------------
@dataclass(frozen=True)
class _PipeCost:
    op_forward: tuple[float, ...]
    op_backward: tuple[float, ...]
    optimizer_s: float
    overflow: tuple[float, float, int] | None  # (need, capacity, stage) of the worst stage over capacity


@dataclass
class _Evaluator:
    instance: Instance
    model: PerfModel
    groups: list[tuple[int, ...]]
    tp: int
    costs: dict[tuple, _PipeCost] = field(default_factory=dict)
    times: dict[tuple, float] = field(default_factory=dict)
    bounds: dict[tuple, float] = field(default_factory=dict)
    replicas: dict[int, dict[int, int]] = field(default_factory=dict)
    simulated: int = 0

    def pipeline(self, start: int, bounds: tuple[int, ...], micro_batches: int) -> Pipeline:
        stages = tuple(Stage(self.groups[start + s], bounds[s], bounds[s + 1]) for s in range(len(bounds) - 1))
        return Pipeline(stages, micro_batches)

    def cost(self, start: int, bounds: tuple[int, ...], micro_batches: int, pipelines: int) -> _PipeCost:
        """Op times, optimizer time and memory of one pipeline, via the model's own stage costs.
        Memory depends on the micro-batches only up to the stage count (1F1B's in-flight cap)
        and on the DP degree only with the distributed optimizer."""
        stages = len(bounds) - 1
        in_flight = min(micro_batches, stages)
        degree = pipelines if self.model.shard_optimizer else 1
        key = (start, bounds, in_flight, degree)
        found = self.costs.get(key)
        if found is not None:
            return found
        if degree not in self.replicas:
            self.replicas[degree] = {layer: degree for layer in range(self.instance.workload.num_layers)}
        plan = Plan(self.tp, (self.pipeline(start, bounds, in_flight),))
        stage_costs = self.model.stage_costs(plan, 0, [0.0] * stages, self.replicas[degree])
        worst = None
        for s, c in enumerate(stage_costs):
            if c.memory_bytes > c.memory_capacity_bytes and (
                    worst is None or c.memory_bytes - c.memory_capacity_bytes > worst[0] - worst[1]):
                worst = (c.memory_bytes, c.memory_capacity_bytes, s)
        optimizer = max(self.model.optimizer_time(st.devices, st.first, st.end, replicas=degree)
                        for st in plan.pipelines[0].stages)
        found = _PipeCost(tuple(c.op_forward_s for c in stage_costs), tuple(c.op_backward_s for c in stage_costs),
                          optimizer, worst)
        self.costs[key] = found
        return found

    def lower_bound(self, cost: _PipeCost, micro_batches: int) -> float:
        key = (cost.op_forward, cost.op_backward, micro_batches)
        found = self.bounds.get(key)
        if found is None:
            found = self.bounds[key] = one_f_one_b_lower_bound(cost.op_forward, cost.op_backward, micro_batches)
        return found

    def time(self, cost: _PipeCost, micro_batches: int) -> float:
        """Eq. 11 by the model's own 1F1B longest path (what `evaluate` computes)."""
        key = (cost.op_forward, cost.op_backward, micro_batches)
        found = self.times.get(key)
        if found is None:
            self.simulated += 1
            found = self.times[key] = one_f_one_b_time(list(cost.op_forward), list(cost.op_backward), micro_batches)
        return found


@dataclass
class _Search:
    """Incumbent, counters and the reason material of one enumeration."""

    evaluator: _Evaluator
    deadline: Deadline
    progress: Callable[[int], None] | None
    examined: int = 0
    pruned: int = 0
    over_memory: int = 0
    best_value: float = math.inf
    best_plan: Plan | None = None
    closest: tuple[float, float, int, int, tuple[int, ...]] | None = None  # least overflow seen
    timed_out: bool = False

    def tick(self) -> None:
        self.examined += 1
        if self.progress is not None and self.examined % PROGRESS_EVERY == 0:
            self.progress(self.examined)


def _gib(nbytes: float) -> str:
    value = nbytes / GIB
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def _layouts(lengths: tuple[int, ...], splits: tuple[tuple[int, ...], ...]) -> list[tuple[int, tuple[int, ...]]]:
    """(first group, boundaries) of every pipeline; `splits` has one entry per distinct length."""
    by_length = dict(zip(sorted(set(lengths), reverse=True), splits))
    out, start = [], 0
    for s in lengths:
        out.append((start, by_length[s]))
        start += s
    return out


def _visit_combo(search: _Search, lengths: tuple[int, ...], splits: tuple[tuple[int, ...], ...],
                 shares_list: list[tuple[int, ...]]) -> float:
    """Examine every placement for one choice of splits; the best feasible value seen (inf if none)."""
    ev = search.evaluator
    layout = _layouts(lengths, splits)
    pipelines = len(lengths)
    sync: float | None = None
    best_here = math.inf
    for shares in shares_list:
        if search.deadline.expired():
            search.timed_out = True
            return best_here
        search.tick()
        costs = [ev.cost(start, bounds, m, pipelines) for (start, bounds), m in zip(layout, shares)]
        worst = None
        for j, c in enumerate(costs):
            if c.overflow is not None and (worst is None or c.overflow[0] - c.overflow[1] > worst[0] - worst[1]):
                worst = (c.overflow[0], c.overflow[1], c.overflow[2], j)
        if worst is not None:
            search.over_memory += 1
            if search.closest is None or worst[0] - worst[1] < search.closest[0] - search.closest[1]:
                search.closest = (worst[0], worst[1], worst[2], worst[3], lengths)
            continue
        if sync is None:
            plan = Plan(ev.tp, tuple(ev.pipeline(start, bounds, 1) for start, bounds in layout))
            sync = ev.model.data_parallel_time(plan) + max(c.optimizer_s for c in costs)
        bound = max(ev.lower_bound(c, m) for c, m in zip(costs, shares)) + sync
        if bound > search.best_value * (1 + BOUND_MARGIN):
            search.pruned += 1
            best_here = min(best_here, bound)
            continue
        value = max(ev.time(c, m) for c, m in zip(costs, shares)) + sync
        best_here = min(best_here, value)
        if value < search.best_value:
            plan = Plan(ev.tp, tuple(ev.pipeline(start, bounds, m) for (start, bounds), m in zip(layout, shares)))
            estimate = ev.model.evaluate(plan)  # the full model decides
            if estimate.memory_ok and estimate.iteration_time_s < search.best_value:
                search.best_value, search.best_plan = estimate.iteration_time_s, plan
    return best_here


def _split_product(num_layers: int, distinct: list[int], skip_first: bool) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Lazily, every choice of one split per distinct length (the all-default choice skipped
    when `skip_first`)."""
    def rec(i: int, first: bool) -> Iterator[tuple[tuple[int, ...], ...]]:
        if i == len(distinct):
            if not (skip_first and first):
                yield ()
            return
        for k, split in enumerate(layer_splits(num_layers, distinct[i])):
            for rest in rec(i + 1, first and k == 0):
                yield (split,) + rest
    return rec(0, True)


def enumerate_plans(instance: Instance, failed: frozenset[int], deadline: Deadline,
                    dp_range: tuple[int, int] | None = None, model: PerfModel | None = None,
                    progress: Callable[[int], None] | None = None) -> SolveResult[Plan]:
    """The best plan of the paper's Algorithm 1 space on the survivors of `failed` (see the module
    docstring), by `deadline`. OPTIMAL: the whole space was enumerated (optimal within that
    space, not over all plans); FEASIBLE: the deadline cut it (no bound); INFEASIBLE: the space
    is empty or nothing fits in memory; NO_SOLUTION: cut before any plan fitted."""
    start = time.perf_counter()
    limit_s = max(deadline.end - start, 0.0)  # for the reasons: the time this enumeration had
    model = model or PerfModel(instance)
    tp = instance.plan.tensor_parallel
    groups = survivor_groups(instance, failed, tp)
    g, n, total = len(groups), instance.workload.num_layers, instance.global_micro_batches

    def result(status: Status, plan: Plan | None, objective: float | None, reason: str,
               build_s: float = 0.0) -> SolveResult[Plan]:
        bound = objective if status is Status.OPTIMAL else None
        return SolveResult(status, plan, objective, bound, time.perf_counter() - start, BACKEND,
                           build_s=build_s, reason=reason)

    if g == 0:
        return result(Status.INFEASIBLE, None, None, f"no surviving TP group of {tp} devices inside one node")
    asked = dp_range if dp_range is not None else (1, g)
    low, high = max(asked[0], 1), min(asked[1], g, total)
    degrees = list(range(low, high + 1))
    if not degrees:
        return result(Status.INFEASIBLE, None, None,
                      f"the space is empty: DP range {asked[0]}..{asked[1]} holds no degree between 1 and "
                      f"{min(g, total)} ({g} TP groups, {total} micro-batches)")

    search = _Search(_Evaluator(instance, model, groups, tp), deadline, progress)
    space = 0
    firsts: list[tuple[float, int, tuple[int, ...]]] = []  # (first-pass value, order, lengths)
    # Pass 1: every (P, partition, placement) with the default split of each length, the DP
    # degrees taken round-robin (one partition of each in turn), so that a time-limited run on a
    # large cluster sees every degree rather than only the small ones.
    active = [partitions(g, p, n) for p in degrees]
    while active and not search.timed_out:
        still = []
        for generator in active:
            if deadline.expired():
                search.timed_out = True
                break
            lengths = next(generator, None)
            if lengths is None:
                continue
            still.append(generator)
            shares_list = placements(lengths, total, g)
            if not shares_list:
                continue
            distinct = sorted(set(lengths), reverse=True)
            space += len(shares_list) * math.prod(split_count(n, s) for s in distinct)
            splits = next(_split_product(n, distinct, False))
            value = _visit_combo(search, lengths, splits, shares_list)
            firsts.append((value, len(firsts), lengths))
            if search.timed_out:
                break
        active = still
    space_known = not search.timed_out
    # Pass 2: the other splits, most promising partitions first.
    if not search.timed_out:
        for _, _, lengths in sorted(firsts):
            shares_list = placements(lengths, total, g)
            distinct = sorted(set(lengths), reverse=True)
            for splits in _split_product(n, distinct, True):
                _visit_combo(search, lengths, splits, shares_list)
                if search.timed_out:
                    break
            if search.timed_out:
                break

    counts = (f"{search.examined} candidates examined ({search.evaluator.simulated} 1F1B simulations, "
              f"{search.pruned} pruned by a lower bound, {search.over_memory} over memory)")
    where = f"DP {low}..{high} over {g} TP groups of {tp}"
    if search.timed_out:
        of = f" of {space}" if space_known else " (space not fully counted)"
        if search.best_plan is None:
            return result(Status.NO_SOLUTION, None, None,
                          f"time limit {limit_s:.3g} s after {search.examined}{of} candidates; none fits in memory "
                          f"so far ({where})")
        plan = assert_sound(instance, search.best_plan, failed, model=model)
        return result(Status.FEASIBLE, plan, search.best_value,
                      f"time limit {limit_s:.3g} s: best of {search.examined}{of} candidates of the paper's "
                      f"Algorithm 1 space ({where}); {counts}")
    if search.best_plan is None:
        if space == 0:
            return result(Status.INFEASIBLE, None, None,
                          f"the space is empty: no DP degree in {low}..{high} gives each of the {g} TP groups a "
                          f"stage with layers ({n} layers) and every pipeline a micro-batch ({total} in all)")
        assert search.closest is not None
        need, cap, stage, pipe, lengths = search.closest
        return result(Status.INFEASIBLE, None, None,
                      f"no split fits in memory: best candidate needs {_gib(need)} GiB on stage {stage} "
                      f"of pipeline {pipe} > {_gib(cap)} GiB (pipeline lengths {list(lengths)}; "
                      f"{search.examined} candidates, {where})")
    plan = assert_sound(instance, search.best_plan, failed, model=model)
    return result(Status.OPTIMAL, plan, search.best_value,
                  f"optimal within the paper's Algorithm 1 space ({space} candidates, {where}); {counts}")
