"""Local reconfiguration and disruption (issue 21): intact pipelines are kept exactly, only the
damaged pipelines' survivors and spares change; the decision weighs local against global by Eq. 8
with each one's own transition, and reports devices touched, bytes moved and groups rebuilt."""

from __future__ import annotations

import json

from chameleon_opt.bundled import bundled_instance
from chameleon_opt.instance.load import build_instance, load_instance
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.planning import PlanningOptions, plan_recovery
from chameleon_opt.comm.api import communication_plan
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.plan import Pipeline
from chameleon_opt.solve.local import disruption, in_old_order, local_plans, touched_devices


def _failed(instance) -> frozenset[int]:
    return frozenset(d for event in instance.spec.failures.events for d in event.devices)


def _with_spares(name: str = "paper-32") -> dict:
    """paper-32 with one pipeline fewer in its layout: 8 devices (4 TP groups) idle as spares."""
    spec = json.loads(bundled_instance(name).read_text())
    spec["plan"]["layout"]["data_parallel"] = 3
    spec["failures"] = {"events": [{"time_s": 0, "devices": [13]}], "next_fault_s": 86400}
    return spec


def test_local_plans_keep_every_intact_pipeline_exactly() -> None:
    instance = load_instance("paper-32")
    failed = _failed(instance)
    model = PerfModel(instance)
    intact = {tuple((st.devices, st.first, st.end) for st in p.stages)
              for p in instance.plan.pipelines if not failed.intersection(p.devices)}
    found = local_plans(instance, failed, model, Deadline.after(10))
    assert found and [c.step_s for c in found] == sorted(c.step_s for c in found)
    for candidate in found:
        kept = {tuple((st.devices, st.first, st.end) for st in p.stages) for p in candidate.plan.pipelines}
        assert intact <= kept, candidate.how
        assert candidate.plan.total_micro_batches == instance.global_micro_batches
        assert model.evaluate(candidate.plan, failed).memory_ok
        fresh = PerfModel(instance).evaluate(candidate.plan, failed)  # the kept estimate is the plan's own
        assert candidate.estimate.plan == candidate.plan
        assert candidate.estimate.iteration_time_s == fresh.iteration_time_s == candidate.step_s
        assert candidate.estimate.pipelines == fresh.pipelines
    drop = next(c for c in found if c.how.startswith("drop"))
    assert not touched_devices(instance.plan, drop.plan, failed)  # nobody changes role when survivors idle


def test_a_spare_group_takes_the_failed_slot_and_only_it_moves() -> None:
    instance = build_instance(_with_spares(), "paper-32-spares")
    failed = _failed(instance)
    model = PerfModel(instance)
    found = local_plans(instance, failed, model, Deadline.after(10))
    replace = next(c for c in found if c.how.startswith("replace"))
    touched = touched_devices(instance.plan, replace.plan, failed)
    # the failed device's TP group (2 devices) is replaced by a spare group; its stage neighbours
    # see a new peer (their pipeline group changes); nobody else is touched
    assert len(touched) <= 2 + 2 * 2 + 1
    spare_devices = set(range(instance.num_devices)) - set(instance.plan.devices)
    assert touched & spare_devices  # the spare took the slot
    change = disruption(model, instance.plan, replace.plan, failed)
    assert 0 < change.groups_rebuilt < change.groups_total


def test_decision_reports_disruption_and_chooses_by_eq8() -> None:
    instance = build_instance(_with_spares(), "paper-32-spares")
    decision = plan_recovery(instance, _failed(instance), PlanningOptions(policy="reconfigure", time_limit_s=10))
    option = next(c for c in decision.candidates if c.policy == "reconfigure")
    payload = option.to_json()
    assert payload["scope"] in ("local", "global")
    assert payload["devices_touched"] >= 0 and payload["groups_rebuilt"] >= 0 and payload["bytes_moved"] >= 0
    # the winner's transition includes its rebuild share, never more than a full rebuild
    assert 0 <= option.rebuild_s <= 5.0 and option.transition_s >= option.rebuild_s
    if payload["scope"] == "local":
        assert payload["bytes_moved"] <= sum(t.nbytes for t in decision.migration.transfers)


def test_at_16384_devices_the_local_plan_moves_nothing() -> None:
    """The global re-plan touches 16,256 devices and moves 15,240 shards (unschedulable in a 1 s
    decision); the local plan keeps every intact pipeline, so nothing moves and no device changes
    role. (Its usability within 1 s is measured by bench/time_limit.py, not asserted here: a
    wall-clock claim a busy CI machine could miss.) The bundled job with its optimizer state
    replicated (no distributed optimizer, on H200s to hold it): as bundled, its distributed
    optimizer's 2 copies of each shard survive the failure, but dropping a pipeline changes the
    data-parallel size, so the damaged shard group re-forms and re-shards: the local plan then moves
    2.0 TB to its 8,064 GPUs (tests/test_shard_replicas.py)."""
    spec = json.loads(bundled_instance("llama3-405b-16k").read_text())
    spec["training"]["distributed_optimizer"] = False
    del spec["training"]["shard_replicas"]
    spec["cluster"]["device_type"] = "H200-141"
    instance = build_instance(spec)
    failed = _failed(instance)
    model = PerfModel(instance)
    found = local_plans(instance, failed, model, Deadline.after(60))
    drop = next(c for c in found if c.how.startswith("drop"))
    assert not touched_devices(instance.plan, drop.plan, failed)
    migration, _, _ = communication_plan(instance, instance.plan, drop.plan, failed, Deadline.after(60),
                                         assign=False, model=model)
    assert not migration.transfers and migration.makespan_s == 0.0
    assert disruption(model, instance.plan, drop.plan, failed).groups_rebuilt < 100  # the rings, not 16,384 devices


def test_in_old_order_keeps_positions_and_whole_shard_groups() -> None:
    """Positions by hand: old pipelines 0-7 (two shard groups 0-3, 4-7), pipeline 5 damaged."""
    pipes = [Pipeline((), j) for j in range(10)]  # stand-ins: identity is all that is compared
    kept = {j: pipes[j] for j in range(8) if j != 5}
    # a replacement takes position 5; an extra one comes last
    assert in_old_order(8, kept, [pipes[8]], 2) == [pipes[j] for j in (0, 1, 2, 3, 4, 8, 6, 7)]
    assert in_old_order(8, kept, [pipes[8], pipes[9]], 2)[-1] is pipes[9]
    # dropped: 7 pipelines in groups of 3 and 4; old group 1 (4, 6, 7) goes first, group 0 whole after
    assert in_old_order(8, kept, [], 2) == [pipes[j] for j in (4, 6, 7, 0, 1, 2, 3)]
    assert in_old_order(8, kept, [], 1) == [pipes[j] for j in (0, 1, 2, 3, 4, 6, 7)]
