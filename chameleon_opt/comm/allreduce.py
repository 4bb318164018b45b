"""Gradient all-reduce groups for uneven pipelines, scheduled in rounds by graph colouring.

With uneven pipelines a layer sits in different stage slots in different replicas, so gradients
are reduced per layer: one group per layer (embedding and head included) whose members are the
live slots holding it. Every TP rank runs its own ring over the same-rank devices of the member
slots (TP ranks hold different shards), so a group's members are all devices of its slots, and
two groups conflict when they share a slot (equivalently a device). Layers held by exactly the
same slots are merged into one group (`layers{a}-{b}`, contiguous runs only, so names stay
readable): one bucketed all-reduce instead of several that would conflict anyway. Groups of a
single slot have nothing to reduce and are left out.

With a tied embedding (GPT-style) the word-embedding matrix lives on the first and the last stage
of every pipeline; its gradient is summed over all those copies by one extra group
`tied_embedding` over the union of their slots (Megatron's embedding group and the data-parallel
reduction in one ring), and the embedding and head groups carry the rest of their parameters.

Rounds = colour classes of the conflict graph, minimum colours by CP-SAT (one Boolean per
group x colour; per slot and colour at most one of its groups: the slot's groups form a clique, so
these rows are exact and far fewer than one row per conflicting pair), DSATUR as the upper bound,
the warm start and the fallback. A slot's group count is a lower bound: when DSATUR meets it,
CP-SAT is skipped. Rounds run in backward order (the group with the latest layer first), as
gradients become ready from the head down. Time = sum over rounds of the slowest group's ring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from chameleon_opt.perf.comm import ring_allreduce_time
from chameleon_opt.perf.model import PerfModel
from chameleon_opt.plan import Plan
from chameleon_opt.solve.backends import DEFAULT, SolverOptions, cpsat_start_s, solve_cpsat
from chameleon_opt.solve.deadline import Deadline
from chameleon_opt.solve.result import SolveResult, Status

TIED = "tied_embedding"
MIN_SOLVE_S = 0.02  # less time left than this: DSATUR's colouring stands


@dataclass(frozen=True)
class Group:
    name: str
    layers: tuple[int, ...]
    slots: tuple[tuple[int, int], ...]  # live (pipeline, stage) slots; members = all their devices
    nbytes: float                       # gradient bytes each TP rank reduces
    time_s: float                       # one ring all-reduce of these bytes


@dataclass(frozen=True)
class AllreduceSchedule:
    groups: dict[str, Group]
    rounds: list[list[str]]
    estimated_s: float
    colours: int
    dsatur_colours: int
    clique_bound: int
    solve: SolveResult[list[list[str]]]

    def to_json(self) -> dict[str, object]:
        return {"rounds": self.rounds, "estimated_s": self.estimated_s, "colours": self.colours,
                "dsatur_colours": self.dsatur_colours, "clique_bound": self.clique_bound,
                "solve": self.solve.to_json(),
                "groups": {g.name: {"layers": [g.layers[0], g.layers[-1] + 1] if g.name != TIED else list(g.layers),
                                    "slots": [list(s) for s in g.slots], "bytes": g.nbytes}
                           for g in self.groups.values()}}


def _name(layers: list[int]) -> str:
    return f"layer{layers[0]}" if len(layers) == 1 else f"layers{layers[0]}-{layers[-1]}"


def allreduce_groups(model: PerfModel, plan: Plan, failed: frozenset[int] = frozenset()) -> dict[str, Group]:
    """The plan's gradient groups by name (deterministic: the lowering recomputes them)."""
    holders = model.layer_holders(plan, model.failed_slots(plan, failed))
    params = model.workload.params.astype(float).copy()
    arch = model.workload.architecture
    last = model.workload.num_layers - 1
    tied = arch is not None and arch.tied_embeddings
    if tied:
        shared = float(arch.vocab * arch.hidden)
        params[0] -= shared
        params[last] -= shared
    per_rank = model.grad_bytes / plan.tensor_parallel

    def group(name: str, layers: list[int], slots: tuple[tuple[int, int], ...], nbytes: float) -> Group:
        ring = [plan.pipelines[j].stages[s].devices[0] for j, s in slots]
        return Group(name, tuple(layers), slots, nbytes, ring_allreduce_time(nbytes, len(slots), model.group_link(ring)))

    out: dict[str, Group] = {}
    run: list[int] = []
    for layer in range(last + 2):
        slots = tuple(holders.get(layer, ())) if layer <= last else None
        if run and slots != tuple(holders.get(run[0], ())):
            members = tuple(holders.get(run[0], ()))
            if len(members) > 1:
                out[_name(run)] = group(_name(run), run, members, float(params[run].sum()) * per_rank)
            run = []
        run.append(layer)
    if tied:
        union = tuple(sorted(set(holders.get(0, ())) | set(holders.get(last, ()))))
        if len(union) > 1:
            out[TIED] = group(TIED, [0, last], union, shared * per_rank)
    return out


def _conflict_cliques(groups: dict[str, Group]) -> list[tuple[str, ...]]:
    """The groups of each slot (a clique of the conflict graph), duplicates removed."""
    by_slot: dict[tuple[int, int], list[str]] = {}
    for g in groups.values():
        for slot in g.slots:
            by_slot.setdefault(slot, []).append(g.name)
    return sorted({tuple(sorted(names)) for names in by_slot.values()})


def dsatur_colouring(groups: dict[str, Group]) -> dict[str, int]:
    """Brelaz's DSATUR: colour next the group whose neighbours use the most colours (ties: most
    neighbours, then name), with the least colour they leave free. Written here rather than taken
    from networkx, whose import alone (0.1 s) ate into the decision's deadline; a plan has at most
    a few hundred groups, so the quadratic selection costs milliseconds."""
    neighbours: dict[str, set[str]] = {g: set() for g in groups}
    for clique in _conflict_cliques(groups):
        for g in clique:
            neighbours[g].update(clique)
    for g in neighbours:
        neighbours[g].discard(g)
    colour: dict[str, int] = {}
    seen: dict[str, set[int]] = {g: set() for g in groups}  # colours among each group's neighbours
    left = sorted(groups)
    while left:
        g = max(left, key=lambda n: (len(seen[n]), len(neighbours[n])))  # first of the sorted names on ties
        left.remove(g)
        c = next(c for c in range(len(neighbours[g]) + 1) if c not in seen[g])
        colour[g] = c
        for n in neighbours[g]:
            seen[n].add(c)
    return colour


def cpsat_colouring(groups: dict[str, Group], upper: int, deadline: Deadline, options: SolverOptions = DEFAULT,
                    hint: dict[str, int] | None = None) -> tuple[Status, dict[str, int] | None, float, float]:
    """Minimum colouring: x[g, c] = group g in round c, y[c] = round c used; per clique and
    colour sum x <= y; every group one colour; y non-increasing (symmetry); the largest clique's
    groups fixed to distinct colours (symmetry). Returns status, colouring, bound, wall. CP-SAT is
    given what is left of `deadline` on entry (building the model is not charged to it)."""
    time_limit_s = deadline.left()
    names = sorted(groups)
    cliques = _conflict_cliques(groups)
    largest = max(cliques, key=len, default=())
    from ortools.sat.python import cp_model  # here: 0.3 s to import; DSATUR often meets the clique bound

    m = cp_model.CpModel()
    x = {(g, c): m.new_bool_var(f"x_{g}_{c}") for g in names for c in range(upper)}
    y = [m.new_bool_var(f"y_{c}") for c in range(upper)]
    for g in names:
        m.add_exactly_one(x[g, c] for c in range(upper))
    for clique in cliques:
        for c in range(upper):
            m.add(sum(x[g, c] for g in clique) <= y[c])
    for c in range(upper - 1):
        m.add_implication(y[c + 1], y[c])
    for c, g in enumerate(largest):
        m.add(x[g, c] == 1)
    m.minimize(sum(y))
    if hint:  # DSATUR's colouring relabelled so the largest clique keeps colours 0..k-1
        relabel: dict[int, int] = {}
        for c, g in enumerate(largest):
            relabel.setdefault(hint[g], c)
        spare = iter(c for c in range(upper) if c not in relabel.values())
        for g in names:
            if hint[g] not in relabel:
                relabel[hint[g]] = next(spare)
        if all(relabel[hint[g]] == c for c, g in enumerate(largest)):
            for g in names:
                for c in range(upper):
                    m.add_hint(x[g, c], relabel[hint[g]] == c)
    solver, outcome = solve_cpsat(m, time_limit_s, options)
    if not outcome.has_solution or outcome.bound is None:
        return Status.NO_SOLUTION, None, float(len(largest)), outcome.wall_s
    colouring = {g: next(c for c in range(upper) if solver.boolean_value(x[g, c])) for g in names}
    return outcome.status, colouring, max(outcome.bound, float(len(largest))), outcome.wall_s


def schedule_allreduce(model: PerfModel, plan: Plan, failed: frozenset[int], deadline: Deadline,
                       options: SolverOptions = DEFAULT) -> AllreduceSchedule:
    """Rounds of concurrent all-reduce groups with no device in two groups of a round: DSATUR,
    then CP-SAT while the clique bound is not met and time is left before `deadline`; `options`
    are the caller's, so the operator's `--params` and `--solver-log` reach CP-SAT here too."""
    start = time.perf_counter()
    groups = allreduce_groups(model, plan, failed)
    cliques = _conflict_cliques(groups)
    bound = max((len(c) for c in cliques), default=0)
    greedy = dsatur_colouring(groups) if groups else {}
    greedy_count = max(greedy.values(), default=-1) + 1
    build_s = time.perf_counter() - start
    colouring, status, backend, wall, proven = greedy, Status.OPTIMAL, "bound", 0.0, float(bound)
    reason = f"{len(groups)} groups; DSATUR {greedy_count} colours, clique bound {bound}"
    stopped = False
    if greedy_count > bound and deadline.left() < MIN_SOLVE_S + cpsat_start_s():  # its first import included
        status, backend, stopped = Status.HEURISTIC, "dsatur", True
        reason += "; no time left for CP-SAT: DSATUR's colouring"
    elif greedy_count > bound:
        status, found, proven, wall = cpsat_colouring(groups, greedy_count, deadline, options, greedy)
        backend = "cpsat"
        if found is not None and max(found.values()) + 1 <= greedy_count:
            colouring = found
            stopped = status is Status.FEASIBLE and deadline.expired()
        else:
            status, stopped = Status.HEURISTIC, deadline.expired()
            reason += "; CP-SAT found nothing in time: DSATUR's colouring"
    colours = max(colouring.values(), default=-1) + 1
    classes: list[list[str]] = [[] for _ in range(colours)]
    for name in sorted(groups, key=lambda n: (-groups[n].layers[-1], n)):
        classes[colouring[name]].append(name)
    classes = [c for c in classes if c]
    classes.sort(key=lambda names: -max(groups[n].layers[-1] for n in names))
    estimated = sum(max(groups[n].time_s for n in names) for names in classes)
    if status is not Status.HEURISTIC and colours <= proven:
        status = Status.OPTIMAL
    solve = SolveResult(status, classes, float(colours), proven, wall, backend, build_s, options.seed,
                        reason + f"; {colours} rounds", stopped_early=stopped)
    return AllreduceSchedule(groups, classes, estimated, colours, greedy_count, bound, solve)
