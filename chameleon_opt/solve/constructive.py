"""Constructive mixes of pipeline templates: fast plans, warm starts and incumbents for the search.

A `Mix` is the search's decision before lowering: how many pipelines of each template (device type
x stage count, with its best layer split) and how many micro-batches each runs. Its
`modelled_time` is the level model's objective (solve/levels.py): the slowest pipeline's 1F1B
surrogate plus the slowest gradient sync. The constructions here need no solver: the best single
template (`heuristic_mix`), the previous plan restricted to the survivors (`restricted_mix`), the
fewest pipelines that cover every micro-batch within a makespan, each device type's groups spent
by an unbounded knapsack (`cover_mix`), bisection on that makespan per sync level
(`bound_guided_mix`), and the neighbours of a mix for the exact polish (`neighbour_mixes`).
`lower` places a mix's pipelines on TP groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.microbatch import allocate_greedy
from chameleon_opt.solve.templates import Template



@dataclass(frozen=True)
class Mix:
    """Pipelines per template and their micro-batches: the search's decision, before lowering."""

    counts: tuple[int, ...]
    micro_batches: tuple[tuple[int, ...], ...]  # per template, one entry per pipeline


def modelled_time(templates: list[Template], mix: Mix) -> float:
    """The objective the CP-SAT model minimises, in seconds."""
    used = [k for k, c in enumerate(mix.counts) if c]
    slowest = max(templates[k].pipeline_time(m) for k in used for m in mix.micro_batches[k])
    return slowest + max(templates[k].sync_s for k in used)


def lower(templates: list[Template], mix: Mix, groups_by_type: dict[str, list[tuple[int, ...]]], tp: int) -> Plan:
    """Pipelines with devices: longest pipelines first, each on consecutive TP groups (so its
    neighbouring stages share nodes where they can)."""
    pipelines: list[Pipeline] = []
    cursor = {name: 0 for name in groups_by_type}
    order = sorted(range(len(templates)), key=lambda k: -templates[k].stages)
    for k in order:
        template = templates[k]
        for share in mix.micro_batches[k]:
            pool = groups_by_type[template.device_type]
            start = cursor[template.device_type]
            cursor[template.device_type] += template.stages
            stages = tuple(Stage(pool[start + s], template.boundaries[s], template.boundaries[s + 1])
                           for s in range(template.stages))
            pipelines.append(Pipeline(stages, share))
    return Plan(tp, tuple(pipelines))


def heuristic_mix(templates: list[Template], budget: dict[str, int], total: int) -> Mix | None:
    """Fast constructive plan: the best single template used as many times as groups allow, with
    micro-batches balanced exactly (greedy). The warm start and the fallback."""
    best: tuple[float, Mix] | None = None
    for k, template in enumerate(templates):
        count = min(budget[template.device_type] // template.stages, total)
        if count < max(template.min_pipelines, 1):
            continue
        shares = allocate_greedy([template.fill_s] * count, [template.per_micro_batch_s] * count, total,
                                 [template.max_level] * count).solution
        if shares is None:
            continue
        counts = tuple(count if i == k else 0 for i in range(len(templates)))
        mix = Mix(counts, tuple(tuple(shares) if i == k else () for i in range(len(templates))))
        value = modelled_time(templates, mix)
        if best is None or value < best[0]:
            best = (value, mix)
    return None if best is None else best[1]


def restricted_mix(plan: Plan, failed: frozenset[int], templates: list[Template], budget: dict[str, int],
                   total: int, model: PerfModel) -> Mix | None:
    """The previous plan restricted to the survivors, as a warm start: its untouched pipelines,
    each mapped to the template of its device type and length (whose split is at least as good),
    with the micro-batches spread over them exactly. None when no pipeline survived intact."""
    index = {(t.device_type, t.stages): k for k, t in enumerate(templates) if t.max_level is None}
    chosen = []
    for pipe in plan.pipelines:
        if failed.intersection(pipe.devices):
            continue
        types = {model.stage_device(stage.devices).name for stage in pipe.stages}
        key = (types.pop(), len(pipe.stages))
        if types or key not in index:  # a pipeline of mixed device types has no template
            return None
        chosen.append(index[key])
    used: dict[str, int] = {}
    for k in chosen:
        used[templates[k].device_type] = used.get(templates[k].device_type, 0) + templates[k].stages
    if not chosen or len(chosen) > total or any(n > budget.get(name, 0) for name, n in used.items()):
        return None
    spread = allocate_greedy([templates[k].fill_s for k in chosen], [templates[k].per_micro_batch_s for k in chosen],
                             total).solution or ()
    shares: list[list[int]] = [[] for _ in templates]
    for k, m in zip(chosen, spread):
        shares[k].append(m)
    mix = Mix(tuple(len(x) for x in shares), tuple(tuple(x) for x in shares))
    return None if any(c and sum(mix.counts) < templates[k].min_pipelines for k, c in enumerate(mix.counts)) else mix


def micro_batch_cap(template: Template, makespan: float) -> int:
    """Most micro-batches one pipeline of `template` runs within `makespan` (0 if not even one)."""
    if makespan < template.fill_s:
        return 0
    return min(math.floor((makespan - template.fill_s) / template.per_micro_batch_s + 1e-12) + 1,
               template.max_level or 10 ** 9)


KNAPSACK_CELLS = 200_000
"""Above this many (groups x templates) DP cells the cover falls back to the greedy by rate."""


def best_counts(items: list[tuple[int, int, int]], groups: int) -> dict[int, int]:
    """Pipelines per template maximising micro-batches covered with at most `groups` TP groups.

    items: (template, stages, micro-batches per pipeline). Exact unbounded-knapsack DP when small,
    else greedy by micro-batches per group (near-exact when groups are many)."""
    counts: dict[int, int] = {}
    if not items:
        return counts
    if groups * len(items) > KNAPSACK_CELLS:
        left = groups
        for k, stages, cap in sorted(items, key=lambda item: -item[2] / item[1]):
            counts[k] = left // stages
            left -= counts[k] * stages
        return counts
    best = [0] * (groups + 1)
    choice = [-1] * (groups + 1)
    for g in range(1, groups + 1):
        best[g], choice[g] = best[g - 1], -1
        for i, (_, stages, cap) in enumerate(items):
            if stages <= g and best[g - stages] + cap > best[g]:
                best[g], choice[g] = best[g - stages] + cap, i
    g = groups
    while g > 0:
        if choice[g] < 0:
            g -= 1
            continue
        k, stages, _ = items[choice[g]]
        counts[k] = counts.get(k, 0) + 1
        g -= stages
    return counts


def cover_mix(templates: list[Template], allowed: list[int], budget: dict[str, int], total: int,
              makespan: float) -> Mix | None:
    """Pipelines that finish within `makespan` and cover every micro-batch, using each device
    type's groups as productively as possible; None when no such set exists (or it violates a
    template's minimum pipeline count)."""
    chosen: list[tuple[int, int]] = []  # (template, cap) per pipeline
    for name, groups in budget.items():
        items = [(k, templates[k].stages, micro_batch_cap(templates[k], makespan)) for k in allowed
                 if templates[k].device_type == name and micro_batch_cap(templates[k], makespan) > 0]
        for k, n in best_counts(items, groups).items():
            chosen += [(k, micro_batch_cap(templates[k], makespan))] * n
    chosen.sort(key=lambda item: -item[1])
    kept, covered = [], 0
    for k, cap in chosen:  # fewest pipelines that still cover everything
        if covered >= total:
            break
        kept.append(k)
        covered += cap
    if covered < total or any(len(kept) < templates[k].min_pipelines for k in set(kept)):
        return None
    spread = allocate_greedy([templates[k].fill_s for k in kept], [templates[k].per_micro_batch_s for k in kept],
                             total, [templates[k].max_level for k in kept]).solution or ()
    shares: list[list[int]] = [[] for _ in templates]
    for k, m in zip(kept, spread):
        shares[k].append(m)
    return Mix(tuple(len(x) for x in shares), tuple(tuple(x) for x in shares))


def bound_guided_mix(templates: list[Template], budget: dict[str, int], total: int, incumbent: Mix,
                     deadline: Deadline = Deadline.never()) -> Mix:
    """For every sync level, the least makespan (bisection) at which the greedy cover succeeds;
    the best such mix, or `incumbent` when none beats it. Near-optimal when groups are many.
    Past `deadline` the best mix so far is returned."""
    best, best_value = incumbent, modelled_time(templates, incumbent)
    for level in sorted({t.sync_s for t in templates}):
        if deadline.expired():
            break
        allowed = [k for k, t in enumerate(templates) if t.sync_s <= level]
        low = min(templates[k].fill_s for k in allowed)
        if low + level > best_value:
            break
        high = best_value - level
        if cover_mix(templates, allowed, budget, total, high) is None:
            continue
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (low, middle) if cover_mix(templates, allowed, budget, total, middle) else (middle, high)
        mix = cover_mix(templates, allowed, budget, total, high)
        if mix is not None and mix_rank(templates, mix) < mix_rank(templates, best):
            best, best_value = mix, modelled_time(templates, mix)
    return best


def mix_rank(templates: list[Template], mix: Mix) -> tuple[float, int]:
    """Order of mixes: modelled time (to the nanosecond), then fewer pipelines (smaller gradient
    rings, fewer sends): the same tie-break as the solvers' objective."""
    return round(modelled_time(templates, mix), 9), sum(mix.counts)


def neighbour_mixes(templates: list[Template], budget: dict[str, int], total: int, mix: Mix) -> list[Mix]:
    """Mixes near `mix`: the groups of one used template re-cut into pipelines of any other length
    (all of its pipelines), or one of its pipelines moved to an adjacent length; any template of
    that length and device type (level-capped ones included); micro-batches re-spread exactly
    within the caps. Ordered by the model's rank, so the likeliest come first."""
    by_length: dict[tuple[str, int], list[int]] = {}
    for k, t in enumerate(templates):
        by_length.setdefault((t.device_type, t.stages), []).append(k)
    found = []
    for k, count in enumerate(mix.counts):
        if not count:
            continue
        t = templates[k]
        lengths = {length for (name, length) in by_length if name == t.device_type and length != t.stages}
        for stages in sorted(lengths, key=lambda length: abs(length - t.stages)):
            adjacent = abs(stages - t.stages) == 1  # one pipeline moved: only to adjacent lengths
            for other, whole in ((o, w) for o in by_length[(t.device_type, stages)] for w in (True, False)
                                 if w or adjacent):
                counts = list(mix.counts)
                counts[k] = 0 if whole else counts[k] - 1  # re-cut all its pipelines, or just one
                used = sum(templates[i].stages * c for i, c in enumerate(counts)
                           if templates[i].device_type == t.device_type)
                room = (budget[t.device_type] - used) // stages
                if whole:
                    counts[other] += max(room - counts[other], 0)
                elif room >= 1:
                    counts[other] += 1
                else:
                    continue
                chosen = [i for i, c in enumerate(counts) for _ in range(c)]
                if not chosen or len(chosen) > total:
                    continue
                spread = allocate_greedy([templates[i].fill_s for i in chosen],
                                         [templates[i].per_micro_batch_s for i in chosen], total,
                                         [templates[i].max_level for i in chosen]).solution
                if spread is None:
                    continue
                shares: list[list[int]] = [[] for _ in templates]
                for i, m in zip(chosen, spread):
                    shares[i].append(m)
                candidate = Mix(tuple(len(x) for x in shares), tuple(tuple(x) for x in shares))
                if all(not c or len(chosen) >= templates[i].min_pipelines for i, c in enumerate(candidate.counts)):
                    found.append(candidate)
    return sorted(found, key=lambda candidate: mix_rank(templates, candidate))
