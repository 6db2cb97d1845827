"""Ending a process at once, without leaving its temporary stores behind.

Two paths end a headless command with ``os._exit``, skipping every ``finally``: a second Ctrl+C
(or SIGTERM) while llama.cpp may never return (interrupts.py), and a llama.cpp assertion
(engine/backend.py's abort line). ``adaspark run --fresh-store`` and ``adaspark bench`` learn into
SQLite files in a temporary folder, and each such exit left one behind in the system's temporary
folder (38 of them, 120 kB each, after a few test runs). Folders made by ``TemporaryDir`` are
removed by ``hard_exit`` too.

A SIGKILL (an out-of-memory kill, `timeout -s KILL`) runs nothing, nor does a crash's one line
(native/fatal_signal.py: C, no Python after a crash), so each folder also holds a
lock (flock on its ``.lock``) for its owner's life: the kernel drops it when the process ends,
however it ends, whatever its pid namespace. Making a folder first removes the folders of the
same prefix whose lock nobody holds (``sweep``). The lock file is locked under another name and
renamed into place, so no folder is ever seen with an unheld ``.lock`` while its owner lives.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import weakref
from typing import NoReturn

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locks, no sweep
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"

_LIVE: set[str] = set()  # add, discard and list() are each one step under the GIL


class TemporaryDir:
    """A temporary folder removed at ``cleanup()``, at the end of a ``with`` block, or by
    ``hard_exit``: ``tempfile.TemporaryDirectory``'s interface, ``__enter__`` giving its path."""

    def __init__(self, prefix: str) -> None:
        sweep(prefix)
        self.name = tempfile.mkdtemp(prefix=prefix)
        lock_fd = _hold_lock(self.name)
        _LIVE.add(self.name)
        # as tempfile.TemporaryDirectory: removed at the interpreter's exit if nobody did it before
        self._finalizer = weakref.finalize(self, _remove, self.name, lock_fd)

    def cleanup(self) -> None:
        self._finalizer()

    def __enter__(self) -> str:
        return self.name

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _remove(name: str, lock_fd: int | None) -> None:
    _LIVE.discard(name)
    shutil.rmtree(name, ignore_errors=True)
    if lock_fd is not None:
        os.close(lock_fd)  # the lock goes after the folder: no sweep ever sees it unheld while it stands


def _hold_lock(folder: str) -> int | None:
    """Lock a new file in `folder` and give it the name ``LOCK_NAME``; the open fd (the lock's
    life), or None without flock."""
    if fcntl is None:
        return None
    fd, path = tempfile.mkstemp(prefix=".locking-", dir=folder)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(path, os.path.join(folder, LOCK_NAME))
    return fd


def sweep(prefix: str) -> list[str]:
    """Remove the folders `prefix`* in the temporary folder whose ``.lock`` no process holds (their
    owner ended without removing them); folders without one (older versions', other tools') are
    left alone. Returns the folders removed."""
    if fcntl is None:
        return []
    removed = []
    for folder in glob.glob(os.path.join(glob.escape(tempfile.gettempdir()), glob.escape(prefix) + "*")):
        try:
            fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its owner lives
        finally:
            os.close(fd)  # (a lock taken is dropped with it)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


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
