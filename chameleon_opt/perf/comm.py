"""Communication costs on alpha-beta links (latency + bytes / bandwidth)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One device's share of a link: bytes/s and seconds of latency per message."""

    bandwidth: float
    latency: float

    def send_time(self, nbytes: float) -> float:
        """Point-to-point transfer of one message (Hockney's alpha-beta model)."""
        return 0.0 if nbytes <= 0 else self.latency + nbytes / self.bandwidth


def ring_allreduce_time(nbytes: float, participants: int, link: Link) -> float:
    """Ring all-reduce (reduce-scatter + all-gather): 2(n-1) steps of nbytes/n each over the
    slowest link the ring crosses (Patarasuk and Yuan, JPDC 2009). Zero for a single participant."""
    if participants <= 1 or nbytes <= 0:
        return 0.0
    steps = 2 * (participants - 1)
    return steps * link.latency + steps * (nbytes / participants) / link.bandwidth


def ring_allgather_time(nbytes: float, participants: int, link: Link) -> float:
    """Ring all-gather of `nbytes` in all (each participant starts with nbytes/n), or the ring
    reduce-scatter of `nbytes` down to nbytes/n each: n - 1 steps of nbytes/n, one half of
    ring_allreduce_time (the same reference). Zero for a single participant."""
    if participants <= 1 or nbytes <= 0:
        return 0.0
    steps = participants - 1
    return steps * link.latency + steps * (nbytes / participants) / link.bandwidth


def ring_latency(participants: int, nodes: int, intra: Link, inter: Link) -> float:
    """Start-up latency of one ring all-gather or reduce-scatter over `participants` ranks on `nodes`
    nodes: n - 1 steps, nodes - 1 of them crossing a node boundary and the others inside a node
    (NCCL's ring latency model, src/graph/tuning.cc ncclTopoTuneModel: (nsteps - nInterSteps) x
    intraLat + nInterSteps x interLat; the chunks are pipelined around the ring, so a step that
    crosses no node boundary does not pay the network's latency)."""
    if participants <= 1:
        return 0.0
    inter_steps = max(min(nodes, participants) - 1, 0)
    return (participants - 1 - inter_steps) * intra.latency + inter_steps * inter.latency


def ring_link_across_nodes(intra: Link, inter: Link, ranks_per_node: list[int]) -> Link:
    """The per-rank link of a ring whose ranks sit on the given nodes (`ranks_per_node`: how many of
    its ranks each node holds). Inside one node: `intra`. Across nodes NCCL runs one ring per
    channel and routes the channels through different NICs of each node (NCCL's topology search
    builds its rings NIC by NIC; busBW in nccl-tests' PERFORMANCE.md), so a group with k ranks on
    every node drives k NICs: k times `inter` (each device's share of its node's NICs), capped by
    `intra`; the latency is the inter-node one."""
    if len(ranks_per_node) <= 1:
        return intra
    k = min(ranks_per_node)
    return Link(min(intra.bandwidth, k * inter.bandwidth), inter.latency)
