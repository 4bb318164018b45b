"""The planner API: checked plans without the failed devices, executable rank plans covering the
live ones, failures that accumulate, errors with reasons, and no torch import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chameleon_opt.api import Planner, RecoveryDecision
from chameleon_opt.check import check_plan
from chameleon_opt.errors import InfeasibleError, InputError, UnrecoverableError
from chameleon_opt.instance.load import load_instance
from chameleon_opt.perf.model import PerfModel

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "instances" / "paper-example.json"   # PP3 x DP4, pipeline j = devices 3j..3j+2
PAPER32 = ROOT / "instances" / "paper-32.json"        # TP2 PP4 DP4, stage s of pipeline j = 8j+2s, 8j+2s+1


def assert_executable(planner: Planner, decision: RecoveryDecision) -> None:
    """Sound on the instance, no work or rank plan on a failed device, every live device of the plan
    has a train plan, and every micro-batch of every (pipeline, stage) is computed exactly once."""
    plan, failed = decision.plan, decision.failed
    assert failed == planner.failed
    assert check_plan(planner.instance, plan, failed, require_tp_in_node=decision.policy != "reroute").ok
    live = set(plan.devices) - failed
    assert failed.isdisjoint(decision.rank_plans)
    assert {d for d, p in decision.rank_plans.items() if p.role == "train"} == live
    covered: dict[tuple[int, int, int], float] = {}
    for rank_plan in decision.rank_plans.values():
        if rank_plan.role == "train" and rank_plan.tp_rank == 0:
            for item in rank_plan.micro_batches:
                key = (item.pipeline, rank_plan.stage, item.id)
                covered[key] = covered.get(key, 0.0) + item.hi - item.lo
    first = 0
    for j, pipe in enumerate(plan.pipelines):
        for s in range(len(pipe.stages)):
            for mb in range(first, first + pipe.micro_batches):
                assert covered.pop((j, s, mb)) == pytest.approx(1.0)
        first += pipe.micro_batches
    assert not covered
    for d in failed:
        absent = decision.for_rank(d)
        assert absent.role == "failed" and absent.micro_batches == () and absent.node == planner.instance.node_of(d)


def test_module_does_not_import_torch():
    code = "import chameleon_opt.api, sys; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_failures_accumulate_and_plans_are_executable():
    planner = Planner(EXAMPLE, time_limit_s=5.0)
    assert planner.estimate().iteration_time_s == pytest.approx(35.0)   # the worked example, failure-free
    first = planner.on_failure([4])
    assert_executable(planner, first)
    assert 4 not in first.plan.devices and first.policy in ("reconfigure", "hybrid")
    assert planner.current_plan == first.plan
    assert planner.estimate().iteration_time_s == pytest.approx(first.iteration_time_s)
    assert first.interim is not None and first.interim.policy == "reroute"   # the hybrid's rerouted phase
    assert_executable(planner, first.interim)
    assert {c.policy for c in first.candidates} == {"reroute", "reconfigure", "hybrid"}

    second = planner.on_failure([7])                    # planned from the first decision's plan
    assert planner.failed == {4, 7} == second.failed
    assert_executable(planner, second)
    assert not {4, 7} & set(second.plan.devices)


def test_rerouting_keeps_the_layout_and_replans_all_failures_together():
    planner = Planner(EXAMPLE, policy="reroute", time_limit_s=5.0)
    first = planner.on_failure([4])
    assert first.policy == "reroute" and first.migration is None and first.plan.rerouted
    assert_executable(planner, first)
    assert 4 in first.plan.devices                      # the layout is kept, its work rerouted
    assert planner.current_plan == first.plan and not planner.instance.plan.rerouted
    second = planner.on_failure([5])
    assert second.failed == {4, 5}
    assert_executable(planner, second)


def test_paper32_hybrid_with_migration_and_a_second_failure():
    planner = Planner(PAPER32)
    decision = planner.on_failure([13])
    assert_executable(planner, decision)
    assert decision.migration is not None and decision.migration.rounds > 0
    assert decision.allreduce_rounds
    senders = {d for d, p in decision.rank_plans.items() if p.role == "source"}
    assert all(p.transfers for d, p in decision.rank_plans.items() if d in senders)
    spare = set(range(32)) - decision.failed - set(decision.rank_plans)
    assert all(decision.for_rank(d).role == "idle" for d in spare)
    second = planner.on_failure([20])
    assert_executable(planner, second)
    assert planner.failed == {13, 20}


@pytest.mark.parametrize("path, stage", [(EXAMPLE, [1, 4, 7, 10]), (PAPER32, [4, 12, 20, 28])])
def test_a_stage_lost_everywhere_is_unrecoverable(path: Path, stage: list[int]):
    planner = Planner(load_instance(path), time_limit_s=2.0)
    with pytest.raises(UnrecoverableError, match="lost every replica"):
        planner.on_failure(stage)
    assert planner.failed == frozenset()                # the state is unchanged on an error
    assert planner.current_plan == load_instance(path).plan


def test_no_usable_candidate_raises_with_each_reason():
    planner = Planner(EXAMPLE, policy="reconfigure", time_limit_s=5.0)
    with pytest.raises(InfeasibleError, match="reconfigure: its transition of .* outlasts D = 0.001 s"):
        planner.on_failure([4], next_fault_s=0.001)


@pytest.mark.parametrize("devices, problem", [([], "no failed device"), ([12], "12 is not a device"),
                                              ([-1], "-1 is not a device")])
def test_bad_failure_reports(devices: list[int], problem: str):
    with pytest.raises(InputError, match=problem):
        Planner(EXAMPLE).on_failure(devices)


def test_a_failure_reported_twice_and_bad_settings():
    planner = Planner(EXAMPLE, policy="reroute")
    decision = planner.on_failure([4])
    with pytest.raises(InputError, match="device 4 has already failed"):
        planner.on_failure([4])
    with pytest.raises(InputError, match="99 is not a device"):
        decision.for_rank(99)
    with pytest.raises(InputError, match="unknown policy"):
        Planner(EXAMPLE, policy="fastest")
    with pytest.raises(InputError, match="time_limit_s"):
        Planner(EXAMPLE, time_limit_s=0)


def test_a_parsed_document_is_accepted():
    import json
    planner = Planner(json.loads(EXAMPLE.read_text()))
    instance = load_instance(EXAMPLE)
    assert planner.estimate().iteration_time_s == PerfModel(instance).evaluate(instance.plan).iteration_time_s


def test_one_at_a_time_equals_together_when_no_copy_goes_stale():
    """runtime-cpu-4 (PP2 x DP2, pipelines 0-1 and 2-3): rerouting around device 3 hands its whole
    micro-batches to device 1 and keeps device 2 training layers 0-2 (the bubble-filled rerouting
    keeps every live stage busy), so when device 0 fails next its layers still live, fresh, on
    device 2: the outcome is the one of both failures at once."""
    runtime4 = ROOT / "instances" / "runtime-cpu-4.json"
    planner = Planner(runtime4, policy="reroute", time_limit_s=5.0)
    first = planner.on_failure([3])
    assert 2 in first.plan.devices
    second = planner.on_failure([0])
    together = Planner(runtime4, policy="reroute", time_limit_s=5.0).on_failure([3, 0])
    assert second.plan == together.plan
    assert second.iteration_time_s == pytest.approx(together.iteration_time_s, rel=1e-6)


def test_a_stale_copy_is_named_in_the_error():
    """When a rerouting does leave a device idle (its pipeline's micro-batches all moved), a later
    loss of the layers only that idle device held ends with the stale copy named."""
    from chameleon_opt.plan import Plan
    from chameleon_opt.decision import with_stale_copies
    import dataclasses
    original = load_instance(ROOT / "instances" / "runtime-cpu-4.json")
    idle = Plan(original.plan.tensor_parallel, original.plan.pipelines[:1])  # pipeline 1 (devices 2, 3) dropped
    now = dataclasses.replace(original, plan=idle)
    error = with_stale_copies(UnrecoverableError("layers 0-2 lost every replica"), [original.plan], now,
                              frozenset({0, 3}))
    assert "devices [2]" in str(error) and "stale" in str(error)


def test_a_failed_device_rejoins_without_state_and_receives_it():
    """runtime-cpu-4 under auto: device 3 fails (the layout becomes a plan over 0-2), then comes back
    holding nothing: scaling up over all four beats idling it (Eq. 8) and device 3 is sent its layers."""
    planner = Planner(ROOT / "instances" / "runtime-cpu-4.json", time_limit_s=5.0)
    planner.on_failure([3])
    assert 3 not in planner.current_plan.devices
    back = planner.on_join([3])
    assert planner.failed == frozenset() == back.failed and back.policy == "scale-up"
    assert {c.policy for c in back.candidates} == {"keep-running", "scale-up"}
    keep = next(c for c in back.candidates if c.policy == "keep-running")
    assert keep.transition_s == 0.0 and keep.iteration_time_s > back.iteration_time_s
    assert 3 in back.plan.devices and back.for_rank(3).role == "train"
    assert back.migration is not None and any(t.dst == 3 for t in back.migration.transfers)
    assert_executable(planner, back)
    with pytest.raises(InputError, match="has not failed"):
        planner.on_join([3])


def test_a_device_rerouted_around_rejoins_from_its_peers():
    """After a rerouting the layout still lists the failed device in its stage; back, it holds
    nothing, so the layers it trains again are sent to it by a live holder, never by itself
    (examples/mlp-dp.json with three data-parallel devices: device 0's work is rerouted)."""
    spec = json.loads((ROOT / "examples" / "mlp-dp.json").read_text())
    spec["cluster"]["devices_per_node"] = spec["plan"]["layout"]["data_parallel"] = 3
    planner = Planner(spec, policy="reroute", time_limit_s=5.0)
    planner.on_failure([0])
    assert 0 in planner.instance.plan.devices          # the layout keeps device 0's stage, rerouted
    back = planner.on_join([0])
    assert {c.policy for c in back.candidates} == {"keep-running", "rejoin-slots", "scale-up"}
    slots = next(c for c in back.candidates if c.policy == "rejoin-slots")
    assert slots.feasible and not slots.plan.rerouted and 0 in slots.plan.devices
    assert planner.failed == frozenset() and 0 in back.plan.devices
    assert back.migration is not None and back.migration.transfers
    assert {t.dst for t in back.migration.transfers} == {0} and all(t.src != 0 for t in back.migration.transfers)
    assert_executable(planner, back)
