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
