"""A C compiler that fails: what a build of AdaSpark's small C libraries (native/c_compile.py)
meets on a machine without a working one."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def failing_compiler(folder: Path, error: str) -> tuple[Path, Callable[[], int]]:
    """(the compiler's path, how many times it ran): it writes `error` to stderr and exits 1."""
    calls = folder / "calls"
    cc = folder / "failing-cc"
    cc.write_text(f"#!/bin/sh\necho x >> {calls}\necho '{error}' >&2\nexit 1\n")
    cc.chmod(0o755)
    return cc, lambda: calls.read_text().count("x") if calls.exists() else 0
