"""What this process' heap holds live, apart from what its allocators keep resident: Python's
allocated blocks (`sys.getallocatedblocks`) and glibc malloc's bytes in use (`mallinfo2(3)`,
glibc 2.33 and later: `uordblks`, in use from the heaps of every arena, plus `hblkhd`, in
blocks mmapped on their own). RSS also counts memory the allocators hold free for reuse, so a
resident set that creeps while both of these stay flat is retention, not objects kept."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from functools import cache

MIB = 1024 * 1024


class _MallInfo2(ctypes.Structure):
    # struct mallinfo2, in the order malloc.h declares it.
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):  # not glibc, or a glibc before 2.33
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    reader: Callable[[], _MallInfo2] = function
    return reader


def malloc_in_use_mib() -> float | None:
    """Bytes malloc has handed out and not had back, in MiB; None without glibc's mallinfo2."""
    function = _mallinfo2()
    if function is None:
        return None
    info = function()
    return (info.uordblks + info.hblkhd) / MIB


def live_heap() -> dict[str, float | None]:
    return {"python_blocks": sys.getallocatedblocks(), "malloc_in_use_mib": malloc_in_use_mib()}
