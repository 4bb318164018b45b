"""solve/frames.py: the branch and bound's recursion starts on a data-stack chunk of its own."""

from __future__ import annotations

import pytest

from chameleon_opt.solve.frames import PAD_SLOTS, _padding, on_fresh_chunk


def test_the_padding_frame_opens_a_chunk_with_room_after_it() -> None:
    """CPython 3.11's chunks are 16 KiB: a frame of PAD_SLOTS 8-byte slots never fits the room left
    in one, so the interpreter opens a chunk of its own for it, a power of two: over 128 KiB of
    frame makes it 256 KiB, with about 125 KB left for the recursion."""
    code = _padding().__code__
    assert code.co_nlocals >= PAD_SLOTS
    assert 128 * 1024 < code.co_nlocals * 8 < 256 * 1024 - 100 * 1024


def test_a_call_on_a_fresh_chunk_returns_and_raises_as_it_would() -> None:
    def depth(n: int) -> int:
        return 0 if n == 0 else 1 + depth(n - 1)

    assert on_fresh_chunk(lambda: depth(300)) == 300
    with pytest.raises(ZeroDivisionError):
        on_fresh_chunk(lambda: 1 // 0)
