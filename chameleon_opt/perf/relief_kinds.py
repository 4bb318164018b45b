"""What a memory relief is: an activation mode, optionally with the optimizer state offloaded.

`none`, `selective`, `full` (recomputation, Korthikanti et al. 2022), `offload` (every activation
copied to host memory over the device-host link as the forward produces it and fetched back for the
backward, the copies overlapped with compute), each optionally `+opt-offload` (fp32 master weights
and moments live on the host and the CPU runs the optimizer step, as ZeRO-Offload does). Apart from
the choice (perf/relief.py) so that the performance model, which prices each relief, imports only
the names.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVATION_MODES = ("none", "selective", "full", "offload")
OPT_OFFLOAD = "opt-offload"


def parse_relief(name: str) -> tuple[str, bool]:
    """(activation mode, optimizer offloaded) of a relief name such as `full+opt-offload`."""
    parts = name.split("+")
    offload = OPT_OFFLOAD in parts
    rest = [p for p in parts if p != OPT_OFFLOAD]
    mode = rest[0] if rest else "none"
    if len(rest) > 1 or mode not in ACTIVATION_MODES or parts.count(OPT_OFFLOAD) > 1:
        raise ValueError(f"unknown relief {name!r}: use one of {', '.join(ACTIVATION_MODES)}, "
                         f"optionally with +{OPT_OFFLOAD}")
    return mode, offload


def relief_name(mode: str, optimizer_offload: bool) -> str:
    if optimizer_offload:
        return OPT_OFFLOAD if mode == "none" else f"{mode}+{OPT_OFFLOAD}"
    return mode


def relief_options(supported: list[str] | None, recompute: str) -> tuple[str, ...]:
    """Every per-stage relief the trainer supports: its activation modes (the global recomputation
    when none is listed), each also with the optimizer offloaded when `opt-offload` is listed."""
    given = list(supported or [recompute])
    modes = [m for m in ACTIVATION_MODES if m in given] or [recompute]
    with_offload = [False, True] if OPT_OFFLOAD in given else [False]
    return tuple(relief_name(m, o) for o in with_offload for m in modes)


@dataclass(frozen=True)
class ReliefCost:
    """One relief on one stage slot: its op durations, optimizer step and whether it fits."""

    relief: str
    forward_s: float
    backward_s: float
    optimizer_s: float
