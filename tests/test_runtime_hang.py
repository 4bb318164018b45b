"""Workers that hang alive (SIGSTOP): the heartbeat watchdog (`runtime.replies.Heartbeats`) finds
them, kills them and the job recovers as from a death. One end-to-end run on the Hugging Face
runtime (2 processes, tiny-llama, PP1 x DP2): a worker stopped in step 1 is found by its silence,
and every step's loss equals single-process training of the whole model, every sample once."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from chameleon_opt.runtime.replies import Heartbeats, collect_replies, start_heartbeat
from tests.helpers import assert_failure_free, hf_reference_losses

MODELS = Path(__file__).resolve().parent.parent / "models" / "hf"


def _beat_then_wait(slots, device: int, conn) -> None:  # a worker that beats and never answers
    start_heartbeat(slots, device, 0.02)
    conn.recv()


@pytest.mark.multiprocess
def test_a_stopped_worker_is_killed_for_its_silence_and_reported_dead() -> None:
    """Two beating processes; one is stopped: the wait reports it dead (hung) after about the
    silence threshold, and the other, still beating, is neither killed nor waited out."""
    ctx = mp.get_context("spawn")
    beats = Heartbeats(2, silent_s=0.5)
    procs, conns = {}, {}
    for d in range(2):
        parent, child = ctx.Pipe()
        procs[d] = ctx.Process(target=_beat_then_wait, args=(beats.slots, d, child), daemon=True)
        procs[d].start()
        conns[d] = parent
    try:
        deadline = time.monotonic() + 60
        while not all(beats.slots[d] > 0 for d in range(2)) and time.monotonic() < deadline:
            time.sleep(0.01)
        stopped = time.perf_counter()
        os.kill(procs[1].pid, signal.SIGSTOP)
        hung: list[int] = []
        got = collect_replies(conns, procs, {1}, timeout_s=30, heartbeats=beats,
                              on_hung=lambda d, _: hung.append(d))
        waited = time.perf_counter() - stopped
        assert got.dead == {1} and hung == [1] and set(got.hung) == {1}
        assert 0.5 <= waited < 3 * 0.5, waited   # the threshold, not the 30 s timeout
        assert procs[0].is_alive() and 0 not in got.hung and 0 < beats.longest_s < 0.5
    finally:
        for proc in procs.values():
            proc.kill()
            proc.join()


def test_demo_hang_alone_brings_no_default_kills(monkeypatch) -> None:
    """`demo --hang 2@1` injects that hang only: the default kills (1@3, 4@7) are for a demo
    given no failure at all (the kill campaign's hang runs had them added)."""
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    import chameleon_opt.runtime.controller as controller
    from chameleon_opt.cli import app

    seen = []

    class Stop(Exception):
        pass

    def fake(instance, steps, failures, *args, **kwargs):
        seen.append(failures)
        raise Stop

    monkeypatch.setattr(controller, "run_training", fake)
    CliRunner().invoke(app, ["demo", "runtime-cpu-4.json", "--steps", "4", "--hang", "2@1", "--no-compare", "--json"])
    CliRunner().invoke(app, ["demo", "--steps", "8", "--no-compare", "--json"])   # runtime-cpu-6
    assert [[(f.step, f.devices, f.hang) for f in run] for run in seen] == [[(1, (2,), True)],
                                                                           [(3, (1,), False), (7, (4,), False)]]


@pytest.mark.multiprocess
def test_hf_worker_stopped_mid_step_is_found_by_its_heartbeat() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from chameleon_opt.runtime.controller import Failure
    from chameleon_opt.runtime.pipelined import PipelinedController, runtime_instance

    config = MODELS / "tiny-llama" / "config.json"
    instance = runtime_instance(config, pipeline_parallel=1, data_parallel=2, tensor_parallel=1)
    steps = 3
    expected = hf_reference_losses(instance, config, steps)
    report = PipelinedController(instance, config).run(steps, [Failure(1, (1,), after_ops=2, hang=True)])
    assert_failure_free(report, expected, steps)
    (recovery,) = report.recoveries
    assert recovery.dead == (1,) and recovery.hung == (1,) and report.dead == (1,)
    # found by its silence (1 s; measured 1.0-1.1 s), not by the world group's 30 s timeout
    assert recovery.detection_s < 3 * 1.1, recovery
