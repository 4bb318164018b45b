"""Local reconfiguration: pipelines that lost nothing stay exactly as they are; only the damaged
pipelines' surviving TP groups (and spare groups the old plan left idle) are re-planned.

Why: a global re-plan after one failed GPU re-cuts every pipeline, so every device's layers and
process groups change (at 1,024 devices: 10,889 transfers, 967 of 1,023 survivors sending state,
every group rebuilt). Oobleck's local reconfiguration and TrainMover's "rebuild only the changed
group members" show what operators expect: the survivors that were not hit keep their state and
their groups, so the transition is the few devices that change. The decision then weighs the local
plan against the global one by Eq. 8, each with its own transition (decision.py).

Candidates, all with the intact pipelines unchanged (devices, layers, reliefs kept):
- drop: the damaged pipelines' survivors idle;
- replace: a damaged pipeline keeps its split and each failed slot takes a spare group of the same
  device type (only the spares receive state: the lost stage's layers);
- re-cut: the damaged pipelines' surviving groups, plus spares, re-cut into pipelines of one
  template (solve/templates.py: the min-max split of S stages on that device type) for every S that
  fits, in the groups' old order so early stages keep early layers where they can.
Every candidate keeps the old data-parallel order (`in_old_order`): each intact pipeline keeps its
position and a damaged pipeline's replacement takes the damaged one's, so under ZeRO no intact
pipeline's shard range moves; when the pipeline count changes, the old shard groups stay whole where
their sizes allow. (Appending the new pipelines at the end shifted every later position: at 16,384
devices a one-pipeline re-cut moved 4.7 TB to 7,416 devices instead of state to its own 120.)
Micro-batches are spread over all pipelines by the exact water-filling on each pipeline's fill and
bottleneck (solve/microbatch.py), then rebalanced on exact 1F1B times; every candidate is priced
by the performance model with its best reliefs, and one that does not fit in memory is dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.memory import shard_groups
from chameleon_opt.perf.model import Estimate, PerfModel
from chameleon_opt.perf.relief import choose_reliefs
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.polish import rebalance_exact, spread
from chameleon_opt.solve.templates import build_template


@dataclass(frozen=True)
class LocalPlan:
    """A local candidate: its plan (reliefs chosen), exact step and how it was formed, and the
    estimate that priced it (kept: evaluating it again after its migration is scheduled took 0.34 s
    of that stage at 16,384 devices, the model's memo of the last few evaluations long since moved on)."""

    plan: Plan
    step_s: float
    how: str
    receiving: int  # device x layer pairs whose state is (at least in part) new to them: `receiving_pairs`
    estimate: Estimate


def local_plans(instance: Instance, failed: frozenset[int], model: PerfModel, deadline: Deadline
                ) -> list[LocalPlan]:
    """Every local candidate that fits in memory, fastest first (empty when no pipeline is intact
    or the deadline passes before any is priced). Each candidate costs one exact evaluation."""
    old, tp, total = instance.plan, instance.plan.tensor_parallel, instance.global_micro_batches
    kept = {j: Pipeline(p.stages, p.micro_batches) for j, p in enumerate(old.pipelines)
            if not failed.intersection(p.devices)}
    intact = list(kept.values())
    damaged = [p for p in old.pipelines if failed.intersection(p.devices)]
    copies = instance.spec.training.shard_replicas if model.zero_stage >= 1 else 0  # 0: no sharded state
    if not intact or not damaged:
        return []
    used = set(old.devices)
    spares = [g for g in survivor_groups(instance, failed, tp) if used.isdisjoint(g)]
    survivors = [st.devices for p in damaged for st in p.stages if not failed.intersection(st.devices)]
    shapes: list[tuple[str, list[Pipeline]]] = [("drop: the damaged pipelines' survivors idle", [])]
    replaced, free = [], list(spares)
    for pipe in damaged:  # replace: each failed slot by a spare group of the same device type
        stages = []
        for st in pipe.stages:
            if not failed.intersection(st.devices):
                stages.append(st)
                continue
            kind = model.stage_device(st.devices).name
            donor = next((g for g in free if model.stage_device(g).name == kind), None)
            if donor is None:
                break
            free.remove(donor)
            stages.append(Stage(donor, st.first, st.end, st.relief))
        if len(stages) == len(pipe.stages):
            replaced.append(Pipeline(tuple(stages), pipe.micro_batches))
    if replaced:
        shapes.append((f"replace: {len(replaced)} damaged pipeline(s) keep their split, spare groups take the "
                       "failed slots", replaced))
    pool = survivors + spares
    by_type: dict[str, list[tuple[int, ...]]] = {}
    for group in pool:
        by_type.setdefault(model.stage_device(group).name, []).append(group)
    for kind, groups in by_type.items():  # re-cut: pipelines of one template over the pool's groups of a type
        # fewest pipelines first: one re-cut pipeline in the damaged one's place moves only its own state
        for stages in range(min(len(groups), instance.workload.num_layers), 0, -1):
            if deadline.expired():
                break
            count = len(groups) // stages
            template = build_template(model, groups[0], stages, count + len(intact))
            if template is None:
                continue
            recut = [Pipeline(tuple(Stage(groups[i * stages + s], template.boundaries[s], template.boundaries[s + 1])
                                    for s in range(stages)), 1) for i in range(count)]
            shapes.append((f"re-cut: the damaged pipelines' survivors and spares on {kind} as {count} pipeline(s) of "
                           f"{stages} stage(s)", recut))
    ordered = [(how, in_old_order(len(old.pipelines), kept, new, copies)) for how, new in shapes]
    moving = [receiving_pairs(old, Plan(tp, tuple(pipelines)), copies) for _, pipelines in ordered]
    # Priced in this order: the shape that moves least first (at 16,384 devices a 1 s decision has time
    # for one or two, and only a small migration can then be scheduled), then the others as generated.
    lightest = min(range(len(ordered)), key=lambda i: moving[i])
    found: list[LocalPlan] = []
    for i in [lightest] + [i for i in range(len(ordered)) if i != lightest]:
        if deadline.expired():
            break
        how, pipelines = ordered[i]
        spread_plan = spread(model, pipelines, tp, total)
        if spread_plan is None:
            continue
        chosen = choose_reliefs(model, rebalance_exact(model, spread_plan, deadline), failed)
        if chosen is not None and math.isfinite(chosen[1].iteration_time_s):
            found.append(LocalPlan(chosen[0], chosen[1].iteration_time_s, how, moving[i], chosen[1]))
    return sorted(found, key=lambda candidate: candidate.step_s)


def receiving_pairs(old: Plan, new: Plan, copies: int) -> int:
    """(device, layer) pairs of `new` that receive state, counted without listing a shard: every
    layer of a stage whose pipeline is not an old one unchanged, and under ZeRO (`copies` >= 1
    shard groups) every layer of a pipeline whose shard range moves (its position in its group or
    the group's size changed, comm/state.py). The migration cuts at least one transfer per pair
    that has a missing byte, so this bounds the transfers from below only roughly (a new stage
    may already hold some of its layers); it ranks the local plans by how much they move."""
    def layout(pipe: Pipeline) -> tuple:
        return tuple((st.devices, st.first, st.end) for st in pipe.stages)

    def ranges(count: int) -> list[tuple[int, int]]:  # (position in group, group size) per position
        return [(k - a, b - a) for a, b in shard_groups(count, copies) for k in range(a, b)]

    where = {layout(p): j for j, p in enumerate(old.pipelines)}
    before, after = ranges(len(old.pipelines)), ranges(len(new.pipelines))
    count = 0
    for i, pipe in enumerate(new.pipelines):
        j = where.get(layout(pipe))
        if j is None or (copies >= 1 and before[j] != after[i]):
            count += sum(len(st.devices) * (st.end - st.first) for st in pipe.stages)
    return count


def in_old_order(old_count: int, kept: dict[int, Pipeline], new: list[Pipeline], copies: int) -> list[Pipeline]:
    """The intact pipelines (`kept`, by old position) and the re-planned ones (`new`) in data-parallel
    order: intact pipelines keep their positions, the new ones fill the damaged positions in order
    and any extra come last. A pipeline's position is its slot in every layer's data-parallel group
    and, under ZeRO, its shard range (comm/state.py), so a kept position moves no shard. When the
    count changes, the `copies` consecutive shard groups (perf/memory.py `shard_groups`) re-form; if
    the old groups' surviving members have exactly the new group sizes, whole old groups are placed
    on new groups of their size (order kept within each), so only the groups that lost a member
    re-shard."""
    free = [j for j in range(old_count) if j not in kept]
    at = dict(kept) | dict(zip(free, new))
    ordered = [at[j] for j in sorted(at)] + new[len(free):]
    if copies <= 1 or len(new) > len(free) or len(ordered) == old_count:
        return ordered
    members = [[at[j] for j in range(a, b) if j in at] for a, b in shard_groups(old_count, copies)]
    sizes = [b - a for a, b in shard_groups(len(ordered), copies)]
    if sorted(map(len, members)) != sorted(sizes):
        return ordered
    placed: list[Pipeline] = []
    for size in sizes:  # the first old group of each size, in old order
        placed += members.pop(next(i for i, group in enumerate(members) if len(group) == size))
    return placed


@dataclass(frozen=True)
class Disruption:
    """What a plan change does to the job beyond moving state: devices whose role changes, and
    the process groups (TP groups, data-parallel rings) that must be created anew: every group of
    the new plan whose exact membership did not exist before (a group that lost a member is
    rebuilt too: its communicator still names the dead device)."""

    devices_touched: int
    groups_rebuilt: int
    groups_total: int

    @property
    def rebuilt_share(self) -> float:
        return self.groups_rebuilt / self.groups_total if self.groups_total else 0.0


def _groups(model: PerfModel, plan: Plan, failed: frozenset[int]) -> set[frozenset[int]]:
    """The plan's communicators as device sets: each live TP group, each pipeline's chain of stages
    at one TP rank (Megatron's pipeline groups), and each data-parallel ring (the slots holding one
    set of layers, PerfModel.slot_reduce_times' groups)."""
    dead = model.failed_slots(plan, failed)
    found = {frozenset(st.devices) for j, p in enumerate(plan.pipelines) for s, st in enumerate(p.stages)
             if (j, s) not in dead}
    for j, pipe in enumerate(plan.pipelines):
        if len(pipe.stages) > 1 and not any((j, s) in dead for s in range(len(pipe.stages))):
            found.update(frozenset(st.devices[rank] for st in pipe.stages) for rank in range(plan.tensor_parallel))
    rings: dict[tuple, None] = {}
    for slots in model.layer_holders(plan, dead).values():
        rings.setdefault(tuple(slots))
    for slots in rings:
        if len(slots) > 1:
            found.add(frozenset(d for j, s in slots for d in plan.pipelines[j].stages[s].devices))
    return found


def disruption(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int]) -> Disruption:
    """Devices touched and communicators rebuilt going from `old` to `new` (a communicator whose
    device set existed before is kept; the survivors of a damaged one are rebuilt)."""
    before, after = _groups(model, old, frozenset()), _groups(model, new, failed)
    return Disruption(len(touched_devices(old, new, failed)), len(after - before), len(after))


def touched_devices(old: Plan, new: Plan, failed: frozenset[int]) -> set[int]:
    """Live devices whose role changes: a different layer range, TP rank or stage neighbours, or
    newly used: their process groups must be rebuilt (the others keep theirs)."""
    def roles(plan: Plan) -> dict[int, tuple]:
        found = {}
        for pipe in plan.pipelines:
            for s, st in enumerate(pipe.stages):
                before = pipe.stages[s - 1].devices if s > 0 else None
                after = pipe.stages[s + 1].devices if s + 1 < len(pipe.stages) else None
                for rank, d in enumerate(st.devices):
                    found[d] = (st.first, st.end, rank, st.devices, before, after)
        return found

    was, now = roles(old), roles(new)
    return {d for d, role in now.items() if d not in failed and was.get(d) != role}
