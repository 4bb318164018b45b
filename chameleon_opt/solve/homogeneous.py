"""A lower bound on every plan's step when the survivors are all of one device type, with whole-layer
splits: for the many-layer, many-micro-batch instances the branch and bound refuses (exact.py's split
and table budgets), where the relaxation (bounds.py) splits layers continuously and loses 2-7%.

Step = max_j P_j + R + U (PerfModel.evaluate, gradient all-reduce not overlapped, ZeRO 0). Why each
part below is a true lower bound over the whole space (TP groups formed inside nodes from any
survivors, any pipelines, idle groups, every contiguous split, every micro-batch allocation, every
relief per stage, any placement):

- P_j >= path(split): the 1F1B graph (perf/pipeline.py) has, for every stage s, the path
  F(0..s-1, micro-batch 0) -> every operation of stage s in its 1F1B order -> B(s-1..0, last
  micro-batch), of length sum_{s'<s} w_s' + m w_s, with w = op_forward_s + op_backward_s (sends
  included); the makespan is the longest path, so it is at least the largest of these.
  Each w is bounded below by the fastest relief that fits the stage's memory at its exact in-flight
  count (min(p - s, m), two under offload) and replica class (one pipeline, or several: ZeRO 0 reads
  the replica count only through the gradient bucket buffer), plus each send on the faster link.
  The least path bound over all splits of a p-stage pipeline is exact by a backward DP over layer
  boundaries: a stage put in front of stages s.. adds its w to each of their prefix sums, so
      h_s[a] = min_{b > a} max(m w_s(a, b), w_s(a, b) + h_{s+1}[b]),  h_p[L] = 0,
  and PATH[p, m] = h_0[0], for all m at once (numpy).
- R >= ring(largest stage's gradient bytes of the plan, d replicas): every layer has exactly d
  holders (one per pipeline); a slot reduces its layer groups one after another, each an
  alpha-beta ring over d ranks with a non-negative latency, so its total is at least one ring of
  its summed bytes on the faster link it may use (inter-node when d exceeds the groups one node can
  form); the pipeline with the fewest stages q has a stage holding at least the least largest
  contiguous part of q (`_least_largest`).
- U >= the least largest part of q stages of per-layer optimizer times (each layer at its cheapest
  relief: the step is additive over a stage's layers for a fixed relief). With optimizer offload,
  the space is cut by the most layers K of a stage that offloads it (`homogeneous_bound`): such a
  stage's step is at least the least offloaded step of any K consecutive layers.
- Master: a plan with d pipelines of p_j >= q stages (sum p_j <= groups) and m_j micro-batches has
  max_j P_j >= min t such that sum_j cap(p_j, t) >= M, cap(p, t) the most m with PATH[p, m] <= t
  (a knapsack over stage counts). The bound is min over (d, q) of that t + R + U floors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.comm import ring_allgather_time, ring_allreduce_time
from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.polish import (polish_placement, polish_splits, polish_step_splits, rebalance_exact, relieved,
                                        spread_and_priced)

MEMORY_SLACK = 1e-9
"""Relative slack in favour of fitting: per-layer sums may round differently from the model's prefix
differences; admitting a relief the model refuses only lowers the bound."""
WORK_BUDGET = 10 ** 8
"""Most (stage, micro-batch count, layer range) cells of the pipeline floors (sum over p of p x M x
L^2 / 2): 2.3e7 at 38 layers, 15 groups and 256 micro-batches (0.1-0.4 s); beyond, the bound stays out
(gpt3-175b-1024 has 3.6e10: the relaxation's bound, 0.001% there, keeps its time)."""
SHAPES_TRIED = 3
"""Pipeline sets of least floor built into plans (`shape_plans`): each split and rebalanced on the exact
model (0.01-0.2 s at 32 devices), the best one also placed (0.2-0.4 s)."""
CHUNK = 16
"""Micro-batch counts priced together (one numpy pass): larger m narrows the useful stage sizes."""


@dataclass(frozen=True)
class HomogeneousBound:
    """The bound and what attains it (for the search's reason); pipelines 0: the ceiling itself."""

    value: float
    pipelines: int
    least_stages: int
    shapes: tuple[tuple[float, tuple[int, ...]], ...] = ()  # (floor, stage counts) of each (d, q) below the ceiling


@dataclass(frozen=True)
class _Tables:
    """Per in-flight count x, layer range [a, a + k) (banded: k = 1..layers): over the reliefs that fit,
    the least forward + backward (work), and separately, so that their sum never exceeds any
    relief's, the least forward and the least backward; `boundary[b]`: the cheaper send across
    layer boundary b (index 0: none)."""

    work: np.ndarray
    forward: np.ndarray
    backward: np.ndarray
    ends: np.ndarray      # (a, k) -> a + k, clipped to the layer count
    boundary: np.ndarray


@dataclass(frozen=True)
class _Relief:
    """One relief's prices on a group: op times of every layer range (banded) and per-layer memory."""

    offloads_optimizer: bool
    grid: np.ndarray      # (forward, backward) per (a, k - 1), op overhead included
    static: np.ndarray    # prefix sums of the layers' state
    active: np.ndarray    # prefix sums of one micro-batch's activations (the head's logits included)
    constant: float       # the stage's own terms (backward working set, buffers, framework)
    offload: bool         # activation offload: two micro-batches resident at most


def _reliefs(model: PerfModel, group: tuple[int, ...], replicas: int) -> list[_Relief]:
    """Every supported relief's prices (PerfModel.stage_times, stage_memory_breakdown per layer)."""
    layers = model.workload.num_layers
    priced = []
    for relief in model.relief_options:
        rows = [model.stage_memory_breakdown(group, layer, layer + 1, 0, 1, 1, 0.0, replicas, relief)
                for layer in range(layers)]
        grid = np.full((2, layers + 1, layers), np.inf)
        for a in range(layers):
            for k in range(1, layers - a + 1):
                f, b, _, _ = model.stage_times(group, a, a + k, relief)
                grid[:, a, k - 1] = f + model.op_overhead_s, b + model.op_overhead_s
        mode, offloaded = model.relief_of(relief)
        priced.append(_Relief(
            offloaded, grid, np.concatenate(([0.0], np.cumsum([r.parameters + r.gradients + r.optimizer for r in rows]))),
            np.concatenate(([0.0], np.cumsum([r.activations + r.logits for r in rows]))),
            rows[0].transient + rows[0].comm_buffers + rows[0].framework, mode == "offload"))
    return priced


def _tables(model: PerfModel, group: tuple[int, ...], reliefs: list[_Relief], in_flight_max: int,
            offload_below: int) -> _Tables:
    """The tables over `reliefs`, those that offload the optimizer only on stages of fewer than
    `offload_below` layers."""
    layers = model.workload.num_layers
    capacity = model.stage_device(group).memory_gib * GIB * (1 + MEMORY_SLACK)
    starts = np.arange(layers + 1)[:, None]
    ends = starts + np.arange(1, layers + 1)[None, :]
    valid = ends <= layers
    ends = np.minimum(ends, layers)
    sizes = np.arange(1, layers + 1)[None, :]
    shape = (in_flight_max + 1, layers + 1, layers)
    work, forward, backward = np.full(shape, np.inf), np.full(shape, np.inf), np.full(shape, np.inf)
    for relief in reliefs:
        allowed = valid & (sizes < offload_below) if relief.offloads_optimizer else valid
        grid = relief.grid
        for x in range(1, in_flight_max + 1):
            # memory of [a, b) with x in flight: its layers' state + x their activations (+ the head's
            # logits, in its activations) + the stage's constant terms (PerfModel.stage_memory_breakdown)
            need = relief.static[ends] - relief.static[starts] + (min(x, 2) if relief.offload else x) * (
                relief.active[ends] - relief.active[starts]) + relief.constant
            fits = allowed & (need <= capacity)
            work[x] = np.where(fits, np.minimum(work[x], grid[0] + grid[1]), work[x])
            forward[x] = np.where(fits, np.minimum(forward[x], grid[0]), forward[x])
            backward[x] = np.where(fits, np.minimum(backward[x], grid[1]), backward[x])
    sends = [min(model.boundary_send_on(model.intra, layer), model.boundary_send_on(model.inter, layer))
             for layer in range(layers)]
    return _Tables(work, forward, backward, ends, np.array([np.inf] + sends))


def _pipeline_floors(tables: _Tables, stages_max: int, micro: list[int], ceiling: float,
                     deadline: Deadline) -> np.ndarray | None:
    """floors[p, i]: a lower bound on the 1F1B time of every p-stage pipeline running micro[i]
    micro-batches (every split, relief, placement), or any value above `ceiling` when that bound is;
    None past the deadline. Non-decreasing in m (the exact time is: a running maximum stays a bound)."""
    layers = tables.work.shape[1] - 1
    floors = np.full((stages_max + 1, len(micro)), np.inf)
    single_layer = np.min(tables.work[1], axis=0)  # least work of k layers anywhere, most memory
    for p in range(1, min(stages_max, layers) + 1):
        for lo in range(0, len(micro), CHUNK):
            chunk = np.array(micro[lo:lo + CHUNK], dtype=float)
            # a stage of work w costs m w on its own path: wider stages than the ceiling allows are left out
            useful = single_layer * chunk[0] <= ceiling
            width = int(np.max(np.nonzero(useful)[0], initial=-1)) + 1
            if width == 0:
                break  # and for every larger m
            floors[p, lo:lo + len(chunk)] = _chunk(tables, p, chunk, width)
            if deadline.expired():
                return None
            if floors[p, lo + len(chunk) - 1] > ceiling:
                break  # non-decreasing: the rest are above the ceiling too (left at inf)
        floors[p] = np.maximum.accumulate(floors[p])
    return floors


def pipeline_floors(model: PerfModel, group: tuple[int, ...], replicas: int, groups: int, total: int,
                    ceiling: float, deadline: Deadline) -> np.ndarray | None:
    """[p, m - 1]: a lower bound on the 1F1B time of every p-stage pipeline on groups like `group` running
    m = 1..total micro-batches with `replicas` replicas (ZeRO 0: one, or several), over every split
    and relief (`_pipeline_floors`); above `ceiling` it may be any larger value; None past the deadline."""
    layers = model.workload.num_layers
    stages_max = min(groups, layers)
    tables = _tables(model, group, _reliefs(model, group, min(replicas, 2)), stages_max, layers + 1)
    return _pipeline_floors(tables, stages_max, list(range(1, total + 1)), ceiling, deadline)


def _chunk(tables: _Tables, p: int, m: np.ndarray, width: int) -> np.ndarray:
    """The backward DP over layer boundaries (module docstring) for these micro-batch counts, stages of
    at most `width` layers."""
    layers = tables.work.shape[1] - 1
    m3 = m[:, None, None]
    # a stage [a, a + k) past the last layer ends on the padding column (inf)
    ends = np.arange(layers + 1)[:, None] + np.arange(1, width + 1)[None, :]
    ends = np.where(ends > layers, layers + 1, ends)
    work, forward, backward = (t[:, :, :width] for t in (tables.work, tables.forward, tables.backward))
    send_on = np.append(tables.boundary, np.inf)[ends][None]  # (1, a, k): the send after the stage
    send_back = tables.boundary[:, None][None]                   # (1, a, 1): the send before it
    value = np.full((len(m), layers + 2), np.inf)  # h_s[a]
    value[:, layers] = 0.0
    least = value.copy()  # the least sum of w over the stages s.. covering [a, L)
    with np.errstate(invalid="ignore"):  # 0 x inf where no relief fits: m w is inf there anyway (fmax)
        for s in range(p - 1, -1, -1):
            x = np.minimum(p - s, m).astype(int)
            if (x == x[0]).all():  # every m keeps p - s in flight: one table for all (broadcast)
                w, f, b = work[x[0]][None], forward[x[0]][None], backward[x[0]][None]
            else:
                w, f, b = work[x], forward[x], backward[x]
            if s < p - 1:
                w, f = w + send_on, f + send_on
            if s > 0:
                w, b = w + send_back, b + send_back
            after, later = value[:, ends], least[:, ends]  # the stages after s: their h, their least work
            steady = m3 - p + s  # stage s's forward-backward pairs after its first backward
            terms = np.fmax(np.fmax(m3 * w, w + after),
                            w + later + (m3 - 1) * b + np.maximum(steady, 0.0) * np.where(steady > 0, f, 0.0))
            terms = np.fmax(terms, np.where(steady >= 1, (steady + 1) * w + 2 * later, 0.0))
            value[:, :layers + 1] = terms.min(axis=2)
            least[:, :layers + 1] = (w + later).min(axis=2)
    return value[:, 0]


def _least_largest(sizes: list[float], most: int) -> np.ndarray:
    """[q]: the least largest part of any split of `sizes` into q contiguous non-empty parts, q = 1..most
    (exact._largest_stage for every q at once, vectorised)."""
    prefix = np.concatenate(([0.0], np.cumsum(sizes)))
    span = prefix[None, :] - prefix[:, None]  # [cut, end]: the part (cut, end]
    span = np.where(np.triu(np.ones_like(span, dtype=bool), 1), span, np.inf)
    best = span[0].copy()  # one part over [0, end)
    found = np.full(most + 1, np.inf)
    found[1] = best[-1]
    for q in range(2, most + 1):
        best = np.min(np.maximum(best[:, None], span), axis=0)
        found[q] = best[-1]
    return found


def _caps(floors: np.ndarray, micro: list[int], t: float) -> np.ndarray:
    """Per stage count: the most micro-batches whose floor is at most t; -1 when not even one fits."""
    fits = floors <= t  # non-decreasing floors: a prefix of micro fits
    counts = fits.sum(axis=1)
    return np.where(counts > 0, np.array([0] + micro)[counts], -1)


def _knapsack(caps: np.ndarray, pipelines: int, least: int, groups: int) -> tuple[int, tuple[int, ...]]:
    """Most micro-batches `pipelines` pipelines of at least `least` stages (each with one at least), on
    at most `groups` groups in all, can run with these caps (-1 when none can), and the stage
    counts that do it."""
    best = np.full(groups + 1, -1, dtype=np.int64)  # best[n]: most micro-batches on exactly n groups
    best[0] = 0
    picks: list[np.ndarray] = []  # per pipeline added, per n: the stage count that gave best[n]
    for _ in range(pipelines):
        new, pick = np.full(groups + 1, -1, dtype=np.int64), np.zeros(groups + 1, dtype=np.int64)
        for p in range(least, min(len(caps) - 1, groups) + 1):
            if caps[p] < 1:
                continue
            take = best[:groups + 1 - p]
            better = np.where(take >= 0, take + caps[p], -1) > new[p:]
            new[p:] = np.where(better, take + caps[p], new[p:])
            pick[p:] = np.where(better, p, pick[p:])
        best = new
        picks.append(pick)
    n = int(np.argmax(best))
    if best[n] < 0:
        return -1, ()
    shape = []
    for pick in reversed(picks):
        shape.append(int(pick[n]))
        n -= shape[-1]
    return int(best.max()), tuple(sorted(shape))


def homogeneous_bound(instance: Instance, model: PerfModel, failed: frozenset[int], deadline: Deadline,
                      ceiling: float = math.inf) -> HomogeneousBound | None:
    """The bound (module docstring), or None outside its assumptions or past the deadline. `ceiling`
    must be the step of a plan of the space (or inf): parts of the space whose floors exceed it are
    not refined, and the bound is then at most the ceiling.

    With optimizer offload among the reliefs the space is cut by K, the most layers of a stage that
    offloads its optimizer, so that a relief is charged both in its op times and in the optimizer
    step: K = 0 (no stage offloads it), and K in [lo, hi) for lo, hi = 1, 2, 4, ...: stages offload
    it only below hi layers, and the step is at least the least offloaded step of lo layers."""
    tp = instance.plan.tensor_parallel
    groups = survivor_groups(instance, failed, tp)
    if not groups or model.zero_stage != 0 or model.options.overlap_grad_reduce \
            or (model.options.virtual_stages or 1) > 1:
        return None
    group, layers = groups[0], model.workload.num_layers
    most = min(len(groups), layers)
    if most * (most + 1) // 2 * instance.global_micro_batches * layers * (layers + 1) // 2 > WORK_BUDGET:
        return None
    # groups may be formed from any survivors of a node: every survivor must be of the one type
    if len({instance.device_types[d].name for d in range(instance.num_devices) if d not in failed}) > 1:
        return None
    offloaded = [r for r in model.relief_options if model.relief_of(r)[1]]
    levels = [(layers + 1, 0.0)]  # (opt-offloaded stages have fewer layers than this, optimizer floor)
    if offloaded:
        # K, the most layers of a stage that offloads its optimizer: 0 (none does), or in [lo, hi),
        # where the step is at least the least offloaded step of lo consecutive layers
        cuts = [1] + [k for k in (2, 4, 8, 16, 32, 64) if k < layers] + [layers + 1]
        levels = [(1, 0.0)] + [(hi, min(model.optimizer_time(group, a, a + lo, relief, len(groups))
                                        for relief in offloaded for a in range(layers - lo + 1)))
                               for lo, hi in zip(cuts, cuts[1:])]
    best, shapes = HomogeneousBound(math.inf, 0, 0), []
    priced = {1: _reliefs(model, group, 1), 2: _reliefs(model, group, 2)}  # one pipeline, several
    for offload_below, optimizer_floor in levels:
        found = _level_bound(instance, model, failed, groups, priced, offload_below, optimizer_floor, deadline,
                             ceiling)
        if found is None:
            return None
        best = min(best, found[0], key=lambda b: b.value)
        shapes += found[1]
    if not math.isfinite(best.value) and not math.isfinite(ceiling):
        return None
    # the parts of the space left out (floors above the ceiling, or none fits) all step at least that
    if best.value > ceiling:
        return HomogeneousBound(ceiling, 0, 0)
    return replace(best, shapes=tuple(sorted(set(shapes))))


def _level_bound(instance: Instance, model: PerfModel, failed: frozenset[int], groups: list[tuple[int, ...]],
                 priced: dict[int, list[_Relief]], offload_below: int, optimizer_floor: float, deadline: Deadline,
                 ceiling: float) -> tuple[HomogeneousBound, list[tuple[float, tuple[int, ...]]]] | None:
    """The bound over the plans whose stages offload the optimizer only with fewer than `offload_below`
    layers and whose optimizer step is at least `optimizer_floor` (`priced`: the reliefs per replica
    class), with the pipeline sets below the ceiling; None past the deadline."""
    tp = instance.plan.tensor_parallel
    layers, total, count = model.workload.num_layers, instance.global_micro_batches, len(groups)
    per_node = max(len([d for d in range(n * instance.devices_per_node, (n + 1) * instance.devices_per_node)
                        if d not in failed]) // tp for n in range(instance.spec.cluster.nodes))
    stages_max = min(count, layers)
    group = groups[0]
    # one pipeline runs every micro-batch without a data-parallel replica (ZeRO 0: the replica count
    # only adds the gradient bucket's buffer); several pipelines share them
    single = _pipeline_floors(_tables(model, group, priced[1], stages_max, offload_below), stages_max, [total],
                              ceiling, deadline)
    if single is None:
        return None
    several, micro = None, list(range(1, total))
    if count > 1 and total > 1:
        several = _pipeline_floors(_tables(model, group, priced[2], stages_max, offload_below),
                                   min(count - 1, layers), micro, ceiling, deadline)
        if several is None:
            return None
    grad = [float(g) for g in model.workload.params * model.grad_bytes / tp]
    optimizer = [min(model.optimizer_time(group, layer, layer + 1, relief, count) for relief in model.relief_options)
                 for layer in range(layers)]
    reduce = ring_allgather_time if model.overlap_param_gather else ring_allreduce_time
    best = HomogeneousBound(math.inf, 0, 0)
    shapes: list[tuple[float, tuple[int, ...]]] = []
    grads, steps = _least_largest(grad, stages_max), _least_largest(optimizer, stages_max)
    for least in range(1, stages_max + 1):
        largest, slowest = float(grads[least]), max(float(steps[least]), optimizer_floor)
        for pipelines in range(1, min(count // least, total) + 1):
            links = [model.inter] if pipelines > per_node else [model.inter, model.collective]
            rest = min(reduce(largest, pipelines, link) for link in links) + slowest
            if pipelines == 1:
                value = float(np.min(single[least:, 0])) + rest
                if value < ceiling:
                    shapes.append((value, (least + int(np.argmin(single[least:, 0])),)))
                if value < best.value:
                    best = HomogeneousBound(value, 1, least)
                continue
            floors = several[:, :total - pipelines + 1]  # each of the others runs one at least
            used = micro[:total - pipelines + 1]
            values = np.unique(floors[least:][np.isfinite(floors[least:])])
            if not len(values) or values[0] + rest >= min(best.value, ceiling):
                continue
            if _knapsack(_caps(floors, used, values[-1]), pipelines, least, count)[0] < total:
                continue  # (or only above the ceiling)
            lo, hi = 0, len(values) - 1  # the least t at which they run every micro-batch (monotone in t)
            while lo < hi:
                mid = (lo + hi) // 2
                if _knapsack(_caps(floors, used, values[mid]), pipelines, least, count)[0] >= total:
                    hi = mid
                else:
                    lo = mid + 1
            shapes.append((float(values[lo] + rest), _knapsack(_caps(floors, used, values[lo]), pipelines, least,
                                                                count)[1]))
            if values[lo] + rest < best.value:
                best = HomogeneousBound(float(values[lo] + rest), pipelines, least)
            if deadline.expired():
                return None
    return best, shapes


def shape_plans(instance: Instance, model: PerfModel, failed: frozenset[int], bound: HomogeneousBound,
                deadline: Deadline, incumbent: Plan | None = None, limit: int = SHAPES_TRIED
                ) -> list[tuple[Plan, float]]:
    """Incumbents where the bound says the optimum may be: for the `limit` distinct pipeline sets of
    least floor below the ceiling, its pipelines on the survivors' groups in node order, layers split
    evenly, then micro-batches spread and rebalanced and splits polished on the exact step, the best
    set's stages placed (solve/polish.py); each with its exact step. Only incumbents: the bound does not rest on them.
    The incumbent's own set is skipped (it went through the same polish), and only the best set is
    placed (0.2-0.4 s each at 32 devices, its gains 0.01-0.6%): paper-32's shapes took 1.09 s of every
    plan call, now about 0.4 s, for the same plans on paper-32 and relief-faster-8."""
    tp = instance.plan.tensor_parallel
    groups = survivor_groups(instance, failed, tp)
    layers = model.workload.num_layers
    found: list[tuple[Plan, float]] = []
    own = tuple(sorted(len(pipe.stages) for pipe in incumbent.pipelines)) if incumbent is not None else None
    shapes = [shape for shape in list(dict.fromkeys(shape for _, shape in bound.shapes))[:limit]  # by least floor
              if tuple(sorted(shape)) != own]
    for shape in shapes:
        if deadline.expired():
            break
        pipelines, start = [], 0
        for stages in sorted(shape, reverse=True):
            cuts = [round(i * layers / stages) for i in range(stages + 1)]
            pipelines.append(Pipeline(tuple(Stage(groups[start + i], cuts[i], cuts[i + 1]) for i in range(stages)), 1))
            start += stages
        priced = spread_and_priced(model, pipelines, tp, instance.global_micro_batches, deadline, failed)
        if priced is None:
            continue
        plan, value = priced
        polished = rebalance_exact(model, polish_splits(model, plan, deadline), deadline)
        polished, polished_value = relieved(model, polished, failed)
        if polished_value < value:
            plan, value = polished, polished_value
        if not deadline.expired():
            moved, moved_value = polish_step_splits(model, plan, failed, deadline)
            if moved_value < value:
                plan, value = moved, moved_value
        if math.isfinite(value):
            found.append((plan, value))
    found.sort(key=lambda item: item[1])
    if found and not deadline.expired():  # the placement polish (most of the cost) for the best set only
        placed, placed_value = polish_placement(model, found[0][0], failed, deadline)
        if placed_value < found[0][1]:
            found[0] = (placed, placed_value)
    return sorted(found, key=lambda item: item[1])
