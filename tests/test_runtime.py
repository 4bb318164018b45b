"""Multi-process runtime tests: real gloo workers, real SIGKILLs, recovery by each policy.

Marked `multiprocess` (deselect with `-m "not multiprocess"`); each run spawns 4-6 processes and
takes 5-15 s on 2 cores. Every test compares against a failure-free run on the same data and seed:
the loss of every step within 1e-5 relative, every sample of every global batch processed exactly
once, and the final parameters equal up to summation order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from chameleon_opt.instance.load import load_instance  # noqa: E402
from chameleon_opt.runtime.controller import Failure, Rejoin, RunReport, run_training  # noqa: E402

pytestmark = pytest.mark.multiprocess
ROOT = Path(__file__).resolve().parent.parent
STEPS = 5


@pytest.fixture(scope="module")
def four():
    return load_instance(ROOT / "instances" / "runtime-cpu-4.json")


@pytest.fixture(scope="module")
def six():
    return load_instance(ROOT / "instances" / "runtime-cpu-6.json")


@pytest.fixture(scope="module")
def reference_four(four) -> RunReport:
    return run_training(four, STEPS, (), policy="auto")


@pytest.fixture(scope="module")
def reference_four_fp64(four) -> RunReport:
    return run_training(four, STEPS, (), policy="auto", dtype="float64")


@pytest.fixture(scope="module")
def reference_six(six) -> RunReport:
    return run_training(six, 6, (), policy="auto", dtype="float64")


def assert_same_training(reference: RunReport, run: RunReport, parameter_tolerance: float) -> None:
    """float32: AdamW divides by sqrt(v), so for parameters with near-zero gradients a last-bit
    difference in summation order moves the update by up to ~lr x 1e-2; float64 pins it to 1e-9."""
    assert len(run.losses) == len(reference.losses)
    for step, (a, b) in enumerate(zip(reference.losses, run.losses)):
        assert abs(a - b) <= 1e-5 * abs(a), f"step {step}: loss {b} vs failure-free {a}"
    assert all(run.samples_exactly_once), run.samples_exactly_once
    assert run.replica_max_diff == 0.0  # replicas of a layer stay bit-identical
    assert set(run.final_layers) == set(reference.final_layers)
    worst = max(abs(x - y) for layer, params in reference.final_layers.items() for name, values in params.items()
                for x, y in zip(values, run.final_layers[layer][name]))
    assert worst < parameter_tolerance


def test_failure_free_training_learns(reference_four: RunReport) -> None:
    assert all(reference_four.samples_exactly_once)
    assert reference_four.losses[-1] < reference_four.losses[0]
    assert not reference_four.recoveries


def test_kill_then_reroute_runs_the_bubble_filled_schedule(four, reference_four_fp64: RunReport) -> None:
    """Device 1 (pipeline 0, stage 1) dies in step 2. The rerouting is bubble-filled: its four
    micro-batches of stage 1 run on device 3 in the priced schedule's order, the backward split
    into B (input gradient, sent back at once) and W (weight gradient, deferred into the idle
    time). float64: losses and final parameters are failure-free training's."""
    run = run_training(four, STEPS, (Failure(step=2, devices=(1,), after_ops=3),), policy="reroute", dtype="float64")
    assert [r.policy for r in run.recoveries] == ["reroute"]
    assert run.dead == (1,)
    initial, rerouted = run.generations
    assert initial.schedule == "1F1B" and (rerouted.policy, rerouted.schedule) == ("reroute", "bubble-filled")
    assert sum(r.micro_batches for r in rerouted.plan.rerouted if (r.from_pipeline, r.stage) == (0, 1)) == 4
    assert_same_training(reference_four_fp64, run, 1e-9)
    r = run.recoveries[0]
    assert 0 < r.detection_s < 5 and r.total_s >= r.first_step_s > 0


def test_kill_then_reconfigure(four, reference_four_fp64: RunReport) -> None:
    run = run_training(four, STEPS, (Failure(step=2, devices=(2,), after_ops=1),), policy="reconfigure",
                       dtype="float64")
    assert [r.policy for r in run.recoveries] == ["reconfigure"]
    new_plan = run.generations[-1].plan
    assert 2 not in new_plan.devices and not new_plan.rerouted
    assert run.recoveries[0].migration_s > 0
    assert_same_training(reference_four_fp64, run, 1e-9)


def test_three_failures_one_during_a_transition(six, reference_six: RunReport) -> None:
    failures = (Failure(step=1, devices=(1,), after_ops=2),
                Failure(step=3, devices=(4,), delay_s=0.01),
                Failure(step=3, devices=(0,), in_transition=True))
    run = run_training(six, 6, failures, policy="auto", dtype="float64")
    assert run.dead == (0, 1, 4)
    assert sum(r.aborted_transitions for r in run.recoveries) == 1
    assert_same_training(reference_six, run, 1e-9)


def test_a_killed_device_comes_back_as_a_fresh_worker(four, reference_four_fp64: RunReport) -> None:
    """Device 1 dies in step 1 and its work is rerouted; before step 3 a fresh process (no state)
    comes back in its place: the planner decides its return (`plan_join`) and the next generation
    migrates its state to it. float64, so any state it got wrong would show."""
    run = run_training(four, STEPS, (Failure(step=1, devices=(1,), after_ops=2),), (Rejoin(step=3, devices=(1,)),),
                       policy="reroute", dtype="float64")
    assert run.dead == ()
    first, rerouted, back = run.generations
    assert rerouted.policy == "reroute" and back.policy in ("rejoin-slots", "scale-up") and back.first_step == 3
    assert 1 not in rerouted.plan.devices or rerouted.plan.rerouted
    assert 1 in back.plan.devices and not back.plan.rerouted
    assert any(kind == "rejoin planned" for _, kind, _ in run.events)
    assert_same_training(reference_four_fp64, run, 1e-9)


def test_a_rejoin_whose_transition_fails_leaves_the_newcomer_out(four, reference_four_fp64: RunReport) -> None:
    """Device 2 dies inside the transition that admits device 1 back: device 1 never got its state,
    so it is out again and the recovery plans as if it had never come back."""
    failures = (Failure(step=1, devices=(1,), after_ops=2), Failure(step=3, devices=(2,), in_transition=True))
    run = run_training(four, STEPS, failures, (Rejoin(step=3, devices=(1,)),), policy="reroute", dtype="float64")
    assert run.dead == (1, 2)
    assert any(kind == "rejoin undone" for _, kind, _ in run.events)
    assert 1 not in run.generations[-1].plan.devices or run.generations[-1].plan.rerouted
    assert_same_training(reference_four_fp64, run, 1e-9)


def test_demo_rejects_a_kill_that_would_never_fire() -> None:
    from typer.testing import CliRunner

    from chameleon_opt.cli import app

    result = CliRunner().invoke(app, ["demo", "--steps", "5", "--kill", "1@20", "--no-compare"])
    assert result.exit_code == 2
    assert "--kill" in result.output and "never fire" in result.output


def test_demo_rejects_a_rejoin_of_a_device_not_killed_before() -> None:
    from typer.testing import CliRunner

    from chameleon_opt.cli import app

    result = CliRunner().invoke(app, ["demo", "--steps", "5", "--kill", "1@3", "--rejoin", "1@2", "--no-compare"])
    assert result.exit_code == 2
    assert "--rejoin" in result.output and "not killed" in result.output


# -- regressions from the kill campaign (issue 12) ---------------------------------------------------------
def test_hybrid_switch_after_an_interim_that_idles_a_device(four, reference_four: RunReport) -> None:
    """Losing device 3 makes the interim rerouting (the MILP's shares, bubble filling off) drop
    pipeline 1, so device 2 idles and drops its layers; the switch must migrate from the layout the
    state is in then, not count on device 2 (it crashed with 'device 2 lacks layers [0, 1, 2] after
    migration')."""
    run = run_training(four, STEPS, (Failure(step=3, devices=(3,), delay_s=0.005),), policy="auto",
                       bubble_filling=False)
    assert [r.policy for r in run.recoveries] == ["hybrid"]
    assert [g.policy for g in run.generations] == ["initial", "reroute", "reconfigure"]
    assert 2 not in run.generations[1].plan.devices and 2 in run.generations[2].plan.devices
    assert_same_training(reference_four, run, 1e-4)


@pytest.mark.parametrize("name, failures, lost, stale", [
    # reroute idles device 2 (pipeline 1 dropped): its copy of layers 0-2 is stale when device 0 dies
    ("four", (Failure(1, (3,), delay_s=0.005), Failure(3, (0,), delay_s=0.005)), "layers 0-2", "devices [2]"),
    # two kills in one step: both fire (only the last did), and together they take stage 2's every replica
    ("six", (Failure(1, (2,), delay_s=0.005), Failure(1, (5,), delay_s=0.005)), "layers 4-5", None),
])
def test_lost_layers_end_the_job_cleanly(request: pytest.FixtureRequest, name: str, failures: tuple[Failure, ...],
                                         lost: str, stale: str | None) -> None:
    from chameleon_opt.errors import UnrecoverableError

    with pytest.raises(UnrecoverableError) as error:  # the MILP's shares: they can idle a device
        run_training(request.getfixturevalue(name), 4, failures, policy="reroute", bubble_filling=False)
    assert str(error.value).startswith(f"{lost} ") and "lost every replica" in str(error.value)
    assert (stale is not None) == ("stale" in str(error.value)) and (stale is None or stale in str(error.value))


def test_kill_in_transition_from_step_0_waits_for_a_transition(four, reference_four: RunReport) -> None:
    """--kill-in-transition D@0 fired while the job started ('failed while the job started')."""
    failures = (Failure(1, (3,), delay_s=0.005), Failure(0, (2,), in_transition=True))
    run = run_training(four, STEPS, failures, policy="reroute")
    assert run.dead == (2, 3)
    [recovery] = run.recoveries
    assert recovery.dead == (2, 3) and recovery.aborted_transitions == 1
    assert_same_training(reference_four, run, 1e-4)


def test_a_kill_during_the_hybrid_switch_is_its_own_recovery(four, reference_four: RunReport) -> None:
    """Device 3 dies inside the switch after the first hybrid decision: that failure is reported
    as a recovery of its own, and each recovery's detection is measured from its own kill."""
    failures = (Failure(1, (0,), delay_s=0.005), Failure(2, (3,), in_transition=True),
                Failure(3, (1,), delay_s=0.005))
    run = run_training(four, STEPS, failures, policy="auto")
    assert [(r.step, r.dead) for r in run.recoveries] == [(1, (0,)), (2, (3,)), (3, (1,))]
    assert run.generations[2].policy == "reroute"          # the aborted switch's recovery
    assert [r.aborted_transitions for r in run.recoveries] == [0, 1, 0]  # the switch it aborted
    for r in run.recoveries:
        assert 0 < r.detection_s < 1.0 and r.total_s >= r.first_step_s > 0, r
    assert_same_training(reference_four, run, 1e-4)


def test_demo_json_counts_the_aborted_switch_and_writes_no_plot(tmp_path, monkeypatch) -> None:
    """A kill inside the hybrid's switch: the JSON's recoveries count as many aborted transitions
    as its events log, and --json without --plot writes no file into the working directory."""
    import json

    from typer.testing import CliRunner

    from chameleon_opt.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["demo", "runtime-cpu-4.json", "--policy", "auto", "--steps", "5", "--kill", "1@2",
                                      "--kill-in-transition", "2@3", "--json", "--no-compare"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    aborted = sum(e["kind"] == "transition aborted" for e in out["events"])
    assert aborted == 1 and sum(r["aborted_transitions"] for r in out["recoveries"]) == aborted
    assert out["plot"] is None and list(tmp_path.iterdir()) == []
