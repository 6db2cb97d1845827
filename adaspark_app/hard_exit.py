"""Ending a process at once, without leaving its temporary stores behind.

Two paths end a headless command with ``os._exit``, skipping every ``finally``: a second Ctrl+C
(or SIGTERM) while llama.cpp may never return (interrupts.py), and a llama.cpp assertion
(engine/backend.py's abort line). ``adaspark run --fresh-store`` and ``adaspark bench`` learn into
SQLite files in a temporary folder, and each such exit left one behind in the system's temporary
folder (38 of them, 120 kB each, after a few test runs). Folders made by ``TemporaryDir`` are
removed by ``hard_exit`` too. A SIGKILL still leaves its folder: nothing runs then.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import NoReturn

_LIVE: set[str] = set()  # add, discard and list() are each one step under the GIL


class TemporaryDir:
    """A temporary folder removed at ``cleanup()``, at the end of a ``with`` block, or by
    ``hard_exit``: ``tempfile.TemporaryDirectory``'s interface, ``__enter__`` giving its path."""

    def __init__(self, prefix: str) -> None:
        self.name = tempfile.mkdtemp(prefix=prefix)
        _LIVE.add(self.name)

    def cleanup(self) -> None:
        _LIVE.discard(self.name)
        shutil.rmtree(self.name, ignore_errors=True)

    def __enter__(self) -> str:
        return self.name

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def live_dirs() -> list[str]:
    """The temporary folders ``hard_exit`` would remove now."""
    return sorted(list(_LIVE))


def hard_exit(code: int, line: str) -> NoReturn:
    """Write ``line`` to stderr, remove the live temporary folders and end the process with
    ``code`` at once, from any thread (open SQLite files in them go with the process; Linux unlinks
    an open file)."""
    try:
        os.write(2, line.encode("utf-8", "replace"))
        for name in live_dirs():
            shutil.rmtree(name, ignore_errors=True)
    finally:
        os._exit(code)
