"""A lower bound on the exact step time (PerfModel.evaluate) of every plan in the search space,
cheap enough for 16,384 devices. The scale path reports it as its bound; it never relies on the
surrogates the templates use.

Step = max_j T_j + DP + OPT, and each term is bounded from below on its own:

- Pipeline j (S stages, m micro-batches, op durations f_s, b_s with blocking sends, W = sum of
  all of them). In 1F1B order stage s runs k_s = S - s - 1 warm-up forwards, then F_k before
  B_0; B_0 cannot start before micro-batch 0 went down and back up (the whole of W except this
  stage's own b_s and the forwards above it), after B_0 the stage still owes m backwards and
  m - k_s - 1 forwards, and B_{m-1} must travel back to stage 0. Hence, for every stage,
      T_j >= W + (m - 1) b_s + max(m - 1 - k_s, 0) f_s >= W + w_s (m - 1 - k_s rho),
  with rho a forward share of the layers' compute and f_s <= rho w_s + (1 - rho) x the slowest
  send (the forward op carries it) + the forward time of layers whose share exceeds rho. Minimising the largest right-hand side over continuous splits
  (sum w_s = W) gives T_j >= W + (W - sum_s e_s / c_s) / sum_s 1 / c_s with c_s = m - 1 - k_s rho and
  e_s = k_s ((1 - rho) send_max + excess) (no term when some c_s <= 0),
  and the bottleneck gives T_j >= m W0 / S. With whole layers (`splittable`), each stage also
  bounds the round trip through it: T_j >= W + R_s + (m - S + s)(f_s + b_s), R_s the work below
  stage s (a path of the 1F1B graph), which stops early stages from taking many more layers than
  the schedule lets them hide. Per-layer costs are the cheapest over the device
  types present and the fastest of the supported memory reliefs, sends the cheapest boundary on
  the faster link; S is at least the stages the memory floor needs (`memory_floor`).
- Pipelines: n_S pipelines of S stages with sum n_S = P and sum S n_S <= G groups can run at most
  P x (concave envelope of cap_S(T) at G / P) micro-batches by T, where cap_S(T) is the largest m
  the bound above allows (a fractional relaxation of the pipeline counts).
- DP and OPT: the shortest pipeline has S <= G / P stages, so some stage holds at least
  max(total / S, largest layer) gradient bytes and optimizer time; its ring over P replicas on the
  fastest link is a floor on the all-reduce (bucket latencies only add).
The bound is min over P of T_LB(P) + DP_LB(P) + OPT_LB(P), found on a geometric grid of T (each
P's T_LB rounded down to a grid point) and refined by bisection for the P's that attain it; then
raised with whole-layer caps for every stage count that shapes the envelope (`_integer_value`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from chameleon_opt.perf.comm import Link, ring_allgather_time, ring_allreduce_time
from chameleon_opt.perf.memory import in_flight_micro_batches
from chameleon_opt.perf.model import GIB, PerfModel
from chameleon_opt.solve.deadline import Deadline

GRID_POINTS = 1500
REFINE_STEPS = 40
REFINED_PIPELINE_COUNTS = 12
INTEGER_REACH = 0.1      # the whole-layer makespan is searched within 10% above the continuous one
INTEGER_PRECISION = 1e-5  # relative; the floors are searched from below, so they stay valid
INTEGER_STEP = 1e-3       # relative grid step for the sync floor's fall with the makespan (then sharpened)
SHARPEN_PRECISION = 1e-8  # relative: where the bound is decided, the grid's loss is cut to this


def live_types(model: PerfModel, groups: list[tuple[int, ...]], live: list[int] | None) -> dict[str, tuple[int, ...]]:
    """A TP-sized group of one device per device type among the survivors (`live`, else the groups'
    members): every type may head a TP group, whatever grouping the survivor list shows. Read from
    the instance's per-device types, not the model's per-group memo (131,072 lookups: 0.3 s)."""
    tp = len(groups[0]) if groups else 1
    types = model.instance.device_types
    first: dict[str, int] = {}
    for d in (live if live is not None else [d for g in groups for d in g]):
        first.setdefault(types[d].name, d)
    return {name: (d,) * tp for name, d in first.items()}


@dataclass(frozen=True)
class MemoryFloor:
    """The fewest stages any pipeline of the space needs to hold the model (None: no plan fits, and
    `reason` is the proof)."""

    stages: int | None
    reason: str


class MemoryRelaxation:
    """Stage memory relaxed so that it never exceeds PerfModel.stage_memory_breakdown's, for any
    device type, relief and replica count a plan can have: every stage gets the largest memory of
    any live device type less its smallest fixed terms (framework, buffers without a gradient
    bucket, one replica's backward working set); its layers their smallest state (ZeRO-sharded
    over the most replicas possible, the optimizer offloaded where supported) and the least
    activations any supported relief keeps for the micro-batches 1F1B holds in flight there
    (perf.memory.in_flight_micro_batches, at most two under activation offload)."""

    def __init__(self, model: PerfModel, groups: list[tuple[int, ...]], total: int,
                 live: list[int] | None = None) -> None:
        self.layers, self.groups, self.total = model.workload.num_layers, len(groups), total
        self.virtual = model.options.virtual_stages or 1
        representatives = live_types(model, groups, live)
        most = max(min(len(groups), total), 1)
        self.static = np.full(self.layers, np.inf)
        activations: dict[str, np.ndarray] = {}  # per activation mode: bytes of one micro-batch per layer
        self.budget = -np.inf
        for group in representatives.values():
            device_bytes = model.stage_device(group).memory_gib * GIB
            for relief in model.relief_options:
                sharded = model.layer_costs(group, replicas=most, relief=relief)
                alone = model.layer_costs(group, replicas=1, relief=relief)
                mode = model.relief_of(relief)[0]
                self.static = np.minimum(self.static, sharded.static_bytes)
                held = alone.activation_bytes
                if self.virtual > 1 and model.workload.architecture is not None:
                    # Interleaved, the head's logits are held for fewer micro-batches than the
                    # stage's other activations (perf.memory.head_in_flight_micro_batches): leave
                    # them out, so the relaxation stays below the model's need.
                    held = held.copy()
                    held[-1] -= model.head_logit_bytes(len(group))
                activations[mode] = np.minimum(activations.get(mode, np.inf), held)
                self.budget = max(self.budget, device_bytes - alone.stage_constant_bytes - alone.transient_bytes)
        self.static_prefix = np.concatenate([[0.0], np.cumsum(self.static)]).tolist()
        self.activation_prefix = {mode: np.concatenate([[0.0], np.cumsum(a)]).tolist()
                                  for mode, a in activations.items()}
        self._capacities: dict[int, float] = {}

    def need(self, first: int, end: int, in_flight: float) -> float:
        """Relaxed bytes of a stage holding layers [first, end) with `in_flight` micro-batches."""
        static = self.static_prefix[end] - self.static_prefix[first]
        return static + min((min(in_flight, 2.0) if mode == "offload" else in_flight) * (prefix[end] - prefix[first])
                            for mode, prefix in self.activation_prefix.items())

    def needs(self, first: np.ndarray, end: np.ndarray, in_flight: float) -> np.ndarray:
        """`need` of many stages at once (layer ranges [first, end), one in-flight count)."""
        static = np.asarray(self.static_prefix)
        least = np.full(np.shape(first), np.inf)
        for mode, prefix in self.activation_prefix.items():
            held = np.asarray(prefix)
            kept = min(in_flight, 2.0) if mode == "offload" else in_flight
            least = np.minimum(least, kept * (held[end] - held[first]))
        return static[end] - static[first] + least

    def fits(self, stages: int, micro_batches: int) -> bool:
        """Whether some contiguous split into `stages` stages fits with `micro_batches` per pipeline.
        Greedy is exact: in-flight counts never grow along the pipeline, so later stages are never
        tighter, and reaching as far as possible at each stage is optimal."""
        position = 0
        for s in range(stages):
            room = self.layers - (stages - s - 1)  # every later stage needs a layer
            in_flight = in_flight_micro_batches(s, stages, micro_batches, 0.0, self.virtual)
            end = position
            while end < room and self.need(position, end + 1, in_flight) <= self.budget:
                end += 1
            if end == position:
                return False
            position = end
        return position == self.layers

    def capacity(self, stages: int) -> float:
        """Most micro-batches one pipeline of `stages` stages can run within memory (inf: any number,
        since past `stages` x virtual micro-batches no stage holds more in flight); cached."""
        if stages not in self._capacities:
            self._capacities[stages] = self._capacity(stages)
        return self._capacities[stages]

    def _capacity(self, stages: int) -> float:
        top = stages * self.virtual
        if self.fits(stages, top):
            return math.inf
        low, high = 0, top  # fits(low) (0: vacuous), not fits(high); fitting only shrinks as m grows
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.fits(stages, middle) else (low, middle)
        return float(low)


def memory_floor(model: PerfModel, groups: list[tuple[int, ...]], total: int,
                 live: list[int] | None = None) -> MemoryFloor:
    """A proof that no plan fits in memory, or the fewest stages a pipeline needs (see
    MemoryRelaxation, valid under every relief and replica count). Proofs, in order: a layer fits
    on no device even alone; no pipeline of at most min(layers, groups) stages fits; the pipelines
    that fit, however many micro-batches each may run (an unbounded knapsack over their stage
    counts with the surviving TP groups, device types relaxed), cannot run the whole batch."""
    if not groups:
        return MemoryFloor(None, "no surviving TP group: every node lost too many devices for one TP group")
    relaxed = MemoryRelaxation(model, groups, total, live)
    budget = relaxed.budget
    for layer in range(relaxed.layers):
        need = relaxed.need(layer, layer + 1, 1.0)
        if need > budget:
            return MemoryFloor(None, f"layer {layer} alone needs {need / GIB:.3g} GiB per device (its state and one "
                                     f"micro-batch's activations under the lightest relief) and no survivor has more "
                                     f"than {max(budget, 0.0) / GIB:.3g} GiB free after the framework and buffers")
    longest = min(relaxed.layers, len(groups))
    shortest = next((s for s in range(1, longest + 1) if relaxed.fits(s, 1)), None)
    if shortest is None:
        return MemoryFloor(None, f"no pipeline of up to {longest} stages fits even one micro-batch in memory (at most "
                                 f"{budget / GIB:.3g} GiB free per device)")
    caps = {s: relaxed.capacity(s) for s in range(shortest, longest + 1)}
    if all(math.isfinite(c) for c in caps.values()):
        best = [0.0] * (len(groups) + 1)  # best[g]: most micro-batches g groups can run (unbounded knapsack)
        for g in range(1, len(groups) + 1):
            best[g] = max([best[g - 1]] + [best[g - s] + c for s, c in caps.items() if s <= g])
        if best[-1] < total:
            return MemoryFloor(None, f"the pipelines that fit in memory can run at most {best[-1]:.0f} of the {total} "
                                     f"micro-batches on the {len(groups)} surviving TP groups (fewer micro-batches in "
                                     "flight is what lets them fit)")
    return MemoryFloor(shortest, f"at least {shortest} stages per pipeline")


class RelaxationBound:
    """The bound's tables for one set of survivors (group count, device types present)."""

    def __init__(self, model: PerfModel, groups: list[tuple[int, ...]], total: int,
                 live: list[int] | None = None) -> None:
        """`live`: the surviving devices; every device type among them may head a TP group (a
        group's type is its slowest member's), whatever grouping the survivor list shows."""
        self.model, self.total, self.groups = model, total, len(groups)
        layers = model.workload.num_layers
        tp = len(groups[0]) if groups else 1
        representatives = live_types(model, groups, live)
        forward = np.full(layers, np.inf)
        backward = np.full(layers, np.inf)
        update = np.full(layers, np.inf)
        # Every supported relief is open to every stage: per layer its fastest times and step and its
        # smallest static state. Offload is timed as keeping its activations (the copy only lengthens
        # an op, and per-layer maxima with the copy would over-state a stage's).
        timed = {"none" if model.relief_of(r)[0] == "offload" else model.relief_of(r)[0] for r in model.relief_options}
        for group in representatives.values():
            for layer in range(layers):
                for mode in timed:
                    f, b, _, _ = model.stage_times(group, layer, layer + 1, mode)
                    forward[layer] = min(forward[layer], f)
                    backward[layer] = min(backward[layer], b)
                for relief in model.relief_options:
                    update[layer] = min(update[layer], model.optimizer_time(group, layer, layer + 1, relief))
        self.layer_work = float((forward + backward).sum()) if groups else 0.0
        self.layers = layers
        self.forward_prefix = np.concatenate([[0.0], np.cumsum(forward)]).tolist() if groups else [0.0]
        self.backward_prefix = np.concatenate([[0.0], np.cumsum(backward)]).tolist() if groups else [0.0]
        self.memory = MemoryRelaxation(model, groups, total, live) if groups else None
        self._integer_caps: dict[int, dict[float, int]] = {}  # stage count -> makespan -> whole-layer cap
        self._continuous: tuple[float, float, np.ndarray] | None = None  # (bound, start, counts) once finished
        self._deadline = Deadline.never()
        per_node: dict[int, int] = {}
        for group in groups:
            per_node[model.instance.node_of(group[0])] = per_node.get(model.instance.node_of(group[0]), 0) + 1
        self.most_per_node = max(per_node.values(), default=0)
        fastest = model.intra if self.most_per_node >= 2 else model.inter  # consecutive stages share a node?
        boundary = model.workload.boundary_bytes_per_sample[:max(layers - 1, 0)] * model.micro_batch_size
        self.send = min((min(fastest.send_time(float(n)), model.inter.send_time(float(n))) + model.p2p_overhead_s
                         if n > 0 else 0.0 for n in boundary), default=0.0)
        self.send_max = max((max(model.intra.send_time(float(n)), model.inter.send_time(float(n)))
                             + model.p2p_overhead_s if n > 0 else 0.0 for n in boundary), default=0.0)
        ratios = forward / np.maximum(forward + backward, 1e-300)
        # Two valid (rho, excess) pairs, the better table is kept: the largest forward share of any
        # layer; or the blocks' largest share with the other layers' forward above it as excess.
        typical = float(ratios[1:-1].max(initial=0.0)) if layers > 2 else float(ratios.max(initial=0.0))
        self.shares = [(float(min(ratios.max(initial=0.0), 1.0)), 0.0),
                       (typical, float(np.maximum(forward - typical * (forward + backward), 0.0).sum()))]
        self.longest = min(layers, len(groups))
        floor = memory_floor(model, groups, total, live)
        self.shortest = floor.stages if floor.stages is not None else self.longest + 1
        grad = model.workload.params * model.grad_bytes / tp
        self.grad, self.update = grad.tolist(), update.tolist()
        self._largest_parts: dict[tuple[int, int], float] = {}
        self.interleaved = (model.options.virtual_stages or 1) > 1
        self.overlapped = bool(model.options.overlap_grad_reduce)
        self.table = np.ascontiguousarray(self._pipeline_table())
        # for bisect: a cap per row without numpy's per-call cost, and no copy (lists of the rows took
        # 64 MiB at 131,072 devices: 128 x 16,384 floats)
        self.rows = [memoryview(row) for row in self.table]

    def ring_link(self, pipelines: int) -> Link:
        """The fastest link a ring over `pipelines` replicas can use: NVLink only if one node holds
        them all; the cheaper of each parameter otherwise (alpha-beta links need not be ordered)."""
        if pipelines <= self.most_per_node:
            intra, inter = self.model.intra, self.model.inter
            return Link(max(intra.bandwidth, inter.bandwidth), min(intra.latency, inter.latency))
        return self.model.inter

    def _pipeline_table(self) -> np.ndarray:
        table = np.maximum(*(self._pipeline_table_for(rho, excess) for rho, excess in self.shares))
        return np.maximum.accumulate(table, axis=1)

    def _pipeline_table_for(self, rho: float, excess: float) -> np.ndarray:
        """table[S - 1, m - 1]: the lower bound on one pipeline's 1F1B time (inf where S cannot hold
        the model's static state). Rows are non-decreasing in m."""
        stages = np.arange(1, self.longest + 1, dtype=float)
        micro = np.arange(1, self.total + 1, dtype=float)
        warmup = np.arange(self.longest, dtype=float)
        factors = micro[:, None] - 1 - warmup[None, :] * rho  # c_k = m - 1 - k rho, [m, k]
        positive = factors > 0
        inverse = np.where(positive, 1.0 / np.where(positive, factors, 1.0), 0.0)
        harmonic = np.cumsum(inverse, axis=1)                       # sum_k 1 / c_k, [m, S]
        # A forward op also carries its send: f_s <= rho (w_s - sends) + send_f <= rho w_s + (1 - rho) send_max.
        slack = np.cumsum(inverse * warmup[None, :] * ((1 - rho) * self.send_max + excess), axis=1)
        usable = np.cumprod(positive, axis=1).astype(bool)          # every k < S has a positive factor
        work = self.layer_work + 2 * (stages - 1) * self.send       # W for each S
        share = np.maximum(work[None, :] - slack, 0.0) / np.where(usable, harmonic, 1.0)
        order_bound = work[None, :] + np.where(usable, share, 0.0)
        bottleneck = micro[:, None] * self.layer_work / stages[None, :]
        # Interleaved 1F1B runs another operation order: only the busiest device's work holds.
        table = (bottleneck if self.interleaved else np.maximum(order_bound, bottleneck)).T  # [S, m]
        table[: self.shortest - 1, :] = np.inf
        return table

    def sync_floor(self, pipelines: int, shortest: int | None = None) -> float:
        """DP_LB + OPT_LB for plans of `pipelines` pipelines (non-decreasing in it) whose shortest
        pipeline has at most `shortest` stages (it has at most groups / pipelines anyway)."""
        shortest = max(min(self.groups // pipelines, shortest or self.groups, self.layers), 1)
        grad = self._largest_part(0, shortest)
        # overlapped with the backward only an exposed part (>= 0) is left; under ZeRO-3 shards reduce among
        # fewer copies (no floor kept); under overlap_param_gather only the reduce-scatter half is charged
        reduce = ring_allgather_time if self.model.overlap_param_gather else ring_allreduce_time
        dp = reduce(grad, pipelines, self.ring_link(pipelines)) \
            if pipelines > 1 and not self.overlapped and self.model.zero_stage < 3 else 0.0
        return dp + self._largest_part(1, shortest) / self.model.optimizer_shards(pipelines)  # P replicas a layer

    def _largest_part(self, which: int, parts: int) -> float:
        """A floor on the largest part when the layers' gradient bytes (`which` 0) or optimizer
        times (1) are cut into `parts` contiguous stages: some stage of a pipeline that short holds
        that much (at least total / parts and the largest layer; whole layers make it more: 4
        layers on 2 stages cannot split 1:3 evenly). Bisection on the greedy cut, from below."""
        key = (which, parts)
        if key not in self._largest_parts:
            values = self.grad if which == 0 else self.update
            low = max(sum(values) / parts, max(values, default=0.0)) * (1 - 1e-12)  # infeasible or tight
            high = sum(values)

            def cuts_into(cap: float) -> bool:  # whether `parts` stages of at most `cap` hold every layer
                used, load = 1, 0.0
                for v in values:
                    if load + v > cap:
                        used, load = used + 1, v
                    else:
                        load += v
                return used <= parts

            if cuts_into(low):
                high = low
            while high - low > 1e-9 * high:
                middle = (low + high) / 2
                low, high = (low, middle) if cuts_into(middle) else (middle, high)
            self._largest_parts[key] = low
        return self._largest_parts[key]

    def _coverage(self, makespan: float, counts: np.ndarray) -> np.ndarray:
        """Most micro-batches P pipelines (for each P in `counts`) can run by `makespan`."""
        caps = [float(bisect_right(row, makespan)) for row in self.rows]
        mean_length = np.minimum(self.groups / counts, self.longest)
        return counts * _envelope(caps, mean_length)

    def splittable(self, stages: int, micro_batches: int, makespan: float) -> bool:
        """Whether some split into `stages` whole-layer stages meets the per-stage bounds by `makespan`,
        for every stage s (each layer at its fastest; every op but the first stage's backward and
        the last stage's forward carries a send, at the cheapest boundary's cost):
        - W + (m - 1) b_s + max(m - 1 - k_s, 0) f_s <= makespan and m (f_s + b_s) <= makespan;
        - the round trip through s (s < S - 1, c_s = m - S + s >= 1): micro-batch 0 goes down and
          back up to s, s runs its c_s steady pairs B_0, F_{k_s + 1}, ..., B_{c_s - 1}, F_{m-1}, then
          F_{m-1} goes down and B_{m-1} all the way up, a path of the 1F1B graph of length
              W + R_s + c_s (f_s + b_s) <= makespan,  R_s = the work of the stages below s.
          (The per-stage bound alone let early stages take many more layers: at 16,384 devices
          (16 stages, 17 micro-batches) it allowed 17.86 s where the best split found takes 18.52.)
        Greedy is exact: every condition holds for [p, e) when it holds for [q, e) with q <= p (the
        round trip's R_s depends only on e), so by induction the greedy's stage ends are never
        before a feasible split's, and each condition is monotone in e for the search."""
        work = self.layer_work + 2 * (stages - 1) * self.send  # W
        budget = makespan - work
        if budget < 0:
            return False
        f, b, m, send = self.forward_prefix, self.backward_prefix, micro_batches, self.send
        position, length = 0, 1
        s = weight = trips = 0
        sent_back = sent_on = ring = 0.0

        def fits(end: int) -> bool:
            backward = b[end] - b[position] + sent_back
            forward = f[end] - f[position] + sent_on
            if (m - 1) * backward + weight * forward > budget or m * (backward + forward) > makespan:
                return False
            # the round trip through stage s: the work below it, R_s = W - (work of stages 0..s)
            below = work - (f[end] + b[end] + ring)
            return trips < 1 or below + trips * (backward + forward) <= budget

        last, layers = stages - 1, self.layers
        for s in range(stages):  # (no min / max calls: this loop runs ~450,000 times for a 16,384-device bound)
            trips = m - stages + s if s < last else 0  # steady-state pairs before F_{m-1} (round trip)
            weight = m - stages + s if m - stages + s > 0 else 0  # forwards after B_0: m - 1 - k_s
            room = layers - last + s  # every later stage needs a layer
            sent_back, sent_on = (send if s > 0 else 0.0), (send if s < last else 0.0)  # each op's blocking send
            ring = (2 * s + 1) * send
            # The last end that fits, first tried at the previous stage's length (splits are near even),
            # then galloping up or bisecting down: the same end as any search, as fits only falls with it.
            guess = position + length if position + length < room else room
            if fits(guess):
                low, step = guess, 1
                while low + step <= room and fits(low + step):
                    low, step = low + step, step * 2
                high = low + step - 1 if low + step - 1 < room else room  # the last end that fits is in [low, high]
            elif guess == position + 1 or not fits(position + 1):
                return False
            else:
                low, high = position + 1, guess - 1
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) if fits(middle) else (low, middle - 1)
            length, position = low - position, low
        return position == self.layers

    def integer_cap(self, stages: int, makespan: float, upper: int) -> int:
        """Most micro-batches (at most `upper`, the continuous table's) one pipeline of `stages`
        whole-layer stages can run by `makespan` within `splittable`'s conditions and memory. The
        caps already found for this stage count bracket it (a cap only grows with the makespan),
        so the search is among the few micro-batch counts between them, often none."""
        known = self._integer_caps.setdefault(stages, {})
        if makespan in known:
            return known[makespan]
        if self._deadline.expired():
            raise _OutOfTime
        below = [cap for at, cap in known.items() if at <= makespan]
        above = [cap for at, cap in known.items() if at >= makespan]
        low = max(below, default=0)  # splittable at low (0: vacuous)
        high = min(above + [upper, int(min(self.memory.capacity(stages), upper))])  # none above high
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if self.splittable(stages, middle, makespan) else (low, middle - 1)
        known[makespan] = low
        return low

    def integer_caps(self, makespan: float, everywhere: bool = False) -> list[float]:
        """Caps by `makespan` of every stage count, whole-layer (`integer_cap`) wherever it can shape
        the envelope: the continuous caps bound them from above, so a stage count whose continuous
        point lies under the envelope of the others cannot raise it and keeps its continuous cap
        (the envelope then still bounds the whole-layer one from above). Whole-layer caps are
        computed for the envelope's vertices until they all are. (Only near each pipeline count's
        mean length, as before, left one continuous vertex elsewhere: at 16,384 devices 11
        micro-batches on 10 stages where whole layers allow 10, covering the batch 1.2 s early.)
        `everywhere`: whole-layer caps for every stage count (envelopes of subsets need them)."""
        caps = [float(bisect_right(row, makespan)) for row in self.rows]
        exact = [s < self.shortest for s in range(1, len(caps) + 1)]
        if everywhere:
            for s in range(max(self.shortest, 1), self.longest + 1):
                caps[s - 1] = float(self.integer_cap(s, makespan, int(caps[s - 1])))
            return caps
        while True:
            todo = [s for s in _vertices(caps) if not exact[s - 1]]
            if not todo:
                return caps
            for s in todo:
                caps[s - 1] = float(self.integer_cap(s, makespan, int(caps[s - 1])))
                exact[s - 1] = True

    def _covering(self, makespan: float, counts: np.ndarray) -> int | None:
        """The fewest pipelines (of `counts`, ascending) that can cover the batch by `makespan` with
        whole-layer caps; None when none can (the deadline may raise _OutOfTime)."""
        mean = np.minimum(self.groups / counts, self.longest)
        covered = counts * _envelope(self.integer_caps(makespan), mean) >= self.total - 1e-9
        return int(counts[np.argmax(covered)]) if covered.any() else None

    def _least_sync(self, makespan: float, counts: np.ndarray) -> float | None:
        """The least sync floor of any cover of the batch by `makespan` with whole-layer caps (None:
        no pipeline count covers). A plan whose shortest pipeline has K stages uses only stage
        counts >= K, and one of its stages holds 1 / K of the gradients: for each pipeline count P,
        K can be at most the largest K whose restricted envelope still covers (coverage only falls
        as K grows). Without this, mixing a few short pipelines (3 stages, 4 micro-batches) into
        long ones covered the batch early while the sync floor assumed stages of 1 / 23 of the model."""
        caps = self.integer_caps(makespan, everywhere=True)
        mean = np.minimum(self.groups / counts, self.longest)
        largest = np.zeros(len(counts), dtype=int)  # per count: the largest K that still covers (0: none)
        for k in range(max(self.shortest, 1), self.longest + 1):
            restricted = [0.0] * (k - 1) + caps[k - 1:]
            covered = counts * _envelope(restricted, mean) >= self.total - 1e-9
            if not covered.any():
                break
            largest[covered] = k
        if not largest.any():
            return None
        # the floor only grows with the pipeline count for one K: the fewest pipelines of each K suffice
        fewest = {int(k): int(p) for p, k in zip(counts[::-1], largest[::-1]) if k > 0}
        return min(self.sync_floor(p, k) for k, p in fewest.items())

    def _integer_value(self, low: float, counts: np.ndarray, deadline: Deadline) -> float:
        """The bound with whole-layer caps: min over makespans T of T + S(T), S(T) the least sync
        floor of a cover by T (`_least_sync`; non-increasing in T, as coverage only grows with T).
        T1, the least T any pipeline count covers by, is found by bisection from `low` (no pipeline
        is faster; where nothing covers by it, up to INTEGER_REACH above). Then on the grid
        T_i = T_0 (1 + STEP)^i from T_0 = the last makespan shown too short (within
        INTEGER_PRECISION of T1), a makespan in [T_i, T_{i+1}) costs at least T_i + S(T_{i+1}),
        until T_i + S(best) (S only falls) reaches the best; the decisive segments are then
        sharpened. Past `deadline`, the last makespan shown too short plus the least sync floor
        (still a bound; the caller keeps the continuous one when higher)."""
        least_sync = self.sync_floor(int(counts[0]))
        try:
            if self._covering(low, counts) is None:  # else `low` (the pipeline floor) is where the walk starts
                high = low * (1 + INTEGER_REACH)
                if self._covering(high, counts) is None:
                    return high + least_sync
                while high - low > INTEGER_PRECISION * high:
                    middle = (low + high) / 2
                    low, high = (low, middle) if self._covering(middle, counts) is not None else (middle, high)
        except _OutOfTime:
            return low + least_sync  # `low` was shown too short for every pipeline count
        best, makespan = math.inf, low  # every plan's makespan is at least `low`
        floor = least_sync  # S(T) >= S(best) for T < best: raised as best falls
        segments: list[tuple[float, float, float, float]] = []  # (floor, T_i, T_{i+1}, S(T_{i+1}))
        try:
            while makespan + floor < best:
                following = makespan * (1 + INTEGER_STEP)
                sync = self._least_sync(following, counts)
                sync = least_sync if sync is None else sync
                segments.append((makespan + sync, makespan, following, sync))
                if makespan + sync < best:
                    best = makespan + sync
                    floor = max(floor, self._least_sync(best, counts) or least_sync)
                makespan = following
        except _OutOfTime:
            return min(best, makespan + least_sync)  # every segment walked so far, and beyond
        # Sharpen the grid's loss (up to STEP) where the bound is decided: each segment's floor is
        # raised by bisection on where S steps down (`_sharpened`), in order, while one is lowest.
        tail = makespan + floor
        sharpened = tail
        try:
            for value, start, end, sync in sorted(segments):
                if value >= sharpened:
                    break
                sharpened = min(sharpened, self._sharpened(start, end, sync, counts, sharpened))
        except _OutOfTime:
            return best
        return sharpened

    def _sharpened(self, start: float, end: float, end_sync: float, counts: np.ndarray, cap: float) -> float:
        """min of T + S(T) over [start, end) from below, given S(end) = `end_sync` (S non-increasing),
        to SHARPEN_PRECISION: where S(start) is already S(end), start + S(end); else both halves.
        Halves that cannot go below `cap` are not split."""
        least = self._least_sync(start, counts)
        if (least is not None and least <= end_sync) or end - start <= SHARPEN_PRECISION * end or \
                start + end_sync >= cap:
            return start + end_sync
        middle = (start + end) / 2
        middle_sync = self._least_sync(middle, counts)
        low_half = self._sharpened(start, middle, middle_sync, counts, cap) if middle_sync is not None else math.inf
        return min(low_half, self._sharpened(middle, end, end_sync, counts, min(cap, low_half)))

    def value(self, deadline: Deadline = Deadline.never()) -> float:
        """The bound in seconds (inf when no plan can exist). Past `deadline` (the grid and
        refinement take 0.3-0.4 s at 1,024 and more devices) it stops with a weaker
        bound that still holds: coverage only grows with the makespan, so a pipeline count that has
        not covered the batch by the last grid point checked needs longer than that point. Called
        again after such a stop, it resumes: the finished grid, refinement and whole-layer caps are kept."""
        if not self.groups or self.shortest > self.longest:
            return math.inf
        if self._continuous is not None:  # resumed: the grid and its refinement finished before
            continuous, start, counts = self._continuous
        else:
            # every pipeline needs at least `shortest` stages (the memory floor): no more than G / shortest of them
            counts = np.arange(1, min(self.groups // self.shortest, self.total) + 1, dtype=float)
            floors = np.array([self.sync_floor(int(p)) for p in counts])
            finite = self.table[np.isfinite(self.table)]
            if finite.size == 0:
                return math.inf
            low, high = float(finite.min()), float(finite.max())
            grid = np.geomspace(max(low, 1e-12), high * (1 + 1e-12), GRID_POINTS) if high > low else np.array([high])
            reached, below = self._first_covering(grid, counts, deadline)
            if (below >= -1).any():  # stopped by the deadline: each open count covers only past its last miss
                unknown = np.where(below >= 0, grid[np.maximum(below, 0)], np.where(below == -1, 0.0, np.inf))
                known = np.where(reached > 0, grid[np.maximum(reached - 1, 0)], np.where(reached == 0, 0.0, np.inf))
                return float((np.minimum(unknown, known) + floors).min())
            ok = reached >= 0
            if not ok.any():
                return math.inf
            floor_time = np.where(ok, np.where(reached > 0, grid[np.maximum(reached - 1, 0)], 0.0), np.inf)
            coarse = floor_time + floors
            refined = True
            for index in np.argsort(coarse)[:REFINED_PIPELINE_COUNTS]:
                if not ok[index]:
                    continue
                p = counts[index:index + 1]
                lo = float(floor_time[index])
                hi = float(grid[reached[index]])
                for _ in range(REFINE_STEPS):
                    if deadline.expired():
                        refined = False
                        break  # lo still holds
                    middle = (lo + hi) / 2
                    lo, hi = (lo, middle) if self._coverage(middle, p)[0] >= self.total - 1e-9 else (middle, hi)
                coarse[index] = lo + floors[index]
            continuous = float(coarse.min())
            # Whole layers start from the least makespan any count covers by, or the least pipeline
            # floor (no pipeline runs faster) when one covers at once
            start, counts = max(float(floor_time[ok].min()), low), counts[ok]
            if refined:
                self._continuous = (continuous, start, counts)
        if self.interleaved or self.memory is None:
            return continuous
        self._deadline = deadline  # whole layers: 0.3-3 s at 16,384 devices
        return max(continuous, self._integer_value(start, counts, deadline))

    def _first_covering(self, grid: np.ndarray, counts: np.ndarray, deadline: Deadline) -> tuple[np.ndarray, np.ndarray]:
        """Per pipeline count, the first grid point by which it covers the batch (-1: not even by the
        last), found by bisection shared among the counts (coverage only grows with the makespan, so
        this is the first point a scan would find: ~100 probes where the scan took ~700 at 16,384
        devices). Second array: for a count left open by `deadline`, its last grid point shown too
        short (-1: none), else -2."""
        reached = np.full(counts.shape, -1)
        below = np.full(counts.shape, -2)
        if deadline.expired():
            below[:] = -1
            return reached, below
        covered = self._coverage(grid[-1], counts) >= self.total - 1e-9
        open_ = [(0, len(grid) - 1, np.flatnonzero(covered))]  # (lo, hi, members): first point in [lo, hi]
        while open_:
            lo, hi, members = open_.pop()
            if members.size == 0:
                continue
            if lo == hi:
                reached[members] = lo
                continue
            if deadline.expired():
                below[members] = lo - 1
                for lo, _, members in open_:
                    below[members] = lo - 1
                return reached, below
            middle = (lo + hi) // 2
            covered = self._coverage(grid[middle], counts[members]) >= self.total - 1e-9
            open_.append((middle + 1, hi, members[~covered]))
            open_.append((lo, middle, members[covered]))
        return reached, below


class _OutOfTime(Exception):
    """The whole-layer refinement reached its deadline inside a makespan's test."""


def _hull(caps: list[float]) -> tuple[list[float], list[float]]:
    """The upper concave hull of (0, 0) and (stages, micro-batches by the makespan) for every stage
    count (monotone chain), as its abscissas and ordinates (plain lists and locals: 1,600 hulls of
    129 points a 16,384-device bound)."""
    xs, ys = [0.0], [0.0]
    for s, y in enumerate(caps):
        x = float(s + 1)
        while len(xs) >= 2:
            x0, y0, x1, y1 = xs[-2], ys[-2], xs[-1], ys[-1]
            if (x1 - x0) * (y - y0) - (y1 - y0) * (x - x0) < 0:
                break
            xs.pop()
            ys.pop()
        xs.append(x)
        ys.append(y)
    return xs, ys


def _vertices(caps: list[float]) -> list[int]:
    """Stage counts at the vertices of `_envelope`'s hull, up to its highest point."""
    xs, ys = _hull(caps)
    top = ys.index(max(ys))  # the first highest
    return [int(x) for x in xs[1:top + 1]]


def _envelope(caps: list[float], mean_length: np.ndarray | float) -> np.ndarray | float:
    """The upper concave envelope of (stages, micro-batches by the makespan) through (0, 0), read at
    `mean_length`: the most micro-batches per pipeline when pipeline lengths may be mixed freely
    (the fractional relaxation of the pipeline counts)."""
    xs, ys = _hull(caps)
    return np.interp(mean_length, xs, np.maximum.accumulate(ys))


def relaxation_bound(model: PerfModel, groups: list[tuple[int, ...]], total: int,
                     live: list[int] | None = None, deadline: Deadline = Deadline.never()) -> float:
    """min over pipeline counts of the pipeline, all-reduce and optimizer floors (see above);
    weaker but valid when `deadline` stops it (`RelaxationBound.value`)."""
    return RelaxationBound(model, groups, total, live).value(deadline)
