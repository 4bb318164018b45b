"""Rounds of transfers and when old state may be released.

Transfers form a bipartite multigraph (senders on one side, receivers on the other, one edge per
transfer). Koenig's edge-colouring theorem: its edges can be coloured with exactly max-degree
colours, a round being one colour, so no device sends twice or receives twice in a round and the
number of rounds is the least possible. A greedy colouring can need up to 2 x max-degree - 1.

The constructive proof is the algorithm (alternating paths): colour the edges one by one; for
edge (u, v) take a colour a free at u and b free at v; if a is also free at v use it, else swap a
and b along the path from v that alternates a, b. In a bipartite graph that path cannot reach u
(it enters left vertices by a-edges, and u has none), so afterwards a is free at both ends.

A round lasts as long as its longest transfer, so edges go heaviest first and the palette grows
lazily: a new colour opens only when an endpoint already uses every open colour. After any prefix
of the heaviest edges the open colours equal that prefix's maximum degree, so long transfers share
the first rounds instead of each stretching a different one; at the end exactly max-degree colours
are open (a vertex of maximum degree needs them all, and a colour only opens for a vertex that
has used every open one).

Under a deadline the alternating paths (about 0.6 s for 28,000 transfers at 1,024 devices) stop
when it passes, and the remaining edges take the least colour free at both ends (bit masks:
microseconds per edge). Every round stays a matching; the count may exceed max-degree, at most
2 x max-degree - 1, and the caller reports the colouring as cut short.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from chameleon_opt.comm.state import live_slots, old_holdings
from chameleon_opt.plan import Plan
from chameleon_opt.solve.deadline import Deadline

if TYPE_CHECKING:
    from chameleon_opt.comm.transfers import Migration, Transfer


def colour_bipartite_edges(edges: Sequence[tuple[int, int]], weights: Sequence[float] | None = None) -> list[int]:
    """Colour of every (left, right) edge, with exactly max-degree colours, heaviest edges first
    into the fewest rounds (left and right ids are separate name spaces: a device may appear on
    both sides)."""
    return colour_rounds(edges, weights)[0]


def colour_rounds(edges: Sequence[tuple[int, int]], weights: Sequence[float] | None = None,
                  deadline: Deadline = Deadline.never()) -> tuple[list[int], int]:
    """(colour of every edge, how many edges were coloured greedily because `deadline` passed).
    With no greedy edge the colouring is Koenig's: exactly max-degree colours."""
    left_ids: dict[int, int] = {}
    right_ids: dict[int, int] = {}
    ends = [(left_ids.setdefault(u, len(left_ids)), right_ids.setdefault(v, len(right_ids))) for u, v in edges]
    shift = len(left_ids)
    ends = [(u, shift + v) for u, v in ends]  # one vertex list: left vertices, then right ones
    at: list[dict[int, int]] = [{} for _ in range(len(left_ids) + len(right_ids))]  # at[x][colour] = edge
    colour = [-1] * len(edges)
    weight = list(weights) if weights is not None else [0.0] * len(edges)
    longest: list[float] = []  # per open colour: the longest edge it has held
    opened = 0

    def free_colours(x: int, limit: int = 3) -> list[int]:
        """Up to `limit` open colours free at x, latest opened first (their rounds are shortest)."""
        out, c = [], opened - 1
        while c >= 0 and len(out) < limit:
            if c not in at[x]:
                out.append(c)
            c -= 1
        return out

    def alternating_path(start: int, first: int, second: int) -> list[int]:
        path, x, c = [], start, first
        while c in at[x]:
            step = at[x][c]
            path.append(step)
            p, q = ends[step]
            x = q if x == p else p
            c = second if c == first else first
        return path

    def damage(path: list[int], first: int, second: int) -> float:
        """How much the swap lengthens rounds: edges moved into a round shorter than themselves."""
        return sum(max(0.0, weight[step] - longest[second if colour[step] == first else first]) for step in path)

    order = sorted(range(len(edges)), key=lambda i: -weight[i]) if weights is not None else list(range(len(edges)))
    for done, e in enumerate(order):
        if deadline.expired():
            return colour_greedily(order[done:], ends, at, colour), len(order) - done
        u, v = ends[e]
        free_u, free_v = free_colours(u), free_colours(v)
        if not free_u or not free_v:  # an endpoint uses every open colour: open one more
            a = opened
            opened += 1
            longest.append(weight[e])
        else:
            common = next((c for c in range(opened - 1, -1, -1) if c not in at[u] and c not in at[v]), -1)
            if common >= 0:
                a = common
            else:
                # Koenig's step: a free at u, b free at v; swapping a/b on the path from v frees a at v
                # (the path cannot reach u), or b/a on the path from u frees b at u. Of the few
                # candidates, take the swap that moves the least long transfers into short rounds.
                best: tuple[float, int, list[int], int, int, int] | None = None
                for a_ in free_u:
                    for b_ in free_v:
                        for colour_with, start, first, second in ((a_, v, a_, b_), (b_, u, b_, a_)):
                            path = alternating_path(start, first, second)
                            score = (damage(path, first, second), len(path))
                            if best is None or score < best[:2]:
                                best = (score[0], score[1], path, first, second, colour_with)
                assert best is not None
                _, _, path, first, second, a = best
                for step in path:
                    p, q = ends[step]
                    del at[p][colour[step]], at[q][colour[step]]
                for step in path:
                    colour[step] = second if colour[step] == first else first
                    p, q = ends[step]
                    at[p][colour[step]] = at[q][colour[step]] = step
                    longest[colour[step]] = max(longest[colour[step]], weight[step])
        colour[e] = a
        at[u][a] = at[v][a] = e
        longest[a] = max(longest[a], weight[e])
    return colour, 0


def colour_greedily(order: Sequence[int], ends: Sequence[tuple[int, int]], at: list[dict[int, int]],
                    colour: list[int]) -> list[int]:
    """Give each edge of `order` the least colour free at both of its ends (`at`: the colours each
    vertex already uses). A colour free at both ends is among the first deg(u) + deg(v) - 1, so at
    most 2 x max-degree - 1 colours in all."""
    used = [sum(1 << c for c in taken) for taken in at]
    for e in order:
        u, v = ends[e]
        free = ~(used[u] | used[v])
        c = (free & -free).bit_length() - 1
        colour[e] = c
        used[u] |= 1 << c
        used[v] |= 1 << c
    return colour


def kept_layers(new: Plan, failed: frozenset[int]) -> dict[int, tuple[int, int, int]]:
    """Device -> (first, end, TP rank) it holds in the new plan's live slots."""
    out: dict[int, tuple[int, int, int]] = {}
    for j, s in live_slots(new, failed):
        stage = new.pipelines[j].stages[s]
        for rank, d in enumerate(stage.devices):
            out[d] = (stage.first, stage.end, rank)
    return out


def release_schedule(old: Plan, new: Plan, failed: frozenset[int], transfers: Sequence["Transfer"]) -> dict[int, int]:
    """Device -> the round after which its old state that the new plan does not keep may be
    freed: after the last transfer it sources (-1: at once). Devices that keep all of their old
    state are absent."""
    last: dict[int, int] = {}
    for t in transfers:
        last[t.src] = max(last.get(t.src, -1), t.round)
    keep = kept_layers(new, failed)
    out: dict[int, int] = {}
    for d, h in old_holdings(old, failed).items():
        k = keep.get(d)
        if k is not None and k[2] == h.rank and k[0] <= h.first and h.end <= k[1]:
            continue
        out[d] = last.get(d, -1)
    return out


def check_release_safety(old: Plan, new: Plan, failed: frozenset[int], migration: "Migration") -> list[str]:
    """Violations (empty when safe): a transfer whose source never held the shard or had already
    released it; a needed shard delivered with the wrong byte count; or a moment between rounds
    when some shard has no complete copy anywhere (the last replica released before its copy landed).

    A copy exists after round k on a device that keeps the shard, on an old holder released after
    a later round, or on a receiver whose last piece landed by round k; so the shard is always
    somewhere iff it has a keeper, or the earliest landing is no later than the latest release."""
    problems: list[str] = []
    held = old_holdings(old, failed)
    release = migration.release_after_round
    got: dict[tuple[int, int], int] = {}
    landed: dict[tuple[int, int], int] = {}
    for t in migration.transfers:
        h = held.get(t.src)
        if h is None or h.rank != t.tp_rank or not h.first <= t.layer < h.end:
            problems.append(f"device {t.src} sends {t.tensor} it never held")
        if t.src in release and t.round > release[t.src]:
            problems.append(f"device {t.src} sends {t.tensor} in round {t.round} after its release "
                            f"(round {release[t.src]})")
        got[(t.dst, t.layer)] = got.get((t.dst, t.layer), 0) + t.nbytes
        landed[(t.dst, t.layer)] = max(landed.get((t.dst, t.layer), -1), t.round)
    for key, size in migration.tensor_sizes.items():
        if got.get(key, 0) != size:
            problems.append(f"device {key[0]} gets {got.get(key, 0)} of the {size} bytes of layer {key[1]}")
    for key in got:
        if key not in migration.tensor_sizes:
            problems.append(f"device {key[0]} gets layer {key[1]} it does not need")
    keep = kept_layers(new, failed)
    first_landing: dict[tuple[int, int], int] = {}
    for (d, layer), r in landed.items():
        tensor = (layer, keep[d][2]) if d in keep else (layer, -1)
        first_landing[tensor] = min(first_landing.get(tensor, r), r)
    kept: set[tuple[int, int]] = set()
    latest_release: dict[tuple[int, int], int] = {}
    for d, h in held.items():
        k = keep.get(d)
        for layer in range(h.first, h.end):
            if k is not None and k[2] == h.rank and k[0] <= layer < k[1]:
                kept.add((layer, h.rank))
            else:
                latest_release[(layer, h.rank)] = max(latest_release.get((layer, h.rank), -1), release[d])
    for tensor, r in first_landing.items():
        if tensor not in kept and r > latest_release.get(tensor, -1):
            problems.append(f"layer {tensor[0]} TP rank {tensor[1]}: every replica released by round "
                            f"{latest_release.get(tensor, -1)}, its first copy lands in round {r}")
    return problems
