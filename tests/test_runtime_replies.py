"""collect_replies, the wait both runtime controllers use: replies, deaths seen through the
sentinel (with the dying worker's kill time), crashes, silence, and the first-death callback;
step_loss, the global batch's loss and its exactly-once check."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from multiprocessing.connection import Connection

import pytest

from chameleon_opt.runtime.replies import collect_replies, step_loss


def _worker(conn: Connection, behaviour: str) -> None:
    if behaviour == "reply":  # then alive, as a runtime worker is, until stopped
        conn.send({"event": "ready"})
        time.sleep(30)
    elif behaviour == "killed":
        conn.send({"event": "dying", "t": time.time()})
        os.kill(os.getpid(), signal.SIGKILL)
    elif behaviour == "crashed":
        conn.send({"event": "crashed", "error": "Traceback: boom"})
    elif behaviour == "silent":
        time.sleep(30)


def _start(behaviours: dict[int, str]):
    ctx = mp.get_context("fork")
    conns, procs = {}, {}
    for d, behaviour in behaviours.items():
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, behaviour), daemon=True)
        proc.start()
        child.close()
        conns[d], procs[d] = parent, proc
    return conns, procs


def test_replies_and_a_death_with_its_kill_time() -> None:
    conns, procs = _start({0: "reply", 1: "killed", 2: "reply"})
    deaths: list[tuple[int, bool]] = []
    before = time.perf_counter()
    got = collect_replies(conns, procs, {0, 1, 2}, timeout_s=60, on_death=lambda d, first: deaths.append((d, first)))
    assert set(got.replies) == {0, 2} and all(r["event"] == "ready" for r in got.replies.values())
    assert got.dead == {1} and deaths == [(1, True)]
    assert 1 not in procs and 1 not in conns  # the dead worker left the live set
    assert got.kill_time is not None and before - 1.0 <= got.kill_time <= time.perf_counter()
    for proc in procs.values():
        proc.kill()
        proc.join()


def test_a_crash_raises_with_the_workers_traceback() -> None:
    conns, procs = _start({0: "crashed"})
    with pytest.raises(RuntimeError, match="worker 0 crashed:\nTraceback: boom"):
        collect_replies(conns, procs, {0}, timeout_s=60)
    procs[0].join()


def test_silence_past_the_timeout_raises() -> None:
    conns, procs = _start({0: "silent"})
    try:
        with pytest.raises(RuntimeError, match=r"workers \[0\] did not answer in 0.5 s"):
            collect_replies(conns, procs, {0}, timeout_s=0.5)
    finally:
        procs[0].kill()
        procs[0].join()


def test_step_loss_is_the_batch_mean_and_checks_every_sample_once() -> None:
    whole = {0: {"losses": {0: 1.0, 1: 2.0}}, 1: {"losses": {2: 3.0, 3: 6.0}}}
    assert step_loss(whole, 4) == (3.0, True)
    twice = {0: {"losses": {0: 1.0, 1: 2.0}}, 1: {"losses": {1: 2.0, 3: 6.0}}}
    assert step_loss(twice, 4)[1] is False  # sample 1 twice, sample 2 never
    missing = {0: {"losses": {0: 1.0, 1: 2.0}}}
    assert step_loss(missing, 4) == (0.75, False)
