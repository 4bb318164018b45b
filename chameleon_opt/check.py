"""The independent plan checker: nothing leaves a solver unless this says it is sound.

It re-derives every property from the plan and the instance (not from the solver's model):
devices alive, in range and used once; TP groups of the right size (inside one node for new
plans); every pipeline owning every layer exactly once, in order; every micro-batch assigned
once (rerouted work included); every stage's memory relief one the trainer supports; memory under
capacity on every stage with its relief.
"""

from __future__ import annotations

from dataclasses import dataclass

from chameleon_opt.errors import ChameleonError
from chameleon_opt.instance.load import Instance
from chameleon_opt.perf.model import GIB, PerfModel, interleaving_refusal, memory_reason
from chameleon_opt.plan import Plan


@dataclass(frozen=True)
class CheckReport:
    violations: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.violations


class PlanRejected(ChameleonError):
    """A solver produced a plan the checker rejects: a bug, never a user error. It reaches the user
    as one line naming the stage (exit 1), never as a traceback."""

    exit_code = 1

    def __init__(self, stage: str, violations: tuple[str, ...]) -> None:
        self.stage, self.violations = stage, violations
        super().__init__(f"internal error: the {stage}'s plan was rejected by the checker (a bug, please report it "
                         f"with the instance): " + "; ".join(violations[:5]))


def check_plan(instance: Instance, plan: Plan, failed: frozenset[int] = frozenset(),
               require_tp_in_node: bool = True, model: PerfModel | None = None) -> CheckReport:
    """All violations of `plan` on `instance` with `failed` devices dead (empty when sound).

    Slots whose devices failed are allowed only when all their micro-batches are rerouted."""
    problems: list[str] = []
    n_layers = instance.workload.num_layers
    seen: set[int] = set()
    dead_slots: set[tuple[int, int]] = set()
    for j, pipe in enumerate(plan.pipelines):
        if pipe.micro_batches < 1:
            problems.append(f"pipeline {j} runs {pipe.micro_batches} micro-batches")
        position = 0
        for s, stage in enumerate(pipe.stages):
            where = f"pipeline {j} stage {s}"
            if len(stage.devices) != plan.tensor_parallel:
                problems.append(f"{where}: {len(stage.devices)} devices, TP is {plan.tensor_parallel}")
            for d in stage.devices:
                if not 0 <= d < instance.num_devices:
                    problems.append(f"{where}: device {d} does not exist")
                elif d in seen:
                    problems.append(f"{where}: device {d} is used twice")
                seen.add(d)
            if failed.intersection(stage.devices):
                dead_slots.add((j, s))
            if require_tp_in_node and len({instance.node_of(d) for d in stage.devices}) > 1:
                problems.append(f"{where}: TP group {list(stage.devices)} spans nodes")
            if stage.first != position or stage.end <= stage.first:
                problems.append(f"{where}: layers [{stage.first}, {stage.end}) do not follow layer {position}")
            position = max(position, stage.end)
        if position != n_layers:
            problems.append(f"pipeline {j}: layers end at {position}, the model has {n_layers}")
    if plan.total_micro_batches != instance.global_micro_batches:
        problems.append(f"{plan.total_micro_batches} micro-batches assigned, the global batch needs "
                        f"{instance.global_micro_batches}")
    rerouted: dict[tuple[int, int], float] = {}
    for r in plan.rerouted:
        key = (r.from_pipeline, r.stage)
        rerouted[key] = rerouted.get(key, 0.0) + r.micro_batches
        if key not in dead_slots:
            problems.append(f"micro-batches rerouted from live slot {key}")
        target = plan.pipelines[r.to_pipeline].stages[r.stage] if r.to_pipeline < len(plan.pipelines) \
            and r.stage < len(plan.pipelines[r.to_pipeline].stages) else None
        source = plan.pipelines[r.from_pipeline].stages[r.stage] if key in dead_slots else None
        if target is None or (r.to_pipeline, r.stage) in dead_slots:
            problems.append(f"micro-batches rerouted to a missing or failed slot ({r.to_pipeline}, {r.stage})")
        elif source is not None and (target.first, target.end) != (source.first, source.end):
            problems.append(f"slot ({r.to_pipeline}, {r.stage}) does not hold the rerouted layers")
    for j, s in sorted(dead_slots):
        owed = plan.pipelines[j].micro_batches
        if abs(rerouted.get((j, s), 0.0) - owed) > 1e-9:
            problems.append(f"pipeline {j} stage {s} has failed devices and {rerouted.get((j, s), 0.0):g} of its "
                            f"{owed} micro-batches rerouted")
    model = model or PerfModel(instance)
    for j, pipe in enumerate(plan.pipelines):
        refusal = interleaving_refusal(len(pipe.stages), pipe.micro_batches, model.options.virtual_stages or 1)
        if refusal is not None:
            problems.append(f"pipeline {j}: {refusal}")
        for s, stage in enumerate(pipe.stages):
            if stage.relief is not None and stage.relief not in model.relief_options:
                problems.append(f"pipeline {j} stage {s}: relief {stage.relief!r} is not one the trainer supports "
                                f"({', '.join(model.relief_options)})")
    if not problems:
        estimate = model.evaluate(plan, failed)
        for j, (pipe, est) in enumerate(zip(plan.pipelines, estimate.pipelines)):
            for s, cost in enumerate(est.stages):
                if (j, s) not in dead_slots and cost.memory_bytes > cost.memory_capacity_bytes:
                    problems.append(f"pipeline {j} stage {s} needs {cost.memory_bytes / GIB:.2f} GiB > "
                                    f"{cost.memory_capacity_bytes / GIB:.2f} GiB{memory_reason(cost)}")
    return CheckReport(tuple(problems))


def assert_sound(instance: Instance, plan: Plan, failed: frozenset[int] = frozenset(),
                 require_tp_in_node: bool = True, model: PerfModel | None = None, stage: str = "solver") -> Plan:
    """Return `plan` if the checker accepts it, else raise PlanRejected naming `stage` (the part of
    the decision that produced it) and the violations."""
    report = check_plan(instance, plan, failed, require_tp_in_node, model)
    if not report.ok:
        raise PlanRejected(stage, report.violations)
    return plan
