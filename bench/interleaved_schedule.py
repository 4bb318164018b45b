"""PerfModel.pipeline_time under interleaving against an event simulation of Megatron-LM's interleaved order.

Why: the model prices interleaved 1F1B in closed form (compute of the chunk operations plus the sends
the first micro-batch's forward and the last one's backward cross). This simulation is written from
Megatron-LM's megatron/core/pipeline_parallel/schedules.py (forward_backward_pipelining_with_interleaving,
get_pp_rank_microbatches, get_schedule_table), not from the model: micro-batches in groups of
`group` (microbatch_group_size_per_vp_stage, default p) through chunk 0, then chunk 1, ...; rank r warms
up with 2 (p - r - 1) + (v - 1) group chunk forwards, then alternates one forward and one backward,
then drains. With overlap_p2p_comm (on whenever virtual stages are set) a send delays only its
receiver: it lies on the dependency edge, not on the sender's timeline.

Run: python bench/interleaved_schedule.py (a few seconds; prints one line a case).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # measure this checkout's package, not whichever one pip installed

from chameleon_opt.perf.model import PerfModel, StageCost  # noqa: E402

Operation = tuple[bool, int, int]  # (is_forward, micro_batch, chunk)


def rank_order(rank: int, stages: int, micro_batches: int, chunks: int, group: int) -> list[Operation]:
    """Megatron's operation order on one pipeline rank (get_schedule_table, then warm-up / 1F1B / drain)."""
    table: list[tuple[int, int]] = []
    for low in range(0, micro_batches, group):
        high = micro_batches if low + group >= micro_batches else low + group
        table += [(mb, chunk) for chunk in range(chunks) for mb in range(low, high)]
    total = micro_batches * chunks
    warmup = min(2 * (stages - rank - 1) + (chunks - 1) * group, total)
    forwards = [(True, mb, chunk) for mb, chunk in table]
    backwards = [(False, mb, chunks - 1 - chunk) for mb, chunk in table]
    order = forwards[:warmup]
    for k in range(total - warmup):
        order += [forwards[warmup + k], backwards[k]]
    return order + backwards[total - warmup:]


def simulate(forward: list[float], backward: list[float], send: list[float], micro_batches: int, chunks: int,
             group: int | None = None) -> float:
    """Makespan of the interleaved order: forward[r] / backward[r] a chunk operation on rank r, send[r] the
    transfer from rank r to rank r + 1 (and back), the wrap from the last rank to the first at max(send)."""
    stages = len(forward)
    orders = [rank_order(r, stages, micro_batches, chunks, group or stages) for r in range(stages)]
    wrap = max(send, default=0.0)
    ended: dict[tuple[int, Operation], float] = {}
    position, clock = [0] * stages, [0.0] * stages
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(stages):
            while position[r] < len(orders[r]):
                is_forward, mb, chunk = orders[r][position[r]]
                if is_forward:
                    if r:
                        needed, latency = (r - 1, (True, mb, chunk)), send[r - 1]
                    elif chunk:
                        needed, latency = (stages - 1, (True, mb, chunk - 1)), wrap
                    else:
                        needed, latency = None, 0.0
                elif r == stages - 1 and chunk == chunks - 1:
                    needed, latency = (r, (True, mb, chunk)), 0.0
                elif r < stages - 1:
                    needed, latency = (r + 1, (False, mb, chunk)), send[r]
                else:
                    needed, latency = (0, (False, mb, chunk + 1)), wrap
                if needed is not None and needed not in ended:
                    break
                ready = ended[needed] + latency if needed is not None else 0.0
                clock[r] = max(clock[r], ready) + (forward[r] if is_forward else backward[r])
                ended[(r, orders[r][position[r]])] = clock[r]
                position[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the order deadlocks")
    return max(clock)


def modelled(forward: list[float], backward: list[float], send: list[float], micro_batches: int,
             chunks: int) -> float:
    """PerfModel.pipeline_time on stage costs whose forward and backward are the chunks' sums."""
    stages = len(forward)
    costs = [StageCost(chunks * forward[s], chunks * backward[s], chunks * (forward[s] + backward[s]), 0.0,
                       send[s] if s < stages - 1 else 0.0, send[s - 1] if s else 0.0, 0.0, 1.0)
             for s in range(stages)]
    return PerfModel.pipeline_time(costs, micro_batches, chunks)


def main() -> None:
    cases = [(4, 2, 8), (2, 2, 4), (4, 2, 4), (4, 3, 8), (4, 5, 16), (8, 2, 16), (8, 6, 64), (4, 10, 32),
             (4, 20, 32), (8, 5, 64), (8, 12, 16)]
    for stages, chunks, micro in cases:
        rng = random.Random(100 * stages + 10 * chunks + micro)
        drawn = [rng.uniform(0.8, 1.2) for _ in range(stages)]
        for name, forward, send in (("identical", [1.0] * stages, 0.1), ("drawn 0.8-1.2x", drawn, 0.1)):
            backward = [2.0 * f for f in forward]
            sends = [send] * (stages - 1)
            sim = simulate(forward, backward, sends, micro, chunks)
            model = modelled(forward, backward, sends, micro, chunks)
            print(f"p {stages:2d} v {chunks:2d} m {micro:3d} {name:15s} simulated {sim:9.3f} model {model:9.3f} "
                  f"({model / sim - 1:+.2%})")


if __name__ == "__main__":
    main()
