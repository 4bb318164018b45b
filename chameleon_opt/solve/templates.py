"""Pipeline templates: for each device type and stage count S, the best layer split of one pipeline.

Plan search then only decides how many pipelines of each template to run and how many
micro-batches each gets. A template's split minimises the bottleneck stage time subject to
per-stage memory (stage s holds S - s micro-batches in flight under 1F1B): on identical devices
the sum of stage times is fixed, so this also minimises the 1F1B surrogate
sum_s t_s + (M - 1) max_s t_s. The split is found exactly by bisection on the bottleneck with a
greedy feasibility check: filling each stage as far as time and memory allow is optimal because
later stages keep fewer micro-batches in flight, so they are never tighter than earlier ones.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from chameleon_opt.perf.comm import ring_allreduce_time
from chameleon_opt.perf.memory import shard_group_size
from chameleon_opt.perf.model import LayerCosts, PerfModel
from chameleon_opt.solve.deadline import Deadline


@dataclass(frozen=True)
class Template:
    device_type: str
    stages: int
    boundaries: tuple[int, ...]      # stage s owns layers [boundaries[s], boundaries[s+1])
    stage_times_s: tuple[float, ...]  # per micro-batch, blocking p2p sends included
    sync_s: float                     # gradient all-reduce + optimizer step (estimate)
    min_pipelines: int                # fewest replicas for the memory to fit (distributed optimizer)
    max_level: int | None = None      # valid only for pipelines running at most this many micro-batches

    def allows(self, micro_batches: int) -> bool:
        return self.max_level is None or micro_batches <= self.max_level

    @property
    def fill_s(self) -> float:
        """One micro-batch's trip through every stage."""
        return float(sum(self.stage_times_s))

    @property
    def per_micro_batch_s(self) -> float:
        """The bottleneck stage: what each further micro-batch adds in steady 1F1B."""
        return float(max(self.stage_times_s))

    def pipeline_time(self, micro_batches: int) -> float:
        """1F1B surrogate fill + (m - 1) x bottleneck (Eq. 9 when stages are identical)."""
        return self.fill_s + (micro_batches - 1) * self.per_micro_batch_s


def _stage_overheads(model: PerfModel, group: tuple[int, ...], stages: int) -> np.ndarray:
    """Blocking sends per micro-batch: forward to the next stage, backward to the previous one
    (across nodes: the conservative placement)."""
    n = model.workload.num_layers
    send = model.inter.send_time(model.workload.boundary_bytes_per_sample[max(n - 2, 0)] * model.micro_batch_size)
    send = send + model.p2p_overhead_s if send > 0 else 0.0
    overhead = np.zeros(stages)
    if stages > 1:
        overhead[:-1] += send
        overhead[1:] += send
    return overhead


def min_max_split(costs: LayerCosts, overhead: np.ndarray, optimizer_shards: int = 1,
                  sharded_bytes: np.ndarray | None = None,
                  in_flight: list[int] | None = None) -> tuple[int, ...] | None:
    """Boundaries of S = len(overhead) contiguous non-empty stages minimising the slowest stage,
    with stage s's memory static + in_flight[s] x activations + transient under capacity (1F1B:
    in_flight[s] = S - s by default); None if no split fits. `sharded_bytes` (per layer) is
    divided by `optimizer_shards`. The greedy stays exact as long as in_flight never increases
    with s (later stages are never tighter), which min(S - s, m) satisfies."""
    stages, n = len(overhead), len(costs.time_s)
    in_flight = in_flight or [stages - s for s in range(stages)]
    if stages > n:
        return None
    static = costs.static_bytes if sharded_bytes is None else costs.static_bytes - sharded_bytes * (
        1 - 1 / optimizer_shards)
    time_prefix = np.concatenate([[0.0], np.cumsum(costs.time_s)]).tolist()
    static_prefix = np.concatenate([[0.0], np.cumsum(static)]).tolist()
    act_prefix = np.concatenate([[0.0], np.cumsum(costs.activation_bytes)]).tolist()
    overhead_list = overhead.tolist()
    budget = costs.capacity_bytes - costs.transient_bytes

    def greedy(bottleneck: float) -> tuple[tuple[int, ...] | None, float]:
        """The greedy split under `bottleneck` (None when it fails) and a value that tightens the
        search: when it fits, its slowest stage (a bottleneck that split attains); when it fails,
        the least stage time that was refused for time (below it every stage ends where it did,
        so the greedy fails the same way: the optimum is at least that)."""
        bounds, position, slowest, refused = [0], 0, 0.0, math.inf
        for s in range(stages):
            last_allowed = n - (stages - s - 1)
            end, taken = position, 0.0
            while end < last_allowed:
                nxt = end + 1
                t = time_prefix[nxt] - time_prefix[position] + overhead_list[s]
                memory = static_prefix[nxt] - static_prefix[position] + in_flight[s] * (
                    act_prefix[nxt] - act_prefix[position])
                if memory > budget:
                    break
                if t > bottleneck:
                    refused = min(refused, t)
                    break
                end, taken = nxt, t
            if end == position:
                return None, refused
            bounds.append(end)
            position, slowest = end, max(slowest, taken)
        return (tuple(bounds), slowest) if position == n else (None, refused)

    high = float(time_prefix[-1] + overhead.max())
    split, attained = greedy(high)
    if split is None:
        return None
    # Bisection on the bottleneck, each probe also snapping the bracket to the stage times the
    # greedy met (`greedy`): the optimum is one of them, so the bracket closes on it in 10-20
    # probes where halving alone took 40-45 (12,000 greedy calls at 16,384 devices).
    high = attained
    low = max(float(time_prefix[-1] / stages), float(costs.time_s.max()))
    for _ in range(60):
        if high - low <= 1e-12 * max(high, 1.0):
            break
        middle = (low + high) / 2
        found, value = greedy(middle)
        if found is None:
            low = max(middle, value)
        else:
            split, high = found, value
    return split


MAX_LEVEL_VARIANTS = 1500
"""Most level-capped template variants built per device type (each costs one bisection)."""


def build_template(model: PerfModel, group: tuple[int, ...], stages: int, pipelines_guess: int,
                   max_level: int | None = None, relieved: bool = False, replicated: bool = True) -> Template | None:
    """The best `stages`-stage pipeline on groups like `group`, or None when it cannot fit.

    With `max_level` = c the pipeline runs at most c micro-batches, so stage s holds only
    min(S - s, c) in flight, which can admit a faster split under tight memory. `relieved`: memory
    as under the lightest supported relief, times of the fastest (the plan's reliefs are chosen
    exactly afterwards); otherwise the fastest relief's time and memory. `replicated`: other
    pipelines may run beside it (see `_costs`)."""
    costs = _costs(model, group, relieved, replicated)
    overhead = _stage_overheads(model, group, stages)
    in_flight = [min(stages - s, max_level) if max_level else stages - s for s in range(stages)]
    sharded = model.workload.params / len(group) * model.optimizer_bytes if model.shard_optimizer else None
    bounds = min_max_split(costs, overhead, shard_group_size(pipelines_guess, model.shard_copies), sharded, in_flight)
    if bounds is None:
        return None
    time_prefix = np.concatenate([[0.0], np.cumsum(costs.time_s)])
    times = tuple(float(time_prefix[bounds[s + 1]] - time_prefix[bounds[s]] + overhead[s]) for s in range(stages))
    min_pipelines = 1
    if sharded is not None:  # fewest replicas whose optimizer shards make every stage fit
        groups = 1  # shard-group size they need; `shard_copies` groups of it (perf.memory.shard_group_size)
        for s in range(stages):
            a, b = bounds[s], bounds[s + 1]
            rest = (costs.static_bytes[a:b].sum() - sharded[a:b].sum()) + in_flight[s] * costs.activation_bytes[
                a:b].sum() + costs.transient_bytes
            room = costs.capacity_bytes - rest
            need = sharded[a:b].sum()
            if need > 0:
                groups = max(groups, math.ceil(need / room) if room > 0 else 10 ** 9)
        min_pipelines = 1 if groups <= 1 else groups * model.shard_copies
    grad = model.workload.params * model.grad_bytes / len(group)
    largest = max(float(grad[bounds[s]:bounds[s + 1]].sum()) for s in range(stages))
    sync = ring_allreduce_time(largest, max(pipelines_guess, 1), model.inter)
    sync += max(model.optimizer_time(group, bounds[s], bounds[s + 1], replicas=max(pipelines_guess, 1))
                for s in range(stages))
    return Template(model.stage_device(group).name, stages, bounds, times, sync, min_pipelines, max_level)


def _costs(model: PerfModel, group: tuple[int, ...], relieved: bool, replicated: bool = False) -> LayerCosts:
    """Per-layer rows with unsharded state (the templates shard it themselves). `replicated`: the
    pipeline may have replicas, so its stages also hold what replicas cost beyond the state (a
    gradient bucket, ZeRO-3's gathered layers): the rows are then exactly as tight as the checker's
    memory model for every replica count, instead of a bucket short of it."""
    def rows(replicas: int) -> LayerCosts:
        return model.relief_layer_costs(group, replicas=replicas) if relieved else \
            model.layer_costs(group, replicas=replicas, relief=model.fastest_relief)

    alone = rows(1)
    if not replicated:
        return alone
    shared = rows(2 * model.shard_copies)  # a shard group of two: ZeRO-3's gathered layers counted
    return replace(alone, transient_bytes=shared.transient_bytes, capacity_bytes=shared.capacity_bytes,
                   stage_constant_bytes=shared.stage_constant_bytes)


def build_templates(model: PerfModel, groups: list[tuple[int, ...]], deadline: Deadline = Deadline.never()) -> list[Template]:
    """Every feasible template per device type present among `groups` (one group per stage), plus
    level-capped variants (S stages running c < S micro-batches hold fewer in flight) wherever
    memory binds and a cap buys a faster split; at most MAX_LEVEL_VARIANTS bisections per type.
    Past `deadline` no further stage count is tried: the templates are incumbents'
    building blocks, so fewer of them weaken the incumbent, never the search's bound. With several
    supported memory reliefs, each template is built twice: as the fastest relief fits, and as the
    lightest admits."""
    by_type: dict[str, list[tuple[int, ...]]] = {}
    for group in groups:
        by_type.setdefault(model.stage_device(group).name, []).append(group)
    templates = []
    for members, relieved in itertools.product(by_type.values(), (False, True) if len(model.relief_options) > 1
                                               else (False,)):
        most = min(len(members), model.workload.num_layers)
        costs = _costs(model, members[0], relieved)
        unbounded = LayerCosts(costs.time_s, np.zeros_like(costs.static_bytes), np.zeros_like(costs.activation_bytes),
                               0.0, math.inf)
        variants = 0
        for stages in range(1, most + 1):
            if templates and deadline.expired():
                break
            count = len(members) // stages
            replicated = len(groups) > stages  # another pipeline fits beside one of this length
            base = build_template(model, members[0], stages, count, relieved=relieved, replicated=replicated)
            if base is not None and base.min_pipelines <= count:
                templates.append(base)
                best = base.per_micro_batch_s
            else:
                best = math.inf
            overhead = _stage_overheads(model, members[0], stages)
            free_bounds = min_max_split(unbounded, overhead)  # the split if memory never bound
            free = math.inf if free_bounds is None else max(
                float(costs.time_s[free_bounds[s]:free_bounds[s + 1]].sum()) + overhead[s] for s in range(stages))
            for cap in range(stages - 1, 0, -1):
                if variants >= MAX_LEVEL_VARIANTS or best <= free * (1 + 1e-12):
                    break
                variants += 1
                capped = build_template(model, members[0], stages, count, cap, relieved, replicated)
                if capped is not None and capped.min_pipelines <= count and capped.per_micro_batch_s < best - 1e-12:
                    templates.append(capped)
                    best = capped.per_micro_batch_s
    return templates

