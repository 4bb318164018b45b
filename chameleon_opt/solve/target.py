"""Plans a target trainer can run as they are: the search restricted to its vocabulary.

Megatron-LM and torchtitan both describe a job by degrees: every data-parallel replica is the same
pipeline (the same stage count and layer split: Megatron's --pipeline-model-parallel-layout or its
first/last-stage counts, torchtitan's module lists per model part), every replica runs the same
number of whole micro-batches (global batch = DP x micro-batches x micro-batch size), TP is one
degree for all, and activation recomputation is one global setting (no per-stage relief). Neither
can express rerouting a failed stage's work to its peers: after a failure the job restarts in a
new layout. (`any` keeps the full space of `solve/search.py`.)

The space searched: stage count S, replica count P with P dividing the micro-batches (and a
multiple of training.shard_replicas: both trainers split the data-parallel ranks into that many
equal shard groups, torchtitan's HSDP and Megatron's distributed-optimizer instances; for a
sharded torchtitan job whose release trains a shard degree of 1 in fp32, P / shard_replicas >= 2
unless a replica is one device), every
contiguous layer split (all compositions while there are at most SPLIT_ENUMERATION of them for an S,
else the min-max template split of each device type present and the even split), and every ordered
choice of the surviving TP groups while there are at most PLACEMENT_ENUMERATION (else two orders:
pipeline by pipeline, and stage by stage as the trainers number their ranks), restricted to the
placements the trainer reads from ranks numbered node by node (torchrun's numbering): groups in
device order laid out in one of its rank orders (TRAINER_ORDERS). Within those limits the
search is exact (each candidate priced by the performance model, pruned only by a valid lower bound:
the slowest pipeline's own 1F1B time), and `tests/test_target.py` checks it against a brute force
over every uniform plan; beyond them the splits and orders are heuristic. The bound reported is the
free search's (a lower bound on every plan, so on these too): the gap says what the restriction may
cost at most.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

from chameleon_opt.instance.load import Instance
from chameleon_opt.instance.schema import torchtitan_always_mixed
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Pipeline, Plan, Stage
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.groups import survivor_groups
from chameleon_opt.solve.result import SolveResult, Status
from chameleon_opt.solve.templates import build_template

TARGETS = ("any", "megatron", "torchtitan")
SPLIT_ENUMERATION = 2_000
"""Most layer splits tried per stage count by enumeration; beyond, the template and even splits."""
PLACEMENT_ENUMERATION = 720
"""Most orders of the TP groups tried per (stages, replicas); beyond, by pipeline and by stage."""
TRAINER_ORDERS: dict[str, tuple[str, ...]] = {"megatron": ("tp-dp-pp", "tp-pp-dp"), "torchtitan": ("tp-dp-pp",)}
"""How each trainer reads its global ranks (TP innermost): Megatron-LM's default order (tp-cp-ep-dp-pp)
or, with --use-tp-pp-dp-mapping, tp-pp-dp; torchtitan's device mesh [pp, dp, tp] only."""
SPACE = ("uniform pipelines (one stage count and layer split for every replica, TP kept), whole and "
         "equal micro-batches per replica, the training's own recomputation: what Megatron-LM and "
         "torchtitan express")


def as_run_by(instance: Instance, target: str) -> Instance:
    """The instance as `target` executes it, for pricing the plans searched for it. Megatron-LM
    checkpoints with its own autograd Function (megatron/core/tensor_parallel/random.py,
    CheckpointFunction: the backward reruns `run_function` on the saved inputs in full, as torch's
    reentrant checkpoint does; megatron/core/recompute.py uses it for bf16/fp16/fp32), so its full
    recomputation has no early stop (Training.recompute_early_stop) whatever the job it was
    imported from ran. torchtitan's non-reentrant checkpoint and `any` keep the instance's setting."""
    training = instance.spec.training
    if target != "megatron" or not training.recompute_early_stop:
        return instance
    whole = training.model_copy(update={"recompute_early_stop": False})
    return dataclasses.replace(instance, spec=instance.spec.model_copy(update={"training": whole}))


def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """Boundaries of the split that gives the first stages one layer more (torchtitan's default rule
    and Megatron's even division when it divides)."""
    base, extra = divmod(layers, stages)
    bounds = [0]
    for s in range(stages):
        bounds.append(bounds[-1] + base + (1 if s < extra else 0))
    return tuple(bounds)


def splits(model: PerfModel, groups: list[tuple[int, ...]], layers: int, stages: int, replicas: int
           ) -> list[tuple[int, ...]]:
    """The layer splits tried for `stages` stages: every composition when few, else the min-max
    template split of each device type among `groups` and the even split."""
    if math.comb(layers - 1, stages - 1) <= SPLIT_ENUMERATION:
        return [(0,) + cut + (layers,) for cut in itertools.combinations(range(1, layers), stages - 1)]
    found = {even_split(layers, stages)}
    for group in {model.stage_device(g).name: g for g in groups}.values():
        template = build_template(model, group, stages, replicas)
        if template is not None:
            found.add(template.boundaries)
    return sorted(found)


def _arranged(chosen: tuple[tuple[int, ...], ...], stages: int, replicas: int, order: str
              ) -> tuple[tuple[int, ...], ...]:
    """Groups in device order read as ranks in a trainer's `order` (TP innermost): tp-pp-dp walks a
    pipeline's stages first (pipeline by pipeline), tp-dp-pp a stage's replicas first (stage by
    stage); returned as pipeline j's stage s = result[j * stages + s]."""
    if order == "tp-pp-dp":
        return chosen
    return tuple(chosen[s * replicas + j] for j in range(replicas) for s in range(stages))


def placements(groups: list[tuple[int, ...]], stages: int, replicas: int, orders: tuple[str, ...] | None = None
               ) -> list[tuple[tuple[int, ...], ...]]:
    """Orders of TP groups, read as pipeline j's stage s = order[j * stages + s].

    `orders` None (any placement): every ordered choice while there are at most
    PLACEMENT_ENUMERATION of them, else the survivors in order pipeline by pipeline (neighbouring
    stages on one node) and stage by stage (pipeline-parallel outermost). With a trainer's rank
    `orders`: only what it reads from ranks numbered node by node as torchrun numbers them, i.e. a
    choice of groups in device order arranged in one of those orders: every choice while few, else
    the first ones."""
    needed = replicas * stages
    if orders is None:
        if math.perm(len(groups), needed) <= PLACEMENT_ENUMERATION:
            return list(itertools.permutations(groups, needed))
        orders = ("tp-pp-dp", "tp-dp-pp")
        choices = [tuple(groups[:needed])]
    elif math.comb(len(groups), needed) * len(orders) <= PLACEMENT_ENUMERATION:
        choices = list(itertools.combinations(groups, needed))
    else:
        choices = [tuple(groups[:needed])]
    found = {_arranged(chosen, stages, replicas, order): None for chosen in choices for order in orders}
    return list(found)


def uniform_plans(instance: Instance, failed: frozenset[int], model: PerfModel, deadline: Deadline,
                  orders: tuple[str, ...] | None = None, sharded_precision: bool = False
                  ) -> tuple[Plan | None, float, int, bool]:
    """(best plan, its exact step, candidates priced in full, complete) over the uniform space;
    complete is False when the deadline stopped the enumeration. With `sharded_precision` (a
    trainer that computes in mixed precision only under FSDP sharding) a plan of more than one
    device per replica keeps a data-parallel shard degree of at least 2. A split is priced in full only
    when it fits in memory and the slowest of its distinct pipelines alone (exact 1F1B, a lower
    bound on the step) beats the best so far: pruning that keeps the search exact."""
    tp, total, layers = instance.plan.tensor_parallel, instance.global_micro_batches, instance.workload.num_layers
    node = instance.node_of
    groups = survivor_groups(instance, failed, tp)
    virtual = model.options.virtual_stages or 1
    best: tuple[Plan | None, float] = (None, math.inf)
    priced = 0
    for stages in range(1, min(layers, len(groups)) + 1):
        for replicas in range(len(groups) // stages, 0, -1):
            if total % replicas or replicas % model.shard_copies:  # trainers split DP into equal shard groups
                continue
            if sharded_precision and replicas // model.shard_copies < 2 and (stages > 1 or tp > 1):
                continue
            holders = {layer: replicas for layer in range(layers)}
            for used in placements(groups, stages, replicas, orders):
                # pipelines alike in device types and node boundaries cost alike: one stands for all
                shapes = {tuple((model.stage_device(used[j * stages + s]).name,
                                 s + 1 < stages and node(used[j * stages + s][0]) == node(used[j * stages + s + 1][0]))
                                for s in range(stages)): j for j in range(replicas)}
                for bounds in splits(model, list(used), layers, stages, replicas):
                    if deadline.expired():
                        return best[0], best[1], priced, False
                    plan = Plan(tp, tuple(Pipeline(tuple(Stage(used[j * stages + s], bounds[s], bounds[s + 1])
                                                         for s in range(stages)), total // replicas)
                                          for j in range(replicas)))
                    floor = 0.0
                    for j in shapes.values():
                        costs = model.stage_costs(plan, j, [0.0] * stages, holders)
                        if any(c.memory_bytes > c.memory_capacity_bytes for c in costs):
                            floor = math.inf
                            break
                        floor = max(floor, model.pipeline_time(costs, total // replicas, virtual))
                    if floor >= best[1] * (1 - 1e-12):
                        continue
                    estimate = model.evaluate(plan, failed)
                    priced += 1
                    if estimate.memory_ok and estimate.iteration_time_s < best[1] * (1 - 1e-12):
                        best = (plan, estimate.iteration_time_s)
    return best[0], best[1], priced, True


def target_plan(instance: Instance, failed: frozenset[int], target: str, model: PerfModel, deadline: Deadline,
                bound: float | None = None) -> SolveResult[Plan]:
    """The fastest plan `target` can run over the survivors (see the module docstring), with the
    free search's `bound` when given. INFEASIBLE only when the uniform space was searched whole and
    nothing fits."""
    start = time.perf_counter()
    source = instance.spec.trainer
    # torchtitan before June 2026 runs a shard degree of 1 as DDP (or nothing) in fp32, not the
    # job's bf16: a recovery to it would not train as priced (parallelize.py, apply_ddp)
    sharded_precision = target == "torchtitan" and instance.spec.training.zero >= 1 and not (
        source is not None and source.name == "torchtitan" and torchtitan_always_mixed(source.era, source.config))
    plan, step, priced, complete = uniform_plans(instance, failed, model, deadline, TRAINER_ORDERS.get(target),
                                                 sharded_precision)
    wall = time.perf_counter() - start
    note = f"{target}: {priced} uniform plans priced" + ("" if complete else " (stopped at the deadline)")
    if plan is None:
        status = Status.INFEASIBLE if complete else Status.NO_SOLUTION
        why = "no uniform plan fits in memory" if complete else "no uniform plan found in time"
        if sharded_precision:
            why += (" with a data-parallel shard degree of at least 2 (this torchtitan release trains a shard degree "
                    "of 1 in fp32, not the job's mixed precision)")
        return SolveResult(status, None, None, None, wall, "uniform", 0.0, None, f"{why}; {note}; space: {SPACE}",
                           stopped_early=not complete)
    bound = None if bound is None else min(bound, step)
    proven = bound is not None and step - bound <= 1e-6 * step
    return SolveResult(Status.OPTIMAL if proven else Status.FEASIBLE, plan, step, bound, wall, "uniform", 0.0, None,
                       f"{note}; best of the uniform space" + ("" if complete else " so far") + f"; space: {SPACE}",
                       stopped_early=not complete)
