"""Surviving TP groups: the unit every recovery plan is built from.

A TP group must sit inside one node (its collectives run on NVLink), so a node with k live
devices offers floor(k / TP) groups; the remaining devices idle until repaired.
"""

from __future__ import annotations

from chameleon_opt.instance.load import Instance


def survivor_groups(instance: Instance, failed: frozenset[int], tp: int) -> list[tuple[int, ...]]:
    """Live devices chunked into TP groups node by node, in device order (deterministic)."""
    per_node = instance.devices_per_node
    groups: list[tuple[int, ...]] = []
    for node in range(instance.spec.cluster.nodes):
        alive = [d for d in range(node * per_node, (node + 1) * per_node) if d not in failed]
        groups += [tuple(alive[i:i + tp]) for i in range(0, len(alive) - tp + 1, tp)]
    return groups
