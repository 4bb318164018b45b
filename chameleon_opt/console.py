"""What every command prints through: the two consoles, the contract's failure line and exit code,
the one-object JSON output, and the DEVICE@STEP parser the demo commands share.

Its own module so that the command modules (cli.py, interop/commands.py) import it and not each
other (docs/cli-contract.md says what the exit codes and the JSON object are)."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

from chameleon_opt.errors import ChameleonError, InputError
from chameleon_opt.incident import COMMAND_LINE

stdout = Console(width=None if sys.stdout.isatty() else 120)
stderr = Console(stderr=True)


def fail(error: ChameleonError, as_json: bool = False) -> NoReturn:
    """One line on stderr (and a JSON object on stdout with --json), then the contract's exit code."""
    stderr.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
    if as_json:
        print(json.dumps({"format": 1, "error": type(error).__name__, "reason": str(error),
                          "exit_code": error.exit_code}))
    raise typer.Exit(error.exit_code)


def emit_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=None, separators=(",", ":"), allow_nan=False))


def parse_kill(text: str, option: str) -> tuple[int, int]:
    """(device, step) of a DEVICE@STEP option value; InputError naming `option` otherwise."""
    device, _, step = text.partition("@")
    if not (device.isdigit() and step.isdigit()):
        raise InputError(COMMAND_LINE, option, f"{text!r} is not DEVICE@STEP", "write e.g. 1@4 (device 1 dies in step 4)")
    return int(device), int(step)
