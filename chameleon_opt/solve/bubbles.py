"""Bubble-filling rerouting: a failed stage's micro-batches run on its peers inside the idle time
of their pipeline schedules, as ReCycle (SOSP'24) does, posed as a CP-SAT scheduling model.

Why a schedule model: Eq. 12/13 charges rerouted work serially after the peer's own 1F1B
schedule, but a 1F1B stage idles during fill and drain, and with the backward split into its
input-gradient part B (which the previous stage waits for) and its weight-gradient part W (which
nobody waits for; Zero Bubble pipeline parallelism, Qi et al. 2024), W can be deferred into
those idle periods. ReCycle's adaptive pipelining routes each rerouted micro-batch from the
failed pipeline's previous stage to a peer and back to the failed pipeline's next stage.

Model (one data-parallel group of identical pipelines; times in integer ticks, CP-SAT takes
integers only: every duration is rounded up to ticks of `makespan / TICKS`, so the returned
makespan (re-timed in seconds from the solver's orders) is exact, and the solver's bound, less
one tick per operation, is a valid bound in seconds):
    ops F[j,k,s], B[j,k,s], W[j,k,s] for pipeline j, micro-batch k, stage s, on device (j,s),
    or, when (j,s) failed, on the device (h,s) of one live peer h (x[j,k,h] = 1, optional
    intervals, whole micro-batches);
    F[s] -> F[s+1];  F[S-1] -> B[S-1];  B[s+1] -> B[s];  B[s] -> W[s]  (end before start);
    no two ops overlap on a device;
    a device holds a micro-batch's activations from its F start to its W end (B's end when the
    backward is not split), at most
    `in_flight[j][s]` at once (its memory: cumulative);
    minimise the makespan (the step's pipeline part; the all-reduce and optimizer follow).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from chameleon_opt.errors import InfeasibleError
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.perf.reroute import even_reroute
from chameleon_opt.plan import Plan, Reroute
from chameleon_opt.solve.backends import DEFAULT, SolverOptions, Stall, cpsat_start_s, heuristic, solve_cpsat
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.result import SolveResult, Status

BUILD_S_PER_OP = 1e-4
"""Building the schedule model, per operation (intervals, precedences, activation rows), measured
at 1,000-2,500 operations on a 2-core machine; checked against the deadline before building."""
MIN_SOLVE_S = 0.05
"""Least time CP-SAT is given once its model is built."""
TICKS = 200_000
"""Ticks in the serial schedule's makespan: rounding adds at most one tick per operation."""

Op = tuple[str, int, int, int]  # (kind F/B/W, pipeline, micro-batch, stage)
Slot = tuple[int, int]           # (pipeline, stage): one device (TP group)


@dataclass(frozen=True)
class BubbleProblem:
    """One DP group: identical pipelines, per-stage op times (blocking sends included)."""

    forward_s: tuple[float, ...]
    backward_input_s: tuple[float, ...]
    backward_weight_s: tuple[float, ...]
    micro_batches: tuple[int, ...]                 # per pipeline
    failed: frozenset[Slot]
    in_flight: tuple[tuple[int, ...], ...] | None = None  # per pipeline, per stage; None: unbounded

    @property
    def stages(self) -> int:
        return len(self.forward_s)

    def limit(self, slot: Slot) -> int:
        if self.in_flight is None:
            return sum(self.micro_batches)
        return self.in_flight[slot[0]][slot[1]]

    def duration(self, op: Op) -> float:
        kind, _, _, s = op
        return {"F": self.forward_s, "B": self.backward_input_s, "W": self.backward_weight_s}[kind][s]

    @property
    def kinds(self) -> str:
        """"FBW" with a split backward, "FB" when the weight-gradient part is not separate."""
        return "FBW" if any(t > 0 for t in self.backward_weight_s) else "FB"

    @property
    def release(self) -> str:
        """The op whose end frees a micro-batch's activations."""
        return self.kinds[-1]

    def ops(self) -> list[Op]:
        return [(kind, j, k, s) for j, m in enumerate(self.micro_batches) for k in range(m)
                for s in range(self.stages) for kind in self.kinds]

    def peers(self, stage: int) -> list[int]:
        return [h for h in range(len(self.micro_batches)) if (h, stage) not in self.failed]


@dataclass(frozen=True)
class BubbleSchedule:
    """Every device's operation order, where each rerouted micro-batch ran, and the makespan."""

    makespan_s: float
    orders: dict[Slot, tuple[Op, ...]]
    hosts: dict[tuple[int, int, int], int]  # (pipeline, micro-batch, stage) -> peer pipeline

    def action_lists(self) -> dict[Slot, list[str]]:
        """Per device, torch pipelining's notation: `{stage}{F|B|W}{micro-batch}`, with the
        owning pipeline prefixed for rerouted work (`p1:2F0`)."""
        return {slot: [(f"p{j}:" if j != slot[0] else "") + f"{s}{kind}{k}" for kind, j, k, s in ops]
                for slot, ops in self.orders.items()}


def _predecessors(problem: BubbleProblem, op: Op) -> list[Op]:
    kind, j, k, s = op
    if kind == "F":
        return [("F", j, k, s - 1)] if s > 0 else []
    if kind == "B":
        return [("F", j, k, s)] + ([("B", j, k, s + 1)] if s + 1 < problem.stages else [])
    return [("B", j, k, s)]


def device_of(op: Op, hosts: dict[tuple[int, int, int], int]) -> Slot:
    _, j, k, s = op
    return (hosts.get((j, k, s), j), s)


def retime(problem: BubbleProblem, orders: dict[Slot, tuple[Op, ...]]) -> tuple[float, dict[Op, float]] | None:
    """Earliest start times in seconds for given device orders (None on a dependency cycle or
    when a device would hold more activations than its limit)."""
    position = {slot: 0 for slot in orders}
    clock = {slot: 0.0 for slot in orders}
    end: dict[Op, float] = {}
    start: dict[Op, float] = {}
    remaining = sum(len(ops) for ops in orders.values())
    while remaining:
        progressed = False
        for slot, ops in orders.items():
            while position[slot] < len(ops):
                op = ops[position[slot]]
                preds = _predecessors(problem, op)
                if any(p not in end for p in preds):
                    break
                begin = max([clock[slot]] + [end[p] for p in preds])
                start[op], end[op] = begin, begin + problem.duration(op)
                clock[slot] = end[op]
                position[slot] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            return None
    for slot, ops in orders.items():
        held = sorted([(start[op], 1) for op in ops if op[0] == "F"]
                      + [(end[op], -1) for op in ops if op[0] == problem.release], key=lambda e: (e[0], e[1]))
        level = 0
        for _, change in held:
            level += change
            if level > problem.limit(slot):
                return None
    return max(end.values(), default=0.0), start


def one_f_one_b_orders(problem: BubbleProblem, hosts: dict[tuple[int, int, int], int],
                       interleave: bool = True) -> dict[Slot, tuple[Op, ...]]:
    """Serial schedules: every live device runs 1F1B (W right after B) over its own micro-batches
    and the rerouted ones it hosts, either interleaved by micro-batch index (`interleave`) or
    with the hosted ones after its own (Eq. 12/13's accounting, which can deadlock when two
    pipelines host each other's stages)."""
    stages = problem.stages
    work: dict[Slot, list[tuple[int, int]]] = {}
    for j, m in enumerate(problem.micro_batches):
        for s in range(stages):
            if (j, s) not in problem.failed:
                work[(j, s)] = [(j, k) for k in range(m)]
    hosted: dict[Slot, list[tuple[int, int]]] = {}
    for (j, k, s), h in sorted(hosts.items()):
        hosted.setdefault((h, s), []).append((j, k))
    orders: dict[Slot, tuple[Op, ...]] = {}
    back = [kind for kind in problem.kinds if kind != "F"]
    for (h, s), own in work.items():
        extra = hosted.get((h, s), [])
        batches = sorted(own + extra, key=lambda jk: (jk[1], jk[0] != h)) if interleave else own + extra
        segments = [batches] if interleave else [own, extra]
        seq: list[Op] = []
        for part in segments:
            warmup = min(stages - s - 1, len(part))
            seq += [("F", j, k, s) for j, k in part[:warmup]]
            for i in range(len(part) - warmup):
                j, k = part[warmup + i]
                bj, bk = part[i]
                seq += [("F", j, k, s)] + [(kind, bj, bk, s) for kind in back]
            for bj, bk in part[len(part) - warmup:]:
                seq += [(kind, bj, bk, s) for kind in back]
        orders[(h, s)] = tuple(seq)
    return orders


def even_hosts(problem: BubbleProblem) -> dict[tuple[int, int, int], int]:
    """Whole micro-batches of each failed slot dealt round-robin to its stage's live peers."""
    hosts = {}
    for j, s in sorted(problem.failed):
        peers = problem.peers(s)
        if not peers:
            raise ValueError(f"stage {s} lost every replica: nothing to reroute to")
        for k in range(problem.micro_batches[j]):
            hosts[(j, k, s)] = peers[k % len(peers)]
    return hosts


def serial_schedule(problem: BubbleProblem) -> BubbleSchedule:
    """Eq. 12/13's step with whole micro-batches: rerouted work after the peer's own."""
    hosts = even_hosts(problem)
    timed = []
    for interleave in (False, True):
        orders = one_f_one_b_orders(problem, hosts, interleave)
        found = retime(problem, orders)
        if found is not None:
            timed.append((found[0], orders))
    if not timed:
        raise ValueError("no serial 1F1B order of the rerouted work is deadlock-free within the activation limits")
    makespan, orders = min(timed, key=lambda item: item[0])
    return BubbleSchedule(makespan, orders, hosts)


def _successors(problem: BubbleProblem, op: Op) -> list[Op]:
    """The ops whose `_predecessors` include `op`."""
    kind, j, k, s = op
    if kind == "F":
        return ([("F", j, k, s + 1)] if s + 1 < problem.stages else []) + [("B", j, k, s)]
    if kind == "B":
        return ([("B", j, k, s - 1)] if s > 0 else []) + ([("W", j, k, s)] if problem.kinds == "FBW" else [])
    return []


def list_schedule(problem: BubbleProblem, deadline: Deadline | None = None) -> BubbleSchedule | None:
    """A greedy list schedule of the even hosts' work (None when it deadlocks within the
    activation limits, or when `deadline` passes first): time advances to the next op any device
    can start; a device runs a ready B first (the previous stage waits for it), then a ready F
    while its activations fit, then a W (nobody waits for it: Zero Bubble's filler). It lands
    near the optimum where the serial 1F1B orders do not (paper-example losing devices 1 and 3:
    37.0 s, the serial 53.5 s, CP-SAT's best in 5 s 37.0 s), so a schedule search stopped early
    falls back on most of the gain. Each device's next choice is kept until its queue, clock or
    memory changes (only the device that ran and those that gained a ready op), so a step costs
    one scan of the devices, not of every ready op (a 264-device campaign instance: 0.9 s -> ms)."""
    hosts = even_hosts(problem)
    waiting: dict[Op, int] = {}
    ready: dict[Slot, dict[Op, float]] = {}
    for op in problem.ops():
        waiting[op] = len(_predecessors(problem, op))
        ready.setdefault(device_of(op, hosts), {})
        if waiting[op] == 0:
            ready[device_of(op, hosts)][op] = 0.0
    free = {slot: 0.0 for slot in ready}
    held = {slot: 0 for slot in ready}
    orders: dict[Slot, list[Op]] = {slot: [] for slot in ready}
    ends: dict[Op, float] = {}
    rank = {"B": 0, "F": 1, "W": 2}

    def choose(slot: Slot) -> tuple[tuple[float, int, Slot], Op] | None:
        """The slot's next op and its (start, rank, slot) key, None while nothing it may run is ready."""
        fits = held[slot] < problem.limit(slot)
        usable = [(at, op) for op, at in ready[slot].items() if op[0] != "F" or fits]
        if not usable:
            return None
        start = max(free[slot], min(at for at, _ in usable))
        op = min((op for at, op in usable if at <= start), key=lambda o: (rank[o[0]], o[2], o[1] != slot[0], o[1]))
        return (start, rank[op[0]], slot), op

    choices = {slot: choose(slot) for slot in ready}
    for step in range(len(waiting)):
        if deadline is not None and step % 256 == 255 and deadline.expired():
            return None
        best = min((c for c in choices.values() if c is not None), key=lambda c: c[0], default=None)
        if best is None:
            return None  # every device with work left waits on a full activation memory
        (start, _, slot), op = best
        del ready[slot][op]
        orders[slot].append(op)
        ends[op] = free[slot] = start + problem.duration(op)
        held[slot] += (op[0] == "F") - (op[0] == problem.release)
        changed = {slot}
        for after in _successors(problem, op):
            waiting[after] -= 1
            if waiting[after] == 0:
                host = device_of(after, hosts)
                ready[host][after] = max(ends[p] for p in _predecessors(problem, after))
                changed.add(host)
        for host in changed:
            choices[host] = choose(host)
    frozen = {slot: tuple(ops) for slot, ops in orders.items()}
    timed = retime(problem, frozen)
    return None if timed is None else BubbleSchedule(timed[0], frozen, hosts)


def solve_bubbles(problem: BubbleProblem, deadline: Deadline, options: SolverOptions = DEFAULT,
                  stall: Stall | None = None) -> SolveResult[BubbleSchedule]:
    """The fastest schedule of one DP group with its failed slots' work rerouted into the peers'
    idle time (see the module docstring), by `deadline`. The better of the serial and the greedy
    list schedule (`list_schedule`) is the fallback, the serial one CP-SAT's hint; with `stall`
    CP-SAT also stops once its incumbent stops improving (`backends.Stall`). Status and bound
    are CP-SAT's, converted to seconds."""
    start_clock = time.perf_counter()
    for _, s in problem.failed:
        if not problem.peers(s):
            raise ValueError(f"stage {s} lost every replica: nothing to reroute to")
    try:  # the hint: CP-SAT's search from the serial orders proved the small cases optimal in 10-30 ms,
        hint: BubbleSchedule | None = serial_schedule(problem)  # from the list schedule's it did not
    except ValueError:
        hint = None
    greedy = list_schedule(problem, deadline)
    # None: CP-SAT may still find an order, with nothing to fall back on if it does not
    fallback = min((found for found in (hint, greedy) if found is not None), key=lambda found: found.makespan_s,
                   default=None)
    how = "serial (Eq. 12/13)" if fallback is hint else "greedy list"
    building = len(problem.ops()) * BUILD_S_PER_OP + cpsat_start_s()
    if fallback is not None and deadline.left() < building + MIN_SOLVE_S:  # checked before anything is built
        result = heuristic(fallback, fallback.makespan_s, "constructive", f"no time to build the schedule model of "
                           f"{len(problem.ops())} operations (about {building:.2f} s, {deadline.left():.2f} s left): "
                           f"the {how} schedule", 0.0, time.perf_counter() - start_clock, options.seed)
        return dataclasses.replace(result, stopped_early=True)
    # the tick from the serial makespan as before the list schedule: a finer one (from the list's)
    # turned runtime-cpu-6's 20 ms proof of optimality into 4-5 s
    scale = next((found.makespan_s for found in (hint, fallback) if found is not None),
                 sum(problem.duration(op) for op in problem.ops()))
    tick = scale / TICKS if scale > 0 else 1.0
    ticks = {kind: [math.ceil(t / tick) for t in times] for kind, times in
             (("F", problem.forward_s), ("B", problem.backward_input_s), ("W", problem.backward_weight_s))}
    horizon = sum(ticks[op[0]][op[3]] for op in problem.ops()) + 1
    from ortools.sat.python import cp_model  # here: 0.3 s to import (pandas), inside the deadline

    model = cp_model.CpModel()
    starts: dict[Op, cp_model.IntVar] = {}
    ends: dict[Op, cp_model.IntVar] = {}
    per_device: dict[Slot, list] = {}
    activations: dict[Slot, list] = {}
    choice: dict[tuple[int, int, int, int], cp_model.IntVar] = {}
    for op in problem.ops():
        kind, j, k, s = op
        length = ticks[kind][s]
        starts[op] = model.new_int_var(0, horizon, f"start_{kind}{j}_{k}_{s}")
        ends[op] = model.new_int_var(0, horizon, f"end_{kind}{j}_{k}_{s}")
        if (j, s) not in problem.failed:
            interval = model.new_interval_var(starts[op], length, ends[op], f"op_{kind}{j}_{k}_{s}")
            per_device.setdefault((j, s), []).append(interval)
            continue
        model.add(ends[op] == starts[op] + length)
        for h in problem.peers(s):
            if (j, k, s, h) not in choice:
                choice[(j, k, s, h)] = model.new_bool_var(f"host_{j}_{k}_{s}_{h}")
            per_device.setdefault((h, s), []).append(model.new_optional_interval_var(
                starts[op], length, ends[op], choice[(j, k, s, h)], f"op_{kind}{j}_{k}_{s}_on_{h}"))
    for (j, s) in problem.failed:
        for k in range(problem.micro_batches[j]):
            model.add_exactly_one(choice[(j, k, s, h)] for h in problem.peers(s))
    for op in problem.ops():
        for pred in _predecessors(problem, op):
            model.add(starts[op] >= ends[pred])
    for op in problem.ops():  # activations held from F's start to W's end
        kind, j, k, s = op
        if kind != "F":
            continue
        w = (problem.release, j, k, s)
        size = model.new_int_var(0, horizon, f"held_{j}_{k}_{s}")
        model.add(size == ends[w] - starts[op])
        if (j, s) not in problem.failed:
            activations.setdefault((j, s), []).append(
                model.new_interval_var(starts[op], size, ends[w], f"held_{j}_{k}_{s}_iv"))
        else:
            for h in problem.peers(s):
                activations.setdefault((h, s), []).append(model.new_optional_interval_var(
                    starts[op], size, ends[w], choice[(j, k, s, h)], f"held_{j}_{k}_{s}_on_{h}"))
    for slot, intervals in per_device.items():
        model.add_no_overlap(intervals)
    if problem.in_flight is not None:
        for slot, intervals in activations.items():
            model.add_cumulative(intervals, [1] * len(intervals), problem.limit(slot))
    makespan = model.new_int_var(0, horizon, "makespan")
    model.add_max_equality(makespan, list(ends.values()))
    model.minimize(makespan)
    serial_start = retime(problem, hint.orders) if hint is not None else None
    if serial_start is not None:  # the serial schedule as a hint (its rounded times stay feasible only
        for op, begin in serial_start[1].items():  # approximately: CP-SAT repairs it)
            model.add_hint(starts[op], math.ceil(begin / tick))
        for (j, k, s), h in hint.hosts.items():
            for peer in problem.peers(s):
                model.add_hint(choice[(j, k, s, peer)], peer == h)
    build_s = time.perf_counter() - start_clock
    solver, outcome = solve_cpsat(model, max(deadline.left(), MIN_SOLVE_S), options, stall=stall)
    wall = outcome.wall_s
    operations = len(problem.ops())
    if not outcome.has_solution:
        if outcome.status is Status.INFEASIBLE:
            return SolveResult(Status.INFEASIBLE, None, None, None, wall, "cpsat", build_s, options.seed,
                               "no schedule keeps every device within its activation limit")
        if fallback is None:
            return SolveResult(Status.NO_SOLUTION, None, None, None, wall, "cpsat", build_s, options.seed,
                               "CP-SAT found no schedule in time and neither constructive order exists")
        return heuristic(fallback, fallback.makespan_s, "constructive", f"CP-SAT found no better schedule in time "
                         f"({outcome.detail}): the {how} schedule", wall, build_s, options.seed)
    hosts = {(j, k, s): h for (j, k, s, h), var in choice.items() if solver.value(var)}
    placed: dict[Slot, list[Op]] = {}
    for op in problem.ops():  # one pass: per device in a second one was O(devices x operations)
        placed.setdefault(device_of(op, hosts), []).append(op)
    orders = {slot: tuple(sorted(mine, key=lambda op: (solver.value(starts[op]), "FBW".index(op[0]))))
              for slot, mine in placed.items()}
    timed = retime(problem, orders)
    schedule = BubbleSchedule(timed[0], orders, hosts) if timed is not None else fallback
    if schedule is None:
        return SolveResult(Status.NO_SOLUTION, None, None, None, wall, "cpsat", build_s, options.seed,
                           "the solver's order could not be re-timed")
    if fallback is not None and schedule.makespan_s > fallback.makespan_s:
        schedule = fallback
    bound = min(max(outcome.bound - operations, 0) * tick, schedule.makespan_s)
    status = outcome.status
    gap_note = f"ticks of {tick:.3g} s; the bound allows one tick of rounding per operation"
    stalled = "; CP-SAT stopped: no improvement" if outcome.detail.endswith("(stopped: no improvement)") else ""
    return SolveResult(status, schedule, schedule.makespan_s, bound, wall, "cpsat", build_s, options.seed,
                       f"{len(hosts)} rerouted micro-batch stages placed into idle time; {gap_note}{stalled}")


MAX_BUBBLE_OPS = 2_500
"""Above this many operations the schedule model is not built: the step is taken from the
ReCycle-optimistic floor instead (see `rerouted_step`)."""
BUBBLE_SHARE = 0.5
"""Most of the time left that a rerouting's schedule model may take: the constructive schedule
is already an answer, and a decision under `--policy reroute` otherwise gave CP-SAT all of it
whenever it could not prove optimality (4.5 s of 5 s, the kill campaign's worst recovery)."""
BUBBLE_STALL = Stall(least_s=0.25, ratio=1.0)
"""When a rerouting's schedule search stops improving (`backends.Stall`). On the bundled
instances the greedy list schedule reaches CP-SAT's best of 5 s in all measured cases but one
(runtime-cpu-6 losing device 3: 0.7% longer), and CP-SAT's own improvements mostly come within
0.1 s or after seconds; the steps before and after are in docs/design.md. Not applied on a
deterministic run (a wall-clock rule)."""
WEIGHT_SHARE = 0.5
"""Share of a stage's backward that is the weight gradient (W): for a linear layer dX and dW are
one forward GEMM each (Zero Bubble, Qi et al. 2024), so half; the attention core is all dX."""


def problem_for(model: PerfModel, layout: Plan, dead: frozenset[int]) -> BubbleProblem | None:
    """The DP group as a BubbleProblem: None unless every pipeline has the same stages and split
    (ReCycle keeps the uniform layout it started with)."""
    shapes = {tuple((st.first, st.end) for st in p.stages) for p in layout.pipelines}
    if len(shapes) != 1:
        return None
    costs = model.stage_costs(layout, 0, [0.0] * len(layout.pipelines[0].stages))
    failed = frozenset(model.failed_slots(layout, dead))
    replicas = max(len(layout.pipelines) - 1, 1)
    stages = len(costs)
    limits = []
    for j, pipe in enumerate(layout.pipelines):
        row = []
        for s, stage in enumerate(pipe.stages):
            layer = model.layer_costs(stage.devices, replicas=replicas)
            act = float(layer.activation_bytes[stage.first:stage.end].sum())
            room = layer.capacity_bytes - layer.transient_bytes - float(layer.static_bytes[stage.first:stage.end].sum())
            # Capped at every micro-batch of the job: more can never be in flight, and an uncapped
            # count (a device of 1e12 GiB) overflows CP-SAT's int64 capacity argument.
            everything = sum(p.micro_batches for p in layout.pipelines)
            most = min(int(room // act), everything) if act > 0 and math.isfinite(room / act) else everything
            row.append(max(most, min(stages - s, pipe.micro_batches)))
        limits.append(tuple(row))
    return BubbleProblem(tuple(c.op_forward_s for c in costs),
                         tuple(c.backward_s * (1 - WEIGHT_SHARE) + c.send_backward_s for c in costs),
                         tuple(c.backward_s * WEIGHT_SHARE for c in costs),
                         tuple(p.micro_batches for p in layout.pipelines), failed, tuple(limits))


def optimistic_floor(problem: BubbleProblem, failure_free_s: float) -> float:
    """A lower bound on any bubble-filled schedule (so, at scale, ReCycle is never undersold): a
    peer of a failed stage s cannot finish before micro-batch 0 reaches it, its own and its
    hosted work run, and the last backward travels back: sum_{i<s} w_i + (m + e) w_s."""
    floor = failure_free_s
    work = [f + b + w for f, b, w in zip(problem.forward_s, problem.backward_input_s, problem.backward_weight_s)]
    for s in sorted({s for _, s in problem.failed}):
        owed = sum(problem.micro_batches[j] for j, t in problem.failed if t == s)
        peers = problem.peers(s)
        if not peers:
            return math.inf
        hosted = math.ceil(owed / len(peers))
        own = max(problem.micro_batches[h] for h in peers)
        floor = max(floor, sum(work[:s]) + (own + hosted) * work[s])
    return floor


def whole_reroutes(layout: Plan, hosts: dict[tuple[int, int, int], int]) -> Plan:
    """The layout with each failed slot's micro-batches given whole to the peers that host them,
    as runs of consecutive micro-batches in micro-batch order: the lowering cuts a failed slot's
    work from the front in the order of its entries (comm/lowering.py `stage_work`), so micro-batch
    k of the pipeline lands on exactly the peer the schedule placed it on."""
    runs: list[Reroute] = []
    for (j, k, s), h in sorted(hosts.items(), key=lambda item: (item[0][0], item[0][2], item[0][1])):
        last = runs[-1] if runs else None
        if last is not None and (last.from_pipeline, last.stage, last.to_pipeline) == (j, s, h):
            runs[-1] = Reroute(j, s, h, last.micro_batches + 1.0)
        else:
            runs.append(Reroute(j, s, h, 1.0))
    return Plan(layout.tensor_parallel, layout.pipelines, tuple(runs))


@dataclass(frozen=True)
class ReroutedStep:
    """A rerouting's priced step: its time, how it was found, the plan, and the schedule it was
    priced at (None when priced by Eq. 12/13's serial shares or the optimistic floor, which no
    runtime can follow op by op)."""

    step_s: float
    how: str
    plan: Plan
    schedule: BubbleSchedule | None = None


def rerouted_step(model: PerfModel, layout: Plan, dead: frozenset[int], deadline: Deadline,
                  options: SolverOptions = DEFAULT, floor_ok: bool = True) -> ReroutedStep:
    """The step of the layout with the failed slots' whole micro-batches filled into the
    peers' idle time: the schedule model's makespan plus the gradient all-reduce and optimizer
    step. Beyond MAX_BUBBLE_OPS the schedule is not built: with `floor_ok` the optimistic floor
    is returned (for a baseline, so that it is never undersold), else the serial step. Raises
    InfeasibleError when a stage lost every replica."""
    rerouted = even_reroute(layout, dead)
    estimate = model.evaluate(rerouted, dead)
    sync = estimate.data_parallel_s + estimate.optimizer_s
    problem = problem_for(model, layout, dead)
    if problem is None:
        return ReroutedStep(estimate.iteration_time_s, "serial (Eq. 12/13): the layout is not uniform", rerouted)
    try:
        whole = whole_reroutes(layout, even_hosts(problem))
    except ValueError as error:
        raise InfeasibleError(str(error)) from None
    if len(problem.ops()) > MAX_BUBBLE_OPS:
        if not floor_ok:
            return ReroutedStep(estimate.iteration_time_s,
                                "serial (Eq. 12/13): too many operations for the schedule model", rerouted)
        failure_free = model.evaluate(layout).iteration_time_s - sync
        return ReroutedStep(optimistic_floor(problem, failure_free) + sync, (
            f"bubble-filled floor ({len(problem.ops())} operations exceed the schedule model's "
            f"{MAX_BUBBLE_OPS}: the least step any bubble filling could reach)"), whole)
    try:
        result = solve_bubbles(problem, deadline.share(BUBBLE_SHARE), options, BUBBLE_STALL)
    except ValueError as error:
        return ReroutedStep(estimate.iteration_time_s, f"serial (Eq. 12/13): {error}", rerouted)
    if result.solution is None:
        return ReroutedStep(estimate.iteration_time_s, f"serial (Eq. 12/13): {result.reason}", rerouted)
    return ReroutedStep(result.objective + sync, f"bubble-filled schedule ({result.status.value}, CP-SAT)",
                        whole_reroutes(layout, result.solution.hosts), result.solution)
