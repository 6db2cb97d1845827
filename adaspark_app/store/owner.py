"""Which process writes a row, and whether it still runs: a reply in flight (`Store.begin_reply`)
is only another chat's to settle once the chat that writes it is gone.

An owner is ``host:pid:start``. ``start`` is the process's start time in clock ticks since boot
(field 22 of ``/proc/<pid>/stat``; empty where there is no /proc), so a pid the system has since
given to another process does not pass for the chat that died, and a process that has ended but
is not yet reaped (a zombie) counts as gone.
"""

from __future__ import annotations

import os
import socket


def _stat(pid: int) -> list[bytes]:
    """Fields 3 on of /proc/<pid>/stat (state, ppid, ...), or [] if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    # the command name (field 2) is in parentheses and may hold spaces or parentheses itself
    return stat[stat.rfind(b")") + 2:].split()


def _start_ticks(pid: int) -> str:
    """The process's start time since boot in clock ticks, or '' if it cannot be read."""
    fields = _stat(pid)
    return fields[19].decode() if len(fields) > 19 else ""


def this_owner() -> str:
    """This process, as an owner string."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid)}"


def owner_alive(owner: str) -> bool | None:
    """Whether the process `owner` names still runs; None for another host's process (only this
    host's can be asked: the caller judges by how recently it wrote). An owner that cannot be
    read counts as gone."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3:
        return False
    host, pid_text, start = parts
    if host != socket.gethostname():
        return None
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it runs
    except OSError:
        return False
    fields = _stat(pid)
    if fields[:1] in ([b"Z"], [b"X"]):
        return False  # it has ended; its parent has not reaped it yet
    return not start or len(fields) <= 19 or fields[19].decode() == start
