"""Giving the router's freed memory back to the system, so its RSS follows what it holds.

Reading a large message leaves gRPC's receive buffers freed but kept by glibc's malloc, on top of what the
router then holds (bench/README.md, "Proof router", has how much); malloc_trim returns them. Elsewhere (no glibc)
this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any


def _malloc_trim() -> Any:
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim", None)
    except OSError:
        return None


_TRIM = _malloc_trim()


def give_back() -> None:
    if _TRIM is not None:
        _TRIM(0)
