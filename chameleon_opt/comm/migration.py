"""State migration: which surviving replica sends which bytes of every missing shard, and when.

Fluid model (an LP, solved by HiGHS; CBC through PuLP as the fallback): x[n, s] bytes of need n
(one receiver's missing layers of one segment) come from holder s, over the intra-node link
(NVLink, bw_intra) when s and the receiver share a node, else over the network (bw_inter), so an
intra-node copy costs a fraction of the time. Each device has one send port and one receive port
(full duplex), used one transfer at a time, exactly as in the rounds the schedule is cut into, so
the LP's makespan is a lower bound of the round-based one:
    sum_s x[n, s] = bytes(n)                                   every shard delivered exactly
    sum_{n, s sends} x[n, s] / bw(s, dst n) <= M               send port of every source s
    sum_{n of d, s} x[n, s] / bw(s, d) <= M                    receive port of every receiver d
    minimise M + eps x sum x / bw                               (eps: prefer fast links on ties)
Bytes are in GB inside the LP (coefficients near 1 keep the simplex well conditioned) and are
rounded back to whole bytes per need by largest remainder, so every shard sums exactly.

Large instances: every need may have a hundred holders; beyond FULL_VARIABLES candidate pairs each
need keeps its intra-node holders and the K least-loaded inter-node holders (greedy by expected
load), and the result is no longer proven optimal for the full problem (status FEASIBLE; the bound
is the solver-independent lower bound).

The fluid schedule is then cut into rounds (rounds.py): one edge per transfer of a bipartite
multigraph, coloured with exactly max-degree colours (Koenig), so no device sends or receives twice
in a round; the executable makespan is the sum over rounds of the slowest transfer.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from chameleon_opt.comm.rounds import colour_rounds, release_schedule
from chameleon_opt.comm.state import (ABANDON_NEEDS, Need, missing_state, moved_pairs_at_least, tensor_bytes,
                                      tensor_name)
from chameleon_opt.comm.transfers import Migration, Transfer
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.solve.backends import DEFAULT, SolverOptions, new_highs, run_highs, solve_pulp
from chameleon_opt.solve.deadline import Deadline, DeadlinePassed
from chameleon_opt.solve.result import SolveResult, Status

GB = 1e9                 # LP unit: bytes -> GB
FULL_VARIABLES = 60_000  # candidate (need, holder) pairs solved without restriction
INTER_CANDIDATES = 6     # inter-node holders kept per need when restricted
DROP_FRACTION = 1e-6     # LP shares below this fraction of a need are folded into its largest share
MIN_SOLVE_S = 0.02       # less time left than this: no LP is started
HIGHS_S_PER_COLUMN = 6e-6  # HiGHS's presolve before it first reads its clock: 0.3 s at 50,000 columns (measured)
CBC_MIN_S = 0.5          # PuLP's CBC writes the model to a file and starts a process: not for less
CBC_S_PER_COLUMN = 80e-6  # PuLP's build + CBC's LP, which its time limit does not stop: 7.2 s at 91,440 columns (measured)
FINISH_S_PER_TRANSFER = 2e-5  # listing, cutting, colouring, checking: 4-5 us a transfer, +2 us its release check
                               # (1,024-16,384, quiet); re-sharding 65,408 shards at 131,072 devices took 17 s for
                               # 523,264 (26 us each past the listing, 2 cores under a load of 5): 8 us let it start
                               # with 10 s left
INTRA, INTER = 0, 1


class _Sides:
    """Each need's holders split into those on the receiver's node and the rest (numpy, cached per
    holder tuple: thousands of needs share a few hundred tuples)."""

    def __init__(self, model: PerfModel, needs: list[Need]) -> None:
        per_node = model.instance.devices_per_node  # node = device // devices per node (Instance.node_of)
        cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.local: list[np.ndarray] = []
        self.remote: list[np.ndarray] = []
        for n in needs:
            key = id(n.holders)
            if key not in cache:
                devices = np.array(n.holders, dtype=np.int64)
                cache[key] = (devices, devices // per_node)
            devices, nodes = cache[key]
            here = nodes == n.dst // per_node
            self.local.append(devices[here])
            self.remote.append(devices[~here])


def lower_bound_s(model: PerfModel, needs: list[Need], sides: _Sides | None = None) -> float:
    """Solver-independent bound: what some device must receive, or send as the only holder.

    A receiver gets its shards one after another, each at best over the fastest link any of its
    holders offers (intra-node when one sits on its node); a sole holder must send each of its
    shards itself, over the link to each receiver."""
    sides = sides or _Sides(model, needs)
    intra, inter = model.intra.bandwidth, model.inter.bandwidth
    recv: dict[int, float] = {}
    sole: dict[int, float] = {}
    for i, n in enumerate(needs):
        if n.nbytes <= 0:
            continue
        local, remote = len(sides.local[i]) > 0, len(sides.remote[i]) > 0
        fastest = max(intra if local else 0.0, inter if remote else 0.0)
        recv[n.dst] = recv.get(n.dst, 0.0) + n.nbytes / fastest
        if len(n.holders) == 1:
            s = n.holders[0]
            sole[s] = sole.get(s, 0.0) + n.nbytes / fastest
    return max(max(recv.values(), default=0.0), max(sole.values(), default=0.0))


@dataclass
class _Model:
    """The LP's columns: candidate (need, source) pairs and their link kind."""

    need: np.ndarray
    source: np.ndarray
    kind: np.ndarray
    restricted: bool


def _candidates(needs: list[Need], sides: _Sides) -> _Model:
    """All holders of every need, or (when too many) its intra-node holders plus the K inter-node
    holders with least expected load, the load spread as if each need split evenly."""
    total = sum(len(n.holders) for n in needs)
    restricted = total > FULL_VARIABLES
    need_i: list[np.ndarray] = []
    source_i: list[np.ndarray] = []
    kind_i: list[np.ndarray] = []
    load: dict[int, float] = {}
    heaps: dict[int, list[tuple[float, int]]] = {}  # per holder tuple: (expected load, device)
    order = sorted(range(len(needs)), key=lambda i: -needs[i].nbytes) if restricted else range(len(needs))
    for i in order:
        n = needs[i]
        local, remote = sides.local[i], sides.remote[i]
        if restricted and len(remote) > INTER_CANDIDATES:
            heap = heaps.get(id(n.holders))
            if heap is None:
                heap = [(0.0, int(s)) for s in n.holders]
                heapq.heapify(heap)
                heaps[id(n.holders)] = heap
            mine = set(local.tolist())
            picked: list[int] = []
            skipped: list[tuple[float, int]] = []
            while len(picked) < INTER_CANDIDATES:
                current, s = heapq.heappop(heap)
                if current != load.get(s, 0.0):  # another tuple's need raised its load: re-queue
                    heapq.heappush(heap, (load.get(s, 0.0), s))
                elif s in mine:  # on the receiver's node: an intra-node candidate anyway
                    skipped.append((current, s))
                else:
                    picked.append(s)
            share = n.nbytes / INTER_CANDIDATES
            for s in picked:
                load[s] = load.get(s, 0.0) + share
                heapq.heappush(heap, (load[s], s))
            for entry in skipped:
                heapq.heappush(heap, entry)
            remote = np.array(picked, dtype=np.int64)
        need_i.append(np.full(len(local) + len(remote), i, dtype=np.int64))
        source_i += [local, remote]
        kind_i += [np.full(len(local), INTRA, dtype=np.int64), np.full(len(remote), INTER, dtype=np.int64)]
    if not need_i:
        empty = np.zeros(0, dtype=np.int64)
        return _Model(empty, empty, empty, restricted)
    return _Model(np.concatenate(need_i), np.concatenate(source_i).astype(np.int64), np.concatenate(kind_i),
                  restricted)


def _rows(model: PerfModel, needs: list[Need], m: _Model) -> tuple[np.ndarray, np.ndarray, int, int, np.ndarray]:
    """Capacity row of every column: (source, kind) send rows, then (receiver, kind) receive rows."""
    dst = np.array([n.dst for n in needs], dtype=np.int64)[m.need]
    send_key, recv_key = m.source, dst  # one port per device and direction (see the module docstring)
    send_ids, send_row = np.unique(send_key, return_inverse=True)
    recv_ids, recv_row = np.unique(recv_key, return_inverse=True)
    inv_bw = np.where(m.kind == INTRA, GB / model.intra.bandwidth, GB / model.inter.bandwidth)
    return send_row, recv_row + len(send_ids), len(send_ids), len(recv_ids), inv_bw


def _solve_highs(model: PerfModel, needs: list[Need], m: _Model, eps: float, time_limit_s: float,
                 options: SolverOptions) -> tuple[Status, np.ndarray | None, float | None, float, str]:
    """The LP by highspy's array interface (PuLP's row-by-row building is too slow at scale)."""
    import highspy

    send_row, recv_row, n_send, n_recv, inv_bw = _rows(model, needs, m)
    n_need, n_var = len(needs), len(m.need)
    n_rows = n_need + n_send + n_recv
    # columns: x (n_var), then M; rows: needs (== bytes), capacities (<= 0)
    starts = np.concatenate([np.arange(0, 3 * n_var + 1, 3), [3 * n_var + n_send + n_recv]]).astype(np.int32)
    index = np.empty(3 * n_var + n_send + n_recv, dtype=np.int32)
    value = np.empty_like(index, dtype=float)
    index[0:3 * n_var:3], value[0:3 * n_var:3] = m.need, 1.0
    index[1:3 * n_var:3], value[1:3 * n_var:3] = n_need + send_row, inv_bw
    index[2:3 * n_var:3], value[2:3 * n_var:3] = n_need + recv_row, inv_bw
    index[3 * n_var:] = np.arange(n_need, n_rows)
    value[3 * n_var:] = -1.0
    demand = np.array([n.nbytes / GB for n in needs])
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_var + 1, n_rows
    lp.col_cost_ = np.concatenate([eps * inv_bw, [1.0]])
    lp.col_lower_ = np.zeros(n_var + 1)
    lp.col_upper_ = np.full(n_var + 1, highspy.kHighsInf)
    lp.row_lower_ = np.concatenate([demand, np.full(n_send + n_recv, -highspy.kHighsInf)])
    lp.row_upper_ = np.concatenate([demand, np.zeros(n_send + n_recv)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = starts, index, value
    h, log = new_highs(time_limit_s, options, presolve="on", solver="simplex")
    h.passModel(lp)
    outcome = run_highs(h, log)
    if not outcome.has_solution:
        return Status.NO_SOLUTION, None, None, outcome.wall_s, "highs"
    values = np.asarray(h.getSolution().col_value)
    return outcome.status, values[:n_var] * GB, outcome.bound, outcome.wall_s, "highs"


def _solve_cbc(model: PerfModel, needs: list[Need], m: _Model, eps: float, time_limit_s: float,
               options: SolverOptions) -> tuple[Status, np.ndarray | None, float | None, float, str]:
    """The same LP through PuLP and CBC: the fallback when HiGHS gives nothing."""
    import pulp

    send_row, recv_row, n_send, n_recv, inv_bw = _rows(model, needs, m)
    prob = pulp.LpProblem("migration", pulp.LpMinimize)
    makespan = prob.add_variable("M", 0)
    x = [prob.add_variable(f"x{v}", 0) for v in range(len(m.need))]
    prob += makespan + pulp.lpSum(eps * float(inv_bw[v]) * x[v] for v in range(len(x)))
    by_need: list[list[int]] = [[] for _ in needs]
    by_cap: list[list[int]] = [[] for _ in range(n_send + n_recv)]
    for v in range(len(x)):
        by_need[m.need[v]].append(v)
        by_cap[send_row[v]].append(v)
        by_cap[recv_row[v]].append(v)
    for i, columns in enumerate(by_need):
        prob += pulp.lpSum(x[v] for v in columns) == needs[i].nbytes / GB
    for columns in by_cap:
        prob += pulp.lpSum(float(inv_bw[v]) * x[v] for v in columns) <= makespan
    outcome = solve_pulp(prob, time_limit_s, options, "cbc")
    if not outcome.has_solution:
        return Status.NO_SOLUTION, None, None, outcome.wall_s, "cbc"
    values = np.array([(v.value() or 0.0) for v in x]) * GB
    return outcome.status, values, outcome.bound, outcome.wall_s, "cbc"


def _greedy_split(model: PerfModel, needs: list[Need], m: _Model) -> np.ndarray:
    """Heuristic when no solver answers in time: each need whole from one candidate, largest needs
    first, to the candidate whose sending would end earliest (its send time so far plus this need
    over its link). One source per need keeps the transfers to one per layer: an even split over
    122 holders made 40,000 transfers whose cutting alone outlasted the deadline."""
    amounts = np.zeros(len(m.need))
    busy: dict[int, float] = {}
    inverse = {INTRA: 1.0 / model.intra.bandwidth, INTER: 1.0 / model.inter.bandwidth}
    starts = np.searchsorted(m.need, np.arange(len(needs) + 1))  # columns are grouped by need
    for i in sorted(range(len(needs)), key=lambda i: -needs[i].nbytes):
        columns = range(int(starts[i]), int(starts[i + 1]))
        if not columns:
            continue
        best = min(columns, key=lambda c: busy.get(int(m.source[c]), 0.0) + needs[i].nbytes * inverse[int(m.kind[c])])
        source = int(m.source[best])
        busy[source] = busy.get(source, 0.0) + needs[i].nbytes * inverse[int(m.kind[best])]
        amounts[best] = needs[i].nbytes
    return amounts


def _integer_shares(amounts: np.ndarray, total: int) -> np.ndarray:
    """Whole bytes summing exactly to `total`, proportional to `amounts` (largest remainder);
    shares below DROP_FRACTION of the total are folded into the others first."""
    amounts = np.maximum(amounts, 0.0)
    if amounts.sum() <= 0:
        amounts = np.ones_like(amounts)
    amounts = np.where(amounts < DROP_FRACTION * amounts.sum(), 0.0, amounts)
    scaled = amounts / amounts.sum() * total
    shares = np.floor(scaled).astype(np.int64)
    short = total - int(shares.sum())
    if short > 0:
        shares[np.argsort(-(scaled - shares), kind="stable")[:short]] += 1
    return shares


def _cut(need: Need, sources: list[int], shares: np.ndarray, sizes: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """A need's per-source byte shares cut along its layers (two pointers): each piece, as
    (source, receiver, bytes, layer, TP rank), carries part of one layer's shard from one source."""
    out: list[tuple[int, int, int, int, int]] = []
    wanted = [(layer, nbytes) for layer, nbytes in _layer_bytes(need, sizes) if nbytes > 0]
    li, left_in_layer = 0, wanted[0][1] if wanted else 0
    for s, share in zip(sources, shares):
        share = int(share)
        while share > 0 and li < len(wanted):
            piece = min(share, left_in_layer)
            out.append((s, need.dst, piece, wanted[li][0], need.rank))
            share -= piece
            left_in_layer -= piece
            if left_in_layer == 0:
                li += 1
                left_in_layer = wanted[li][1] if li < len(wanted) else 0
    return out


def _layer_bytes(need: Need, sizes: np.ndarray) -> list[tuple[int, int]]:
    """(layer, bytes wanted) of a need: its own per-layer bytes (a ZeRO shard's missing range, the
    replicated part of a sharded layer), else each layer's whole tensor."""
    if need.sizes is not None:
        return list(zip(need.layers, need.sizes))
    return [(layer, int(sizes[layer])) for layer in need.layers]


def transfer_time(model: PerfModel, t: Transfer) -> float:
    return model.link_between(t.src, t.dst).send_time(t.nbytes)


def _ports(model: PerfModel, transfers: list[Transfer] | tuple[Transfer, ...]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(sources, receivers, bytes, intra-node?) as arrays: at 1,024 devices a migration has
    ~28,000 transfers, and per-transfer Python calls to the link model cost 0.1-0.2 s a pass."""
    src = np.fromiter((t.src for t in transfers), dtype=np.int64, count=len(transfers))
    dst = np.fromiter((t.dst for t in transfers), dtype=np.int64, count=len(transfers))
    nbytes = np.fromiter((t.nbytes for t in transfers), dtype=float, count=len(transfers))
    per_node = model.instance.devices_per_node  # node = device // devices per node (Instance.node_of)
    return src, dst, nbytes, src // per_node == dst // per_node


def _times(model: PerfModel, nbytes: np.ndarray, intra: np.ndarray) -> np.ndarray:
    """`transfer_time` of every transfer, vectorised."""
    times = np.where(intra, model.intra.latency + nbytes / model.intra.bandwidth,
                     model.inter.latency + nbytes / model.inter.bandwidth)
    return np.where(nbytes > 0, times, 0.0)


def fluid_makespan(model: PerfModel, transfers: list[Transfer] | tuple[Transfer, ...]) -> float:
    """Busiest port (device and direction): the time its transfers take back to back, latency
    left out (the LP's measure)."""
    return _fluid(model, *_ports(model, transfers))


def _fluid(model: PerfModel, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, intra: np.ndarray) -> float:
    if not len(src):
        return 0.0
    seconds = nbytes / np.where(intra, model.intra.bandwidth, model.inter.bandwidth)
    sends = np.bincount(src, weights=seconds)
    receives = np.bincount(dst, weights=seconds)
    return float(max(sends.max(), receives.max()))


def async_makespan(times: np.ndarray, transfers: list[Transfer] | tuple[Transfer, ...]) -> float:
    """Rounds without barriers: a transfer starts once its sender has sent and its receiver has
    received everything of earlier rounds (send and receive ports are independent). `transfers`
    in round order, `times` their `transfer_time`s."""
    sent: dict[int, float] = {}
    received: dict[int, float] = {}
    for t, took in zip(transfers, times.tolist()):
        end = max(sent.get(t.src, 0.0), received.get(t.dst, 0.0)) + took
        sent[t.src] = received[t.dst] = end
    return max(sent.values(), default=0.0)


def too_many(pairs: int, receivers: int, abandon: Deadline) -> None:
    """Raise DeadlinePassed when at least `pairs` transfers to at least `receivers` devices (lower
    bounds: `moved_pairs_at_least`) cannot be cut before `abandon`: what `schedule_migration`
    would find once it had listed the shards (needs >= receivers, transfers >= pairs), found
    before the listing and, for a re-mapped plan, before the re-mapping."""
    if receivers >= ABANDON_NEEDS and abandon.left() < pairs * FINISH_S_PER_TRANSFER:
        raise DeadlinePassed(f"at least {pairs:,} transfers of the shards to move to {receivers:,} devices cannot be "
                             f"cut and scheduled in the {abandon.left():.2f} s left", pairs * FINISH_S_PER_TRANSFER,
                             abandon.left())


def schedule_migration(model: PerfModel, old: Plan, new: Plan, failed: frozenset[int], deadline: Deadline,
                       options: SolverOptions = DEFAULT, backend: str = "highs", *,
                       abandon: Deadline | None = None) -> Migration:
    """Transfers, sources and rounds that bring every device of `new` the shards it lacks.

    `deadline` bounds the LP (`backend` is tried first): CBC is tried after HiGHS only while
    its estimated build and solve fit (PuLP's CBC writes and reads files and its LP is not stopped
    by the time limit: CBC_S_PER_COLUMN, at least CBC_MIN_S), else the
    greedy split is used (each shard from one holder; HEURISTIC, `stopped_early`). `abandon` is the
    caller's own deadline (its whole decision's, past the LP's share): when at least ABANDON_NEEDS
    shards are to move and it passes before any transfer is cut, or leaves less than
    FINISH_S_PER_TRANSFER per transfer to come (at most one per candidate pair and layer boundary
    when a solver can start, one per layer of each shard when only the greedy split can), DeadlinePassed is raised
    instead (cutting, colouring and checking 15,000 shards' 138,000 transfers at 16,384 devices
    take about 1 s, and nothing valid exists before).
    Raises UnrecoverableError when a needed shard has no surviving holder."""
    start = time.perf_counter()
    seed = options.seed
    if abandon is not None:  # the same test from layer ranges before any shard is listed (moved_pairs_at_least)
        too_many(*moved_pairs_at_least(model, old, new, failed), abandon)
    needs = [n for n in missing_state(model, old, new, failed, abandon) if n.nbytes > 0]  # empty layers: no state
    abandon = abandon if len(needs) >= ABANDON_NEEDS else None
    at_least = sum(len(n.layers) for n in needs)  # transfers to come: one per layer of each shard, at least
    if abandon is not None and abandon.left() < at_least * FINISH_S_PER_TRANSFER:
        raise DeadlinePassed(f"at least {at_least} transfers of {len(needs)} shards to move cannot be cut and "
                             f"scheduled in the {abandon.left():.2f} s left", at_least * FINISH_S_PER_TRANSFER,
                             abandon.left())
    sizes = tensor_bytes(model, new.tensor_parallel)
    sides = _Sides(model, needs)
    bound = lower_bound_s(model, needs, sides)
    wanted: dict[tuple[int, int], int] = {}  # (receiver, layer) -> bytes: under ZeRO from several needs
    for n in needs:
        for layer, nbytes in _layer_bytes(n, sizes):
            if nbytes > 0:
                wanted[(n.dst, layer)] = wanted.get((n.dst, layer), 0) + nbytes
    if not needs:
        solve = SolveResult(Status.OPTIMAL, (), 0.0, 0.0, 0.0, "none", time.perf_counter() - start,
                            seed, "every device of the new plan already holds its state")
        return Migration(new, (), 0, 0.0, 0.0, 0.0, 0, (), release_schedule(old, new, failed, ()), solve, 0.0, wanted)
    m = _candidates(needs, sides)
    at_most = at_least + len(m.need) - len(needs)  # transfers to come, at most
    # What must follow any answer (cutting, colouring, checking) is kept back from the solvers' time,
    # so the schedule ends by the deadline. An LP's basic solution has at most one non-zero share per
    # row (needs + senders + receivers), so beyond one transfer per layer of each need it adds at most
    # one cut per capacity row.
    capacity_rows = len(np.unique(m.source)) + len({n.dst for n in needs})
    finish_s = min(at_most, at_least + capacity_rows) * FINISH_S_PER_TRANSFER
    order = [_solve_highs, _solve_cbc] if backend == "highs" else [_solve_cbc, _solve_highs]

    def start_up(solver: Callable[..., tuple]) -> float:
        return max(CBC_MIN_S, len(m.need) * CBC_S_PER_COLUMN) if solver is _solve_cbc else \
            max(MIN_SOLVE_S, len(m.need) * HIGHS_S_PER_COLUMN)

    # When no solver can start, the greedy split sends each shard from one holder: one transfer per
    # layer (at_least), not the LP's up to at_most.
    solvable = any(deadline.left() - finish_s >= start_up(solver) for solver in order)
    coming = at_most if solvable else at_least
    if abandon is not None and abandon.left() < coming * FINISH_S_PER_TRANSFER:
        raise DeadlinePassed(f"{'up to' if solvable else 'at least'} {coming} transfers of {len(needs)} shards to move "
                             f"cannot be cut and scheduled in the {abandon.left():.2f} s left",
                             coming * FINISH_S_PER_TRANSFER, abandon.left())
    total_link_s = sum(n.nbytes for n in needs) / GB * max(GB / model.intra.bandwidth, GB / model.inter.bandwidth)
    eps = 1e-6 * bound / total_link_s if total_link_s > 0 else 0.0
    build_s = time.perf_counter() - start
    status, amounts, objective, wall, used = Status.NO_SOLUTION, None, None, 0.0, backend
    for solver in order:
        if deadline.left() - finish_s < start_up(solver):
            continue
        status, amounts, objective, spent, used = solver(model, needs, m, eps, deadline.left() - finish_s, options)
        wall += spent
        if amounts is not None:
            break
    reason = f"{len(needs)} needs, {len(m.need)} candidate pairs" + (
        f" (restricted to intra-node holders + {INTER_CANDIDATES} inter-node holders per need)" if m.restricted else "")
    stopped = False
    if amounts is None:
        stopped = deadline.left() - finish_s < MIN_SOLVE_S
        status, amounts, used = Status.HEURISTIC, _greedy_split(model, needs, m), "greedy"
        reason += "; no solver answered" + (" in the time left" if stopped else "") + \
            ": each shard from its earliest-free holder"
    pieces: list[tuple[int, int, int, int, int]] = []
    cuts = np.flatnonzero(np.diff(m.need)) + 1
    for columns in np.split(np.arange(len(m.need)), cuts):
        need = needs[int(m.need[columns[0]])]
        shares = _integer_shares(amounts[columns], need.nbytes)
        pieces += _cut(need, [int(s) for s in m.source[columns]], shares, sizes)
    # columns of the pieces (arrays: 28,000 transfers at 1,024 devices), Transfer objects built once
    src, dst, nbytes, layer, rank = np.array(pieces, dtype=np.int64).reshape(-1, 5).T
    per_node = model.instance.devices_per_node
    intra = src // per_node == dst // per_node
    fluid = _fluid(model, src, dst, nbytes.astype(float), intra)
    # proven bound: the LP optimum over all holders bounds every schedule (minus the eps term)
    proven = bound
    if status is Status.OPTIMAL and not m.restricted and objective is not None:
        proven = max(bound, objective - eps * total_link_s)
    if status is Status.OPTIMAL and (m.restricted or fluid > proven * (1 + 1e-6) + 1e-12):
        status = Status.FEASIBLE  # optimal for the restricted model only, or rounding moved it
    if status is Status.FEASIBLE and fluid <= bound * (1 + 1e-6):
        status = Status.OPTIMAL  # meets the solver-independent bound
    times = _times(model, nbytes.astype(float), intra)
    colours, greedy = colour_rounds(list(zip(src.tolist(), dst.tolist())), times.tolist(), deadline)
    colour = np.array(colours, dtype=np.int64)
    rounds = int(colour.max(initial=-1)) + 1
    by_round = np.lexsort((layer, dst, src, colour))  # by round, then sender, receiver and layer
    transfers = [Transfer(tensor_name(ly, rk), ly, rk, s_, d_, n_, c_) for s_, d_, n_, ly, rk, c_ in
                 zip(*(column[by_round].tolist() for column in (src, dst, nbytes, layer, rank, colour)))]
    times = times[by_round]
    round_times = np.zeros(rounds)
    np.maximum.at(round_times, colour[by_round], times)
    degree = int(max(np.bincount(src).max(), np.bincount(dst).max())) if transfers else 0
    reason += f"; {len(transfers)} transfers in {rounds} rounds"
    if greedy:
        reason += (f" (the deadline passed while colouring: {greedy} transfers placed greedily, max-degree is "
                   f"{degree})")
    solve = SolveResult(status, tuple(transfers), fluid, proven, wall, used, build_s, seed, reason,
                        stopped_early=stopped or greedy > 0 or (status is Status.FEASIBLE and deadline.expired()))
    return Migration(new, tuple(transfers), rounds, float(round_times.sum()), fluid, bound, degree,
                     tuple(round_times.tolist()), release_schedule(old, new, failed, transfers), solve,
                     async_makespan(times, transfers), wanted)
