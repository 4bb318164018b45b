"""Per-phase timers of the HF runtime's step (runtime/phases.py): off they cost nothing and report
nothing; on, a step's reply explains it phase by phase."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chameleon_opt.runtime.phases import PhaseTimer, phase_table

MODELS = Path(__file__).resolve().parent.parent / "models" / "hf"


def test_a_disabled_timer_records_nothing_and_wraps_nothing() -> None:
    timer = PhaseTimer(False)

    def work() -> int:
        return 3

    assert timer.wrap("f", work) is work
    with timer.span("f"):
        pass
    assert timer.take() == {}


def test_spans_add_up_wall_cpu_and_calls_until_taken() -> None:
    timer = PhaseTimer(True)
    for _ in range(2):
        with timer.span("busy"):
            end = time.thread_time() + 0.002
            while time.thread_time() < end:
                pass
    assert timer.wrap("wrapped", lambda x: x + 1)(1) == 2
    phases = timer.take()
    assert phases["busy"]["calls"] == 2 and phases["wrapped"]["calls"] == 1
    assert phases["busy"]["cpu_s"] >= 0.004 and phases["busy"]["wall_s"] >= phases["busy"]["cpu_s"] * 0.99
    assert timer.take() == {}


def test_phase_table_takes_each_phase_median_over_steps() -> None:
    steps = [{"a": {"wall_s": w, "cpu_s": w / 2, "calls": 4}} for w in (1.0, 3.0, 2.0)]
    steps.append({})   # a step without the phase counts as zero
    table = phase_table(steps)
    assert table["a"]["wall_s"] == 1.5 and table["a"]["calls"] == 4


@pytest.mark.multiprocess
def test_a_step_reports_its_phases_per_device() -> None:
    """PP 2 x DP 1, 4 micro-batches: every committed step has each device's forward and backward
    once per micro-batch, the loss on the last stage, and the previous step's commit."""
    pytest.importorskip("transformers")
    from chameleon_opt.runtime.pipelined import PipelinedController, runtime_instance

    config = MODELS / "tiny-llama" / "config.json"
    instance = runtime_instance(config, pipeline_parallel=2, data_parallel=1, tensor_parallel=1, global_batch=4)
    report = PipelinedController(instance, config, phase_timers=True).run(3)
    assert len(report.phases) == 3 and all(set(step) == {0, 1} for step in report.phases)
    last = report.phases[-1]
    for device in (0, 1):
        assert last[device]["forward"]["calls"] == 4 and last[device]["backward"]["calls"] == 4
        assert last[device]["commit"]["calls"] == 1 and last[device]["kernel"]["cpu_s"] >= 0
        assert last[device]["schedule"]["wall_s"] >= last[device]["forward"]["wall_s"]
        assert last[device]["runqueue"]["wall_s"] >= 0
    assert last[1]["loss"]["calls"] == 4 and "loss" not in last[0]
    assert PipelinedController(instance, config).run(1).phases == []


def test_the_bench_decomposes_a_rank_step_phase_by_phase() -> None:
    """bench/runtime_steps_hf.py: the schedule's own work is its CPU beyond the chunks and the loss,
    waiting the step's wall beyond its CPU, other threads the process's CPU beyond the step's."""
    from tests.helpers import load_example

    bench = load_example(Path(__file__).resolve().parent.parent / "bench" / "runtime_steps_hf.py")

    def phase(wall: float, cpu: float, calls: float = 1) -> dict[str, float]:
        return {"wall_s": wall, "cpu_s": cpu, "calls": calls}

    parts = bench.decomposition({"forward": phase(3, 3, 4), "backward": phase(5, 5, 4), "loss": phase(1, 1, 4),
                                 "schedule": phase(12, 9.5), "step": phase(13, 10), "process": phase(0, 11),
                                 "commit": phase(2, 2), "dispatch": phase(0.5, 0), "kernel": phase(0, 0.25, 40),
                                 "runqueue": phase(1.5, 0)})
    assert parts["schedule_own_cpu"] == 0.5 and parts["waiting"] == 3 and parts["other_threads_cpu"] == 1
    assert parts["step"] == 15.5 and parts["micro_batches"] == 4 and parts["page_faults"] == 40
    assert parts["allreduce"] == 0 and parts["foreign"] == 0.5   # queued 1.5 s, 1 s of it for its own threads
