"""Exchanges between ranks: point-to-point pieces of activations (or their gradients), shared by
both runtimes' rank-plan execution (`worker.Worker._run_operations`, `pipelined.Worker._run_operations`),
and the HF runtime's flat gradient all-reduce, which its profiler times as the runtime runs it
(`pipelined.Worker._allreduce`, `profile.measure_allreduce`).

Receives block and sends do not: the ranks' operation orders come from one valid global schedule
(`runtime.schedule`), so a rank waits only on a peer that has already sent, or will without waiting
on it. A message's tag is its first sample and direction, unique per pair of ranks and step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from chameleon_opt.runtime.schedule import Message, WorkItem


def receive_piece(messages: tuple[Message, ...], shape: tuple[int, int], dtype: torch.dtype,
                  rank_of: Mapping[int, int], backward: bool, group: Any = None) -> torch.Tensor:
    """A piece's rows from the peers holding them, in sample order (`group`: None, the world)."""
    buffers, works = [], []
    for m in messages:
        buf = torch.empty((m.stop - m.start, *shape), dtype=dtype)
        works.append(dist.irecv(buf, rank_of[m.peer], group=group, tag=m.tag(backward)))
        buffers.append(buf)
    for work in works:
        work.wait()
    return torch.cat(buffers) if len(buffers) > 1 else buffers[0]


def send_piece(messages: tuple[Message, ...], item: WorkItem, tensor: torch.Tensor, rank_of: Mapping[int, int],
               backward: bool, group: Any = None) -> list[Any]:
    """Each peer's rows of `tensor` (the piece `item`'s), sent without waiting: the works to wait on."""
    return [dist.isend(tensor[m.start - item.start:m.stop - item.start].contiguous(), rank_of[m.peer],
                       group=group, tag=m.tag(backward)) for m in messages]


def allreduce_flat(tensors: list[torch.Tensor], group: Any = None) -> None:
    """Sum `tensors` over `group` in place as one flat buffer: one gloo call for a bucket of many."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
