"""Session set-up shared by the test files: one fork server for both runtimes' workers.

Each runtime starts its workers from a fork server that has imported what they need
(`runtime.cores`), but the server is started once per process, with the modules of whichever
runtime starts a worker first. In one pytest session the plain runtime (`runtime.worker`) comes
first, so every Hugging Face worker after it imported transformers itself: 4 s of CPU per worker,
8 workers per test, which made those tests 3x slower in the suite than alone. Starting the server
with both runtimes' modules before any test runs (in a session with multiprocess tests) removes that.

And one Click command for the CLI's Typer app: `typer.testing.CliRunner.invoke` builds it afresh
on every call (17 ms of CPU: each command's signature read and its string annotations evaluated),
and the suite invokes the CLI in-process several hundred times. The command is the same object
the app would build; each invocation still makes its own Click context.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
from typing import Any

import pytest

_started = False


def pytest_configure(config: pytest.Config) -> None:
    """Build each Typer app's Click command once per session (the module docstring says why)."""
    import typer.testing

    build = getattr(typer.testing, "_get_command", None)
    if build is None:  # a Typer without this private hook: every invocation builds its own, as before
        return
    built: dict[int, tuple[typer.Typer, Any]] = {}  # id(app) -> (app, its command): the app kept alive

    def command_of(app: typer.Typer) -> Any:
        if id(app) not in built:
            built[id(app)] = (app, build(app))
        return built[id(app)][1]

    typer.testing._get_command = command_of


def _both_runtimes_imports() -> list[str]:
    """What the workers of either runtime import (the union of their `preload`s)."""
    from chameleon_opt.runtime import controller, pipelined

    return ["torch", *controller.WORKER_IMPORTS, *pipelined.WORKER_IMPORTS]


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected: the items that will run
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the fork server with both runtimes' modules once the session is known to run a
    multiprocess test, before its first test: the server imports them (about 7 s of CPU) on the
    second core while the single-process tests that come first in the suite run on one. Started at
    the first multiprocess test instead, it took that core from the torchft example's processes."""
    global _started
    if _started or not any(item.get_closest_marker("multiprocess") for item in items):
        return
    _started = True
    if "forkserver" not in mp.get_all_start_methods() or any(importlib.util.find_spec(name) is None
                                                             for name in ("torch", "transformers")):
        return  # spawn (no fork server), or the runtime extra is not installed: nothing to share
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(_both_runtimes_imports())
    forkserver.ensure_running()
