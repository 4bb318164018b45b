"""Waiting for worker replies while noticing deaths, and reading a step's loss from them: what
both runtimes' controllers (controller.py's tiny GPT, pipelined.py's Hugging Face stages) share.

A worker answers over its pipe; a worker that dies says so only through its process sentinel,
and a killed one may first have sent a `dying` report carrying its kill time (wall clock), which
is what recovery latency is measured from. Both are waited on together, so a death is seen at
once and never waited out as a silent reply.

A worker that hangs alive (stopped, deadlocked, swapped out) closes nothing. Every worker therefore
runs a heartbeat (`start_heartbeat`): a daemon thread that writes the monotonic clock into its
device's slot of a shared array (`Heartbeats`) every `HEARTBEAT_PERIOD_S`. While waiting for
replies the controller looks at the slots every period; a worker silent for longer than
`Heartbeats.silent_s` is SIGKILLed, and from then on it is a dead worker like any other (its
sentinel reports it). A worker starts beating when it adopts its first generation, and is watched
from its first beat: before that, imports (transformers, PIL, DTensor's op tables) hold the GIL for
up to 0.6 s at a time on a loaded 2-core machine, and the job's start is guarded by the reply
timeouts instead."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any


HEARTBEAT_PERIOD_S = 0.05
SILENT_S = 1.0
"""A worker silent this long is taken for hung. Its heartbeat thread needs the GIL for a moment
every 50 ms: once a worker has started, the longest gap between two beats measured in the kill
campaigns (4 to 8 workers on 2 cores under other jobs' load) was 115 ms at load 2-6, and 756 ms
in one HF run at load 8 (docs/design.md): beyond that load a starved worker may be taken for hung
(it is then killed and recovered from, so training stays correct, one device shorter)."""


class Heartbeats:
    """The controller's view of its workers' heartbeats in memory shared with them (they get
    `slots` at spawn): per device its last beat (monotonic seconds; 0: not beating yet), and after
    those the longest gap between two of its beats so far (a worker that stops beating never
    writes that gap: what it shows is how late the live ones beat)."""

    def __init__(self, devices: int, silent_s: float = SILENT_S) -> None:
        self.devices = devices
        self.slots = mp.get_context("spawn").RawArray("d", 2 * devices)
        self.silent_s = silent_s
        self.gone_longest_s = 0.0   # longest gap of workers no longer running (their slots reused)

    def reset(self, device: int) -> None:
        """A new worker process for `device`: not watched until it beats."""
        self.gone_longest_s = self.longest_s
        self.slots[device] = 0.0
        self.slots[self.devices + device] = 0.0

    @property
    def longest_s(self) -> float:
        """The longest gap between two beats of one worker (its period included)."""
        return max(self.gone_longest_s, *self.slots[self.devices:])

    def check(self, devices: Iterable[int]) -> dict[int, float]:
        """The devices silent for longer than `silent_s`, each with its last beat (monotonic)."""
        now = time.monotonic()
        return {d: self.slots[d] for d in devices if 0.0 < self.slots[d] < now - self.silent_s}


def start_heartbeat(slots: Any, device: int, period_s: float = HEARTBEAT_PERIOD_S) -> threading.Thread:
    """Worker side: a daemon thread writing the monotonic clock into `slots[device]` every
    `period_s` and its longest gap between two beats into the second half's slot (a process that
    is stopped or killed stops beating)."""
    gap = len(slots) // 2 + device

    def beat() -> None:
        last = time.monotonic()
        while True:
            now = time.monotonic()
            slots[gap] = max(slots[gap], now - last)
            slots[device] = last = now
            time.sleep(period_s)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    return thread


@dataclass
class Collected:
    """What one wait gathered: replies of the expected workers that answered, the workers that
    died meanwhile, and the earliest kill time a dying worker reported (perf_counter seconds)."""

    replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)
    kill_time: float | None = None
    hung: dict[int, float] = field(default_factory=dict)   # silent workers SIGKILLed: device -> last beat
                                                           # (perf_counter seconds)

    def note_dying(self, msg: dict[str, Any]) -> None:
        """A `dying` report's wall-clock time, moved onto this process's perf_counter clock."""
        at = msg["t"] - time.time() + time.perf_counter()
        self.kill_time = at if self.kill_time is None else min(self.kill_time, at)


def collect_replies(conns: dict[int, Connection], procs: dict[int, BaseProcess], expect: set[int],
                    timeout_s: float | None = None,
                    on_death: Callable[[int, bool], None] | None = None,
                    heartbeats: Heartbeats | None = None,
                    on_hung: Callable[[int, float], None] | None = None,
                    straggler_s: float | None = None,
                    on_straggler: Callable[[list[int]], None] | None = None) -> Collected:
    """Replies of `expect`, and every worker of `procs` that died before its reply came.

    A dead worker is drained (its `dying` report read), joined, and removed from `procs` and
    `conns` (its pipe closed); `on_death(device, first)` then runs, `first` for the first death of
    this wait. A worker that reports `crashed` raises RuntimeError with its traceback, and so does
    a silence longer than `timeout_s` (None waits as long as it takes). With `heartbeats`, a
    worker of `procs` whose heartbeat stopped for longer than its `silent_s` is SIGKILLed
    (`on_hung(device, seconds silent)` runs first) and then reported dead as any other. With
    `straggler_s`, `on_straggler(devices)` runs once for the expected devices still silent that
    long after the first death (a diagnosis: recovery should not wait for any timeout)."""
    got = Collected()
    waiting = set(expect)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    first_death: float | None = None
    while waiting:
        handles: dict[Any, tuple[str, int]] = {conns[d]: ("conn", d) for d in waiting}
        handles.update({procs[d].sentinel: ("proc", d) for d in procs})
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        poll = left if heartbeats is None else min(HEARTBEAT_PERIOD_S, HEARTBEAT_PERIOD_S if left is None else left)
        if straggler_s is not None and poll is None:
            poll = HEARTBEAT_PERIOD_S
        ready = wait(list(handles), timeout=poll)
        if first_death is not None and straggler_s is not None and time.monotonic() - first_death > straggler_s:
            first_death, straggler_s = None, None   # once
            if on_straggler is not None:
                on_straggler(sorted(waiting))
        if heartbeats is not None:
            for d, beat in heartbeats.check([d for d in procs if d not in got.hung]).items():
                if on_hung is not None:
                    on_hung(d, time.monotonic() - beat)
                got.hung[d] = beat - time.monotonic() + time.perf_counter()
                try:
                    os.kill(procs[d].pid, signal.SIGKILL)   # its sentinel reports it next
                except ProcessLookupError:
                    pass
        if not ready:
            if deadline is not None and time.monotonic() >= deadline:
                raise RuntimeError(f"workers {sorted(waiting)} did not answer in {timeout_s:g} s")
            continue
        if timeout_s is not None:  # a silence: the time since the last thing that happened
            deadline = time.monotonic() + timeout_s
        for handle in ready:
            kind, d = handles[handle]
            if kind == "conn":
                try:
                    msg = conns[d].recv()
                except (EOFError, OSError):
                    continue  # it died: its sentinel follows
                if msg.get("event") == "dying":
                    got.note_dying(msg)
                elif msg.get("event") == "crashed":
                    raise RuntimeError(f"worker {d} crashed:\n{msg['error']}")
                else:
                    got.replies[d] = msg
                    waiting.discard(d)
            elif d in procs and not procs[d].is_alive():
                conn = conns.pop(d)
                _drain(conn, got)
                conn.close()
                procs.pop(d).join()
                got.dead.add(d)
                waiting.discard(d)
                first_death = first_death or time.monotonic()
                if on_death is not None:
                    on_death(d, len(got.dead) == 1)
    return got


def _drain(conn: Connection, got: Collected) -> None:
    """Read what a dead worker sent before dying (its kill time)."""
    try:
        while conn.poll():
            msg = conn.recv()
            if msg.get("event") == "dying":
                got.note_dying(msg)
    except (EOFError, OSError):
        pass


def step_loss(replies: dict[int, dict[str, Any]], global_batch: int) -> tuple[float, bool]:
    """The global batch's mean loss from every rank's per-sample losses, and whether each sample
    of the batch got exactly one loss (none missing, none computed twice)."""
    per_sample: dict[int, float] = {}
    duplicates = 0
    for reply in replies.values():
        for sample, value in reply["losses"].items():
            duplicates += sample in per_sample
            per_sample[sample] = value
    once = duplicates == 0 and sorted(per_sample) == list(range(global_batch))
    return sum(per_sample[s] for s in sorted(per_sample)) / global_batch, once
