"""Run a deep recursion at the start of a fresh interpreter data-stack chunk.

Why: CPython 3.11 keeps Python frames in chunks of 16 KiB and frees a chunk as soon as the frame at
its base returns, so a recursion whose busiest depth straddles a chunk's edge frees and allocates a
chunk on nearly every call there. The branch and bound (solve/exact.py) recurses per stage and per
pipeline, so its speed depended on how deep its caller happened to sit: 8-24-device seed 91's proof
took 2.2 to 8.6 s of CPU for the same tree at caller depths 0-40 (4-6 extra frames: 5 s). Called
through `on_fresh_chunk`, the recursion starts right after a frame too large for any chunk's free
room, which CPython places at the base of a chunk of its own with PAD_SLOTS more room after it, so
the tree's edges never meet a chunk edge: 2.1-2.2 s at every depth. Elsewhere (other versions of
CPython) it only costs one large frame per call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

PAD_SLOTS = 16_400
"""Local variable slots of the padding frame (8 bytes each, 131 KB): CPython rounds a chunk up to a
power of two, 256 KiB, so about 125 KB (some 400 frames of the branch and bound) follow it."""


@functools.cache
def _padding() -> Callable[[Callable[[], T]], T]:
    """A function whose frame holds PAD_SLOTS locals (names assigned in dead code are still locals)."""
    names = "=".join(f"slot{i}" for i in range(PAD_SLOTS))
    namespace: dict[str, object] = {}
    exec(f"def pad(call):\n    if False:\n        {names} = None\n    return call()\n", namespace)  # noqa: S102
    return namespace["pad"]  # type: ignore[return-value]


def on_fresh_chunk(call: Callable[[], T]) -> T:
    """`call()` with its frames at the start of a data-stack chunk of their own (see the module docstring)."""
    return _padding()(call)
