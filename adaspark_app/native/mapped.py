"""The libraries this process has mapped, opened again without loading a second copy.

The runtime directory (``native.runtime_dir``) and llama-cpp-python's own wheel hold each library
as copies under several names (``libggml-cpu.so``, ``.so.0``, ``.so.0.25.3``), so opening one by
name can load a second copy beside the one llama.cpp uses, with its own variables. The mapped file
is found through /proc/self/maps and opened with RTLD_NOLOAD: the very library in use.
"""

from __future__ import annotations

import ctypes
import os


def mapped_libraries(stem: str) -> list[ctypes.CDLL]:
    """Handles on the mapped libraries whose path holds ``stem`` (e.g. ``libggml-cuda``), in path
    order; [] if none is mapped or /proc/self/maps is unreadable."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            fields = (line.split(None, 5) for line in f if stem in line)
            paths = {x[5].strip() for x in fields if len(x) == 6}
    except OSError:
        return []
    out = []
    for path in sorted(paths):
        try:
            out.append(ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW))
        except OSError:
            continue
    return out
