"""Waiting for worker replies while noticing deaths, and reading a step's loss from them: what
both runtimes' controllers (controller.py's tiny GPT, pipelined.py's Hugging Face stages) share.

A worker answers over its pipe; a worker that dies says so only through its process sentinel,
and a killed one may first have sent a `dying` report carrying its kill time (wall clock), which
is what recovery latency is measured from. Both are waited on together, so a death is seen at
once and never waited out as a silent reply."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any


@dataclass
class Collected:
    """What one wait gathered: replies of the expected workers that answered, the workers that
    died meanwhile, and the earliest kill time a dying worker reported (perf_counter seconds)."""

    replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)
    kill_time: float | None = None

    def note_dying(self, msg: dict[str, Any]) -> None:
        """A `dying` report's wall-clock time, moved onto this process's perf_counter clock."""
        at = msg["t"] - time.time() + time.perf_counter()
        self.kill_time = at if self.kill_time is None else min(self.kill_time, at)


def collect_replies(conns: dict[int, Connection], procs: dict[int, BaseProcess], expect: set[int],
                    timeout_s: float | None = None,
                    on_death: Callable[[int, bool], None] | None = None) -> Collected:
    """Replies of `expect`, and every worker of `procs` that died before its reply came.

    A dead worker is drained (its `dying` report read), joined, and removed from `procs` and
    `conns` (its pipe closed); `on_death(device, first)` then runs, `first` for the first death of
    this wait. A worker that reports `crashed` raises RuntimeError with its traceback, and so does
    a silence longer than `timeout_s` (None waits as long as it takes)."""
    got = Collected()
    waiting = set(expect)
    while waiting:
        handles: dict[Any, tuple[str, int]] = {conns[d]: ("conn", d) for d in waiting}
        handles.update({procs[d].sentinel: ("proc", d) for d in procs})
        ready = wait(list(handles), timeout=timeout_s)
        if not ready:
            raise RuntimeError(f"workers {sorted(waiting)} did not answer in {timeout_s:g} s")
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
