"""Naming a failure on the command line: `--failed 5,22`, `--failed 8-15`, `--failed-node 3`.

An operator in an incident knows which devices or which node died; making them edit the
instance's `failures.events` first is a detour. The command line's failures are added to the
file's (or replace them with `--replace-failures`), and an empty result is its own outcome
(`NothingFailed`, exit 6): there is nothing to recover from, so the current plan keeps running.
"""

from __future__ import annotations

from collections.abc import Iterable

import typer

from chameleon_opt.errors import ChameleonError, InputError
from chameleon_opt.instance.load import Instance

COMMAND_LINE = "command line"
"""What an InputError names as its file when the bad value came from a flag, not a file."""


FAILED = typer.Option([], "--failed", metavar="IDS", rich_help_panel="Failure",
                      help="failed device ids: 5,22 or a range 8-15 (repeatable); added to the file's failures")
FAILED_NODE = typer.Option([], "--failed-node", metavar="NODES", rich_help_panel="Failure",
                           help="every device of these nodes failed: 3, or 1,3, or 0-1 (repeatable)")
REPLACE_FAILURES = typer.Option(False, "--replace-failures", rich_help_panel="Failure",
                                help="ignore the file's failures: only --failed and --failed-node count")
"""The options of every command that plans for a failure (plan, estimate, export-plan)."""


class NothingFailed(ChameleonError):
    """No device failed, neither in the file nor on the command line (exit 6): keep running."""

    exit_code = 6

    def __init__(self, instance: Instance) -> None:
        where = f" ({instance.path.name})" if instance.path is not None else ""
        super().__init__(f"{instance.name}{where}: nothing failed (no failures in the file, no --failed or "
                         "--failed-node): keep running the current plan, or name the failure with --failed IDS "
                         "or --failed-node N")


def parse_ids(texts: Iterable[str], option: str, count: int, kind: str) -> list[int]:
    """`5,22`, `8-15` or several such (a repeated option) into ids below `count`, in order given."""
    ids: list[int] = []
    for text in texts:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            low, dash, high = part.partition("-")
            if not (low.strip().isdigit() and (not dash or high.strip().isdigit())):
                raise InputError(COMMAND_LINE, option, f"cannot read {part!r}",
                                 f"give {kind} ids like 5,22 or ranges like 8-15")
            first, last = int(low), int(high) if dash else int(low)
            if last < first:
                raise InputError(COMMAND_LINE, option, f"range {part!r} runs backwards", f"write {last}-{first}")
            if last >= count:
                raise InputError(COMMAND_LINE, option, f"{kind} {last} does not exist",
                                 f"use {kind} ids 0-{count - 1}")
            ids.extend(range(first, last + 1))
    return ids


def failed_devices(instance: Instance, failed: Iterable[str] = (), failed_nodes: Iterable[str] = (),
                   replace: bool = False) -> frozenset[int]:
    """The devices to plan for: the file's failures (none with `replace`) plus the command line's
    devices and every device of the command line's nodes."""
    per_node = instance.devices_per_node
    devices = set(parse_ids(failed, "--failed", instance.num_devices, "device"))
    for node in parse_ids(failed_nodes, "--failed-node", instance.num_devices // per_node, "node"):
        devices.update(range(node * per_node, (node + 1) * per_node))
    return frozenset(devices) | (frozenset() if replace else instance.failed_devices)
