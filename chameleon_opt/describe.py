"""The operator's reading of a plan: who does what, in device ranges and rounded numbers.

An operator in an incident acts on device ranges ("devices 0-6, 8-15 keep training, device 7
failed, 24-31 idle"), not on per-stage tables with five significant digits; these functions turn
plans and decisions into such lines. They are plain text (no rich markup), so tests read them
as a person would.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from chameleon_opt.plan import Plan

RUNS_SHOWN = 10
"""Device runs listed before the rest is summed up (a 16,384-device job stays one line)."""


def sig(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits, never in scientific notation (12.2, 0.451, 5,885,071)."""
    if not math.isfinite(value):
        return "never" if value > 0 else "-"
    if value == 0:
        return "0"
    rounded = float(f"{value:.{digits}g}")
    decimals = max(digits - 1 - math.floor(math.log10(abs(rounded))), 0)
    text = f"{rounded:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if decimals else text


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{sig(100 * fraction, 2)}%"


def duration(seconds: float) -> str:
    """A span a person reads at a glance: 35 s, 4.5 min, 1.6 h, 68 d, 3.2 y; infinity is `never`."""
    if not math.isfinite(seconds):
        return "never"
    for unit, size in (("y", 365 * 86400.0), ("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= 2 * size or (unit == "min" and seconds >= 120):
            value = seconds / size
            return f"{value:,.0f} {unit}" if value >= 100 else f"{float(f'{value:.2g}'):g} {unit}"
    return f"{sig(seconds)} s"


def plural(count: int | float, noun: str) -> str:
    """`1 device`, `2 devices`, `21.3 micro-batches`."""
    shown = f"{count:,}" if isinstance(count, int) else sig(count)
    return f"{shown} {noun}" if count == 1 else f"{shown} {noun}{'es' if noun.endswith(('ch', 's', 'x')) else 's'}"


def runs(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted ids as runs of consecutive numbers [(first, last), ...]."""
    out: list[tuple[int, int]] = []
    for i in sorted(set(ids)):
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def ranges(ids: Iterable[int]) -> str:
    """`0-6, 8-15, 24`; past RUNS_SHOWN runs, the rest is counted (`..., and 40 more`)."""
    found = runs(ids)
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in found[:RUNS_SHOWN]]
    rest = sum(b - a + 1 for a, b in found[RUNS_SHOWN:])
    return ", ".join(parts) + (f", and {rest:,} more" if rest else "")


def devices(ids: Iterable[int], noun: str = "device") -> str:
    """`device 7`, `devices 0-6, 8-15`, or `no device`."""
    ids = sorted(set(ids))
    if not ids:
        return f"no {noun}"
    return f"{noun} {ids[0]}" if len(ids) == 1 else f"{noun}s {ranges(ids)}"


def failure_title(name: str, failed: frozenset[int], num_devices: int, per_node: int) -> str:
    """`paper-32: devices 8-15 failed (all of node 1); 24 of 32 devices left`."""
    nodes = defaultdict(int)
    for d in failed:
        nodes[d // per_node] += 1
    whole = sorted(n for n, count in nodes.items() if count == per_node)
    part = sorted(n for n in nodes if n not in whole)
    where = ([f"all of {devices(whole, 'node')}"] if whole else []) + ([f"on {devices(part, 'node')}"] if part else [])
    return (f"{name}: {devices(failed)} failed ({', '.join(where)}); "
            f"{num_devices - len(failed)} of {plural(num_devices, 'device')} left")


def _split(layers: list[tuple[int, int]]) -> str:
    shown = [f"{a}-{b - 1}" if b - 1 > a else str(a) for a, b in layers]
    if len(shown) > 6:
        shown = shown[:2] + ["..."] + shown[-1:]
    return " | ".join(shown)


def same_layout(a: Plan, b: Plan) -> bool:
    """Whether two plans place the same layers on the same devices (micro-batches and rerouted
    work may differ: changing those moves no state)."""
    def places(plan: Plan) -> set[tuple[tuple[int, ...], int, int]]:
        return {(s.devices, s.first, s.end) for p in plan.pipelines for s in p.stages}

    return places(a) == places(b)


def layout_lines(plan: Plan, failed: frozenset[int], num_devices: int, before: Plan | None = None) -> list[str]:
    """What every device does under `plan`, one line per kind of pipeline, then the idle and the
    failed devices. Pipelines that run the same stages (layers, relief), take the same rerouted
    work and lost the same stages share a line with their count; `before` marks the pipelines
    that run exactly as they did (same devices and layers)."""
    taken: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    sources: dict[tuple[int, int], set[int]] = defaultdict(set)
    given: dict[int, set[int]] = defaultdict(set)
    for r in plan.rerouted:
        taken[r.to_pipeline][r.stage] += r.micro_batches
        sources[(r.to_pipeline, r.stage)].add(r.from_pipeline)
        given[r.from_pipeline].add(r.to_pipeline)
    unchanged = {tuple((s.devices, s.first, s.end) for s in p.stages) for p in before.pipelines} if before else set()
    groups: dict[tuple, list[int]] = {}
    for j, pipe in enumerate(plan.pipelines):
        lost = tuple(s for s, stage in enumerate(pipe.stages) if failed.intersection(stage.devices))
        same = tuple((s.devices, s.first, s.end) for s in pipe.stages) in unchanged
        key = (tuple((s.first, s.end, s.relief) for s in pipe.stages), lost, same, pipe.micro_batches == 0,
               tuple(sorted((s, round(m, 6), tuple(sorted(sources[(j, s)]))) for s, m in taken[j].items())),
               tuple(sorted(given[j])))
        groups.setdefault(key, []).append(j)
    lines: list[str] = []
    working: set[int] = set()
    for (split, lost, same, empty, takes, to), members in groups.items():
        pipes = [plan.pipelines[j] for j in members]
        live = [d for p in pipes for s, stage in enumerate(p.stages) if s not in lost for d in stage.devices]
        if empty:
            continue  # its devices are idle: listed below
        working.update(live)
        micro = sorted({p.micro_batches for p in pipes})
        count = "1 pipeline" if len(pipes) == 1 else f"{len(pipes)} pipelines"
        shape = f"{len(split)} stages x TP {plan.tensor_parallel}" if len(split) > 1 else f"1 stage x TP {plan.tensor_parallel}"
        each = "" if len(pipes) == 1 else " each"
        line = (f"{devices(live)}: {count}{' as before' if same else ''} ({shape}, layers "
                f"{_split([(a, b) for a, b, _ in split])}), {plural(micro[0], 'micro-batch') if len(micro) == 1 else f'{micro[0]}-{micro[-1]} micro-batches'}{each}")
        for s, amount, frm in takes:
            holders = [d for p in pipes for d in p.stages[s].devices]
            line += (f"; stage {s} ({devices(holders)}) also runs {plural(amount, 'micro-batch')}{each} of "
                     f"{devices(frm, 'pipeline')}'s stage {s}")
        if lost:
            line += f"; {'stages' if len(lost) > 1 else 'stage'} {', '.join(map(str, lost))} lost" + (
                f": that work runs on {devices(to, 'pipeline')}" if to else "")
        reliefs = sorted({r for _, _, r in split if r not in (None, "none")})
        if reliefs:
            line += f"; memory relief {', '.join(reliefs)}"
        lines.append(line)
    idle = set(range(num_devices)) - working - failed
    if idle:
        lines.append(f"idle: {devices(idle)}")
    if failed:
        lines.append(f"failed: {devices(failed)}")
    return lines
