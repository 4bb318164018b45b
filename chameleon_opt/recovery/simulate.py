"""Failure-trace simulator: replay failures and repairs over a training run under a recovery policy.

Training is modelled as a piecewise-constant rate: global_batch / step_s samples per second while
a plan runs, 0 during a transition. After each event the policy's `Response` starts at the event
time: an optional interim phase (the hybrid trains at `interim_step_s` while it searches and
migrates in the background), then `transition_s` with no training, then the new plan. Rules:

- Cascades: a failure that arrives before the running response's transition is over interrupts
  it: the work of that transition is lost (its plan was never adopted) and the policy responds
  again from the layout committed before it, with every device down at that moment.
- Repairs: a repaired device is live again; the policy decides what to do (see recovery/chameleon.py); one
  it leaves idle (`Response.idle`: keep running without it) counts as down for later decisions
  and is offered again with the next repair. A repair that arrives during a transition is
  deferred to the end of that transition; a repair whose own transition is interrupted by a
  failure is re-delivered after the new transition (the device counts as down until then: its
  state was not restored).
- Failures that hit only devices outside both the committed layout and the pending one (idle
  devices) need no response; they are recorded in `ignored`.
- The partial iteration a failure interrupts is not counted for any policy.

Failure traces: `synthetic_trace` (exponential times between failures of the cluster, each
failure picks a random live device or node; optional repairs after a fixed delay),
`published_rate_trace` (Llama 3's 419 unexpected interruptions in 54 days on 16,384 GPUs, one GPU
each; OPT-175B's about 2 machines lost a day on about 128 nodes of 8 GPUs, a whole node each),
`fixed_trace` (given times and devices), `trace_from_instance` (the instance's own events),
`load_trace` / `trace_to_json` (JSON files) and `parse_trace` (one string for the CLI).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from chameleon_opt.errors import InputError
from chameleon_opt.instance.load import Instance
from chameleon_opt.recovery.interface import Policy, PolicyState, Response, at_state

EventKind = Literal["fail", "repair"]


@dataclass(frozen=True, order=True)
class TraceEvent:
    time_s: float
    kind: EventKind
    devices: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "kind": self.kind, "devices": list(self.devices)}


Trace = list[TraceEvent]


# -- traces ---------------------------------------------------------------------------------------
def _generate(units: Sequence[tuple[int, ...]], mtbf_hours_per_unit: float, horizon_s: float, seed: int,
              repair_hours: float | None) -> Trace:
    """Failures of whole units (devices or nodes): the cluster's next failure is exponential with
    rate live units / MTBF and hits a live unit chosen uniformly; a failed unit is repaired after
    `repair_hours` (fixed delay) when given."""
    if mtbf_hours_per_unit <= 0:
        raise ValueError("the MTBF must be positive")
    rng = np.random.default_rng(seed)
    live = list(range(len(units)))
    repairs: list[tuple[float, int]] = []
    events: Trace = []
    t = 0.0
    while True:
        rate = len(live) / (mtbf_hours_per_unit * 3600.0)
        gap = rng.exponential(1.0 / rate) if rate > 0 else math.inf
        if repairs and repairs[0][0] <= t + gap:
            t, unit = heapq.heappop(repairs)  # memoryless: redraw the next failure after the repair
            if t >= horizon_s:
                break
            live.append(unit)
            live.sort()
            events.append(TraceEvent(t, "repair", units[unit]))
            continue
        t += gap
        if t >= horizon_s:
            break
        unit = live.pop(int(rng.integers(len(live))))
        events.append(TraceEvent(t, "fail", units[unit]))
        if repair_hours is not None:
            heapq.heappush(repairs, (t + repair_hours * 3600.0, unit))
    return events


def synthetic_trace(num_devices: int, mtbf_hours_per_device: float, horizon_s: float, seed: int = 0,
                    repair_hours: float | None = None) -> Trace:
    """Single-device failures: exponential gaps at rate live devices / MTBF, a random live device
    each time; with `repair_hours`, each failed device comes back that long after it failed."""
    return _generate([(d,) for d in range(num_devices)], mtbf_hours_per_device, horizon_s, seed, repair_hours)


@dataclass(frozen=True)
class PublishedRate:
    name: str
    unit: Literal["device", "node"]
    mtbf_hours_per_unit: float
    source: str


PUBLISHED_RATES: dict[str, PublishedRate] = {
    "llama3": PublishedRate("llama3", "device", 16384 * 54 * 24 / 419,
                            "Llama 3 (arXiv:2407.21783): 419 unexpected interruptions in 54 days on 16,384 GPUs; "
                            "each taken here as the loss of one GPU"),
    "opt175b": PublishedRate("opt175b", "node", 128 * 24 / 2.0,
                             "OPT-175B logbook (arXiv:2205.01068): about 2 machines lost a day on about 128 nodes "
                             "of 8 GPUs; each a whole node"),
}


def published_rate_trace(source: str, num_devices: int, horizon_s: float, seed: int = 0,
                         repair_hours: float | None = None, devices_per_node: int = 8) -> Trace:
    """A synthetic trace at a published failure rate, scaled to this cluster's size (per GPU for
    'llama3', per node for 'opt175b')."""
    if source not in PUBLISHED_RATES:
        raise ValueError(f"unknown published rate {source!r}: use one of {', '.join(PUBLISHED_RATES)}")
    rate = PUBLISHED_RATES[source]
    if rate.unit == "device":
        units = [(d,) for d in range(num_devices)]
    else:
        units = [tuple(range(n * devices_per_node, min((n + 1) * devices_per_node, num_devices)))
                 for n in range(math.ceil(num_devices / devices_per_node))]
    return _generate(units, rate.mtbf_hours_per_unit, horizon_s, seed, repair_hours)


def published_mtbf_hours_per_device(source: str, devices_per_node: int = 8) -> float:
    """The per-device MTBF that gives the same cluster failure rate (Chameleon's D estimate)."""
    rate = PUBLISHED_RATES[source]
    return rate.mtbf_hours_per_unit * (devices_per_node if rate.unit == "node" else 1)


def fixed_trace(times_s: Iterable[float], devices: Iterable[int | Sequence[int]],
                repairs: Iterable[tuple[float, Sequence[int]]] = ()) -> Trace:
    """Failures at the given times (one device or a group each), plus optional repairs."""
    events = [TraceEvent(float(t), "fail", (d,) if isinstance(d, int) else tuple(d)) for t, d in zip(times_s, devices)]
    events += [TraceEvent(float(t), "repair", tuple(d)) for t, d in repairs]
    return sorted(events)


def trace_from_instance(instance: Instance) -> Trace:
    return sorted(TraceEvent(e.time_s, "fail", tuple(e.devices)) for e in instance.spec.failures.events)


def trace_to_json(trace: Trace) -> list[dict[str, Any]]:
    return [e.to_json() for e in trace]


def load_trace(path: str | Path) -> Trace:
    """A JSON list of {time_s, kind ('fail'|'repair', default 'fail'), devices}, or {"events": [...]}."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(path, "<trace>", f"cannot read a JSON trace ({error})",
                         "give a JSON list of {time_s, kind, devices}") from error
    items = data.get("events") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise InputError(path, "events", "not a list", "give a JSON list of {time_s, kind, devices}")
    events = []
    for i, item in enumerate(items):
        try:
            kind = item.get("kind", "fail")
            if kind not in ("fail", "repair"):
                raise ValueError(f"kind {kind!r}")
            devices = tuple(int(d) for d in item["devices"])
            if not devices or min(devices) < 0:
                raise ValueError("devices must be a non-empty list of ids")
            time_s = float(item["time_s"])
            if not math.isfinite(time_s) or time_s < 0:
                raise ValueError("time_s must be finite and >= 0")
            events.append(TraceEvent(time_s, kind, devices))
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise InputError(path, f"events[{i}]", f"bad event ({error})",
                             "give time_s >= 0, kind 'fail' or 'repair', devices [ids]") from error
    return sorted(events)


def parse_trace(spec: str, instance: Instance, horizon_s: float) -> tuple[Trace, float | None]:
    """A trace from one CLI string, and the per-device MTBF it implies (None when unknown).

    'instance' (the instance's own events), a JSON file path, 'synthetic[:k=v,...]' with keys
    mtbf_hours (per device, default the instance's), seed, repair_hours, or 'llama3' / 'opt175b'
    [:seed=..,repair_hours=..] (published rates)."""
    name, _, rest = spec.partition(":")
    if name not in TRACE_KEYS:
        if Path(spec).is_file():
            return load_trace(spec), instance.spec.failures.mtbf_hours_per_device
        raise InputError(None, "--trace", f"unknown trace {spec!r}",
                         "give instance, synthetic[:mtbf_hours=H,seed=S,repair_hours=R], llama3, opt175b or a JSON file")
    options = _trace_options(name, rest)
    if name == "instance":
        return trace_from_instance(instance), instance.spec.failures.mtbf_hours_per_device
    seed = int(options.get("seed", 0))
    repair = options.get("repair_hours")
    if name == "synthetic":
        mtbf = options.get("mtbf_hours", instance.spec.failures.mtbf_hours_per_device or 0)
        if mtbf <= 0:
            raise InputError(None, "--trace", "synthetic trace without an MTBF",
                             "give synthetic:mtbf_hours=H or an instance with failures.mtbf_hours_per_device")
        return synthetic_trace(instance.num_devices, mtbf, horizon_s, seed, repair), mtbf
    per_node = instance.devices_per_node
    return (published_rate_trace(name, instance.num_devices, horizon_s, seed, repair, per_node),
            published_mtbf_hours_per_device(name, per_node))


TRACE_KEYS = {"instance": (), "synthetic": ("mtbf_hours", "seed", "repair_hours"),
              **{name: ("seed", "repair_hours") for name in PUBLISHED_RATES}}
"""The `key=value` options each named trace takes (a file or `instance` takes none)."""


def _trace_options(name: str, text: str) -> dict[str, float]:
    """`k=v,...` of a --trace string, checked: known keys only (a misspelt key must not be silently
    ignored), seed a non-negative integer, hours positive finite numbers (repair may be 0)."""
    valid = TRACE_KEYS[name]
    listed = ", ".join(valid) if valid else "none"
    options: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (x.strip() for x in part.partition("="))
        if key not in valid:
            raise InputError(None, "--trace", f"unknown option {key!r} for the {name} trace", f"valid keys: {listed}")
        if not sep or not value:
            raise InputError(None, "--trace", f"option {key!r} has no value", f"write {key}=VALUE")
        try:
            number = float(int(value)) if key == "seed" else float(value)
        except ValueError:
            kind = "an integer" if key == "seed" else "a number"
            raise InputError(None, "--trace", f"{key}={value!r} is not {kind}", f"write e.g. {key}="
                             + ("0" if key == "seed" else "1000")) from None
        lowest_ok = key in ("seed", "repair_hours")
        if not math.isfinite(number) or number < 0 or (number == 0 and not lowest_ok):
            raise InputError(None, "--trace", f"{key}={value} is out of range",
                             f"give a finite {'non-negative' if lowest_ok else 'positive'} {key}")
        options[key] = number
    return options


def with_failure_rate(instance: Instance, mtbf_hours_per_device: float | None) -> Instance:
    """The instance with this per-device MTBF (what Chameleon's expected D reads), no explicit D,
    no failed devices (the trace brings them)."""
    failures = instance.spec.failures.model_copy(update={"mtbf_hours_per_device": mtbf_hours_per_device,
                                                         "next_fault_s": None, "events": []})
    spec = instance.spec.model_copy(update={"failures": failures})
    return dataclasses.replace(instance, spec=spec, failed_devices=frozenset())


# -- results --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    start_s: float
    end_s: float
    phase: str            # train | interim | transition | down
    step_s: float         # inf when not training
    samples_per_s: float

    @property
    def samples(self) -> float:
        return self.samples_per_s * (self.end_s - self.start_s)


@dataclass(frozen=True)
class TransitionRecord:
    time_s: float
    trigger: str          # fail | repair
    devices: tuple[int, ...]
    action: str
    transition_s: float
    interim_s: float
    step_s: float
    search_s: float
    fallback: bool
    notes: str
    interrupted: bool = False  # a later failure cut its interim or transition

    def to_json(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "trigger": self.trigger, "devices": list(self.devices), "action": self.action,
                "transition_s": self.transition_s, "interim_s": self.interim_s,
                "step_s": None if math.isinf(self.step_s) else self.step_s, "search_s": self.search_s,
                "fallback": self.fallback, "interrupted": self.interrupted, "notes": self.notes}


@dataclass(frozen=True)
class SimulationResult:
    policy: str
    instance: str
    horizon_s: float
    global_batch: int
    failure_free_step_s: float      # the instance's plan with no failure (not the policy's: Bamboo pays more)
    start_step_s: float             # the policy's own step before any failure
    segments: tuple[Segment, ...]
    transitions: tuple[TransitionRecord, ...]
    events: tuple[TraceEvent, ...]  # the trace's events before the horizon
    ignored: tuple[TraceEvent, ...]  # failures of idle devices, repairs of live ones
    wall_s: float

    @property
    def samples(self) -> float:
        return float(sum(s.samples for s in self.segments))

    @property
    def average_throughput(self) -> float:
        """Samples per second over the whole horizon."""
        return self.samples / self.horizon_s if self.horizon_s > 0 else 0.0

    @property
    def failure_free_throughput(self) -> float:
        return self.global_batch / self.failure_free_step_s

    @property
    def time_in_transition_s(self) -> float:
        """Time with no training (transitions, and time with no plan that can run)."""
        return float(sum(s.end_s - s.start_s for s in self.segments if s.samples_per_s == 0))

    @property
    def num_transitions(self) -> int:
        return sum(1 for t in self.transitions if t.action != "stay")

    @property
    def cascades(self) -> int:
        return sum(1 for t in self.transitions if t.interrupted)

    @property
    def fallbacks(self) -> int:
        return sum(1 for t in self.transitions if t.fallback)

    @property
    def final_step_s(self) -> float:
        return self.segments[-1].step_s if self.segments else math.inf

    def throughput_at(self, t: float) -> float:
        for s in self.segments:
            if s.start_s <= t < s.end_s:
                return s.samples_per_s
        return 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "instance": self.instance, "horizon_s": self.horizon_s,
            "average_throughput": self.average_throughput, "samples": self.samples,
            "failure_free_throughput": self.failure_free_throughput, "start_step_s": self.start_step_s,
            "time_in_transition_s": self.time_in_transition_s, "num_transitions": self.num_transitions,
            "cascades": self.cascades, "fallbacks": self.fallbacks, "wall_s": self.wall_s,
            "transitions": [t.to_json() for t in self.transitions],
            "segments": [[s.start_s, s.end_s, s.phase, None if math.isinf(s.step_s) else s.step_s, s.samples_per_s]
                         for s in self.segments],
            "events": trace_to_json(list(self.events)),
        }


# -- the simulator --------------------------------------------------------------------------------
@dataclass
class _Active:
    response: Response
    start_s: float
    record: int            # index in the transitions list (-1 for the start)
    trigger: str
    devices: frozenset[int]

    @property
    def interim_end(self) -> float:
        return self.start_s + self.response.interim_s

    @property
    def end(self) -> float:
        return self.interim_end + self.response.transition_s


@dataclass
class _Timeline:
    batch: int
    segments: list[Segment] = field(default_factory=list)

    def add(self, start: float, end: float, phase: str, step: float) -> None:
        if end <= start:
            return
        rate = self.batch / step if 0 < step < math.inf else 0.0
        if rate == 0.0 and phase == "train":
            phase = "down"
        last = self.segments[-1] if self.segments else None
        if last is not None and last.end_s == start and last.phase == phase and last.step_s == step:
            self.segments[-1] = Segment(last.start_s, end, phase, step, rate)
        else:
            self.segments.append(Segment(start, end, phase, step, rate))

    def run(self, active: _Active, start: float, end: float) -> None:
        """Emit what `active` does between start and end."""
        r = active.response
        cuts = [(active.start_s, active.interim_end, "interim", r.interim_step_s if r.interim_step_s else math.inf),
                (active.interim_end, active.end, "transition", math.inf),
                (active.end, math.inf, "train", r.step_s if r.plan is not None else math.inf)]
        for a, b, phase, step in cuts:
            lo, hi = max(a, start), min(b, end)
            if hi > lo:
                self.add(lo, hi, phase, step)


def simulate(instance: Instance, trace: Sequence[TraceEvent], policy: Policy, horizon_s: float,
             progress: Callable[[int, int], None] | None = None) -> SimulationResult:
    """Replay `trace` up to `horizon_s` under `policy`; the run starts failure-free on
    `instance.plan` (the instance's own failed devices are ignored: the trace brings failures).

    `progress(done, total)` is called after each trace event (total = events before the horizon)."""
    started = time.perf_counter()
    base = at_state(instance, instance.plan, frozenset())
    batch = instance.spec.training.global_batch
    from chameleon_opt.perf.model import PerfModel  # local: keeps the import graph of the module light
    failure_free = PerfModel(base).evaluate(base.plan).iteration_time_s
    in_horizon = sorted(e for e in trace if e.time_s < horizon_s)
    total = len(in_horizon)
    queue: list[tuple[float, int, TraceEvent, bool]] = [(e.time_s, i, e, True) for i, e in enumerate(in_horizon)]
    heapq.heapify(queue)
    order = len(queue)

    dead: set[int] = set()
    idle: set[int] = set()  # repaired, left out by a keep-running response: down until the next repair offers them
    first = policy.respond(PolicyState(base, frozenset(), "start"))
    active = _Active(first, 0.0, -1, "start", frozenset())
    committed = base.plan
    timeline = _Timeline(batch)
    records: list[TransitionRecord] = []
    ignored: list[TraceEvent] = []
    now, done = 0.0, 0
    while queue:
        t, _, event, original = heapq.heappop(queue)
        if t >= horizon_s:
            break
        timeline.run(active, now, t)
        now = t
        in_transition = t < active.end
        if not in_transition and active.response.next_layout is not None:
            committed = active.response.next_layout
        if event.kind == "repair":
            back = frozenset(event.devices) & dead
            if not back:
                ignored.append(event)
            elif in_transition:  # deferred to the end of the running transition
                heapq.heappush(queue, (active.end, order, TraceEvent(active.end, "repair", tuple(sorted(back))), False))
                order += 1
            else:
                back |= frozenset(idle & dead)
                idle -= back
                dead -= back
                active = _respond(policy, base, committed, dead, "repair", back, t, records)
                idle |= active.response.idle
                dead |= active.response.idle
        else:
            hit = frozenset(event.devices) - dead
            dead |= hit
            pending = active.response.next_layout if in_transition else None
            relevant = set(committed.devices) | (set(pending.devices) if pending is not None else set())
            if not hit or not hit & relevant:
                ignored.append(event)
            else:
                redeliver: frozenset[int] = frozenset()
                if in_transition and active.record >= 0:
                    records[active.record] = _interrupted(records[active.record])
                    if active.trigger == "repair":  # its state never arrived: down until re-delivered
                        redeliver = active.devices - dead
                        dead |= redeliver
                active = _respond(policy, base, committed, dead, "fail", hit, t, records)
                if redeliver:
                    again = TraceEvent(active.end, "repair", tuple(sorted(redeliver)))
                    heapq.heappush(queue, (active.end, order, again, False))
                    order += 1
        if original:
            done += 1
            if progress is not None:
                progress(done, total)
    timeline.run(active, now, horizon_s)
    return SimulationResult(policy.name, instance.name, horizon_s, batch, failure_free, first.step_s,
                            tuple(timeline.segments), tuple(records), tuple(in_horizon), tuple(ignored),
                            time.perf_counter() - started)


def _respond(policy: Policy, base: Instance, committed, dead: set[int], kind: str, changed: frozenset[int],
             t: float, records: list[TransitionRecord]) -> _Active:
    frozen = frozenset(dead)
    response = policy.respond(PolicyState(at_state(base, committed, frozen), frozen, kind, changed, t))
    records.append(TransitionRecord(t, kind, tuple(sorted(changed)), response.action, response.transition_s,
                                    response.interim_s, response.step_s, response.search_s, response.fallback,
                                    response.notes))
    return _Active(response, t, len(records) - 1, kind, changed)


def _interrupted(record: TransitionRecord) -> TransitionRecord:
    return dataclasses.replace(record, interrupted=True)


def simulate_policies(instance: Instance, trace: Sequence[TraceEvent], policies: Sequence[str], horizon_s: float,
                      mtbf_hours_per_device: float | None = None, time_limit_s: float | None = None,
                      search_charge_s: float | None = None,
                      progress: Callable[[str, int, int], None] | None = None,
                      deterministic: bool = False) -> dict[str, SimulationResult]:
    """Run several policies by name (see `registry.POLICIES`) on one trace, the Chameleon family
    sharing one cache of `decide` results. `mtbf_hours_per_device` sets the fault statistics the
    policies read (None keeps the instance's); `progress(policy, done, total)` per trace event.
    `deterministic`: every decision on a deterministic deadline with deterministic solvers
    (`SolverOptions.deterministic`), so a loaded machine gives the results of a quiet one."""
    from chameleon_opt.solve.backends import SolverOptions

    from chameleon_opt.recovery.chameleon import DecisionSource
    from chameleon_opt.recovery.interface import SEARCH_TIME_LIMIT_S
    from chameleon_opt.recovery.registry import make_policy

    limit = SEARCH_TIME_LIMIT_S if time_limit_s is None else time_limit_s
    scored = instance if mtbf_hours_per_device is None else with_failure_rate(instance, mtbf_hours_per_device)
    source = DecisionSource(limit, SolverOptions(deterministic=deterministic))
    results = {}
    for name in policies:
        policy = make_policy(name, time_limit_s=limit, search_charge_s=search_charge_s, source=source)
        tick = None if progress is None else (lambda done, total, name=name: progress(name, done, total))
        results[name] = simulate(scored, trace, policy, horizon_s, tick)
    return results


# -- plot -----------------------------------------------------------------------------------------
STYLES = (("-", 3.4, 0.55, "o"), ("--", 2.2, 0.9, "s"), ("-.", 1.6, 0.9, "^"), (":", 1.6, 1.0, "D"),
          ((0, (5, 1, 1, 1, 1, 1)), 1.3, 0.9, "v"), ((0, (1, 3)), 1.3, 1.0, "x"))
"""Per policy, in the order given: line style, width, opacity, marker. The first policy (the one
being evaluated) is the widest, half transparent, drawn first; each later one is narrower and
dashed differently on top of it, so where policies coincide every line still shows."""


def _time_scale(results: dict[str, SimulationResult]) -> tuple[float, str]:
    any_result = next(iter(results.values()), None)
    return (3600.0, "h") if (any_result.horizon_s if any_result else 0) > 6 * 3600 else (60.0, "min")


def _policy_style(i: int) -> dict[str, Any]:
    style, width, alpha, marker = STYLES[i % len(STYLES)]
    return {"linestyle": style, "linewidth": width, "alpha": alpha, "marker": marker, "markersize": 4,
            "zorder": 2 + i}


def draw_timeline(ax: Any, results: dict[str, SimulationResult], title: str | None = None) -> None:
    """Throughput step plot of every policy on a matplotlib axes: failures (red) and repairs
    (green) marked, failure-free throughput dashed grey; a marker where a policy's rate changes."""
    any_result = next(iter(results.values()), None)
    scale, unit = _time_scale(results)
    for i, (name, result) in enumerate(results.items()):
        xs, ys = [], []
        for s in result.segments:
            xs += [s.start_s / scale, s.end_s / scale]
            ys += [s.samples_per_s, s.samples_per_s]
        ax.plot(xs, ys, label=f"{name} (avg {result.average_throughput:.4g}/s)", markevery=list(range(0, len(xs), 2)),
                **_policy_style(i))
    if any_result is not None:
        ax.axhline(any_result.failure_free_throughput, color="grey", linestyle="--", linewidth=0.8,
                   label="failure-free", zorder=1)
        marked = set()
        for e in any_result.events:
            color, style = ("red", ":") if e.kind == "fail" else ("green", "-.")
            label = None if e.kind in marked else ("failure" if e.kind == "fail" else "repair")
            marked.add(e.kind)
            ax.axvline(e.time_s / scale, color=color, linestyle=style, linewidth=0.7, alpha=0.5, label=label, zorder=1)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_ylim(bottom=0)
    ax.set_title(title or (f"{any_result.instance}: throughput per policy" if any_result else "throughput"),
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower left", ncol=2)


def draw_lost_time(ax: Any, results: dict[str, SimulationResult]) -> None:
    """Training time lost so far against failure-free training (samples not processed, divided by
    the failure-free rate): policies whose throughput lines coincide still separate here."""
    scale, unit = _time_scale(results)
    for i, (name, result) in enumerate(results.items()):
        rate = result.failure_free_throughput
        xs, ys, lost = [0.0], [0.0], 0.0
        for s in result.segments:
            lost += (rate - s.samples_per_s) * (s.end_s - s.start_s) / rate
            xs.append(s.end_s / scale)
            ys.append(lost / 60.0)
        ax.plot(xs, ys, label=f"{name}: {ys[-1]:.4g} min lost", markevery=list(range(1, len(xs))),
                **_policy_style(i))
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("training time lost (min)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left")


def timeline_figure(results: dict[str, SimulationResult], title: str | None = None) -> Any:
    """Throughput over time (top) and the time lost against failure-free training (bottom)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 7))
    top, bottom = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    draw_timeline(top, results, title)
    top.set_xlabel("")
    draw_lost_time(bottom, results)
    figure.tight_layout()
    return figure


def plot_timeline(results: dict[str, SimulationResult], path: str | Path, title: str | None = None,
                  force: bool = False) -> Path:
    """Write timeline_figure under the output rule (never over an existing file without `force`)."""
    from chameleon_opt.output import save_figure

    return save_figure(timeline_figure(results, title), Path(path), "--plot", force)


__all__ = ["PUBLISHED_RATES", "Segment", "SimulationResult", "TraceEvent", "TransitionRecord", "draw_timeline",
           "fixed_trace", "load_trace", "parse_trace", "plot_timeline", "published_mtbf_hours_per_device",
           "published_rate_trace", "simulate", "simulate_policies", "synthetic_trace", "trace_from_instance",
           "timeline_figure", "trace_to_json", "with_failure_rate"]
