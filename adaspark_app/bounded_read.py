"""Reading a file a command takes whole (a script, a rounds log, a store export): at most a limit,
so that a huge file or a device that never ends (/dev/zero) is refused instead of filling the
memory. Pipes work (`adaspark run <(make_script)`, `store import -`)."""

from __future__ import annotations

import os
import sys
from typing import IO, Callable


class TooLarge(ValueError):
    """The source holds more than the limit (its first limit + 1 bytes were read, no more)."""


def read_at_most(source: str | os.PathLike, limit: int,
                 opener: Callable[[str | os.PathLike, str], IO[bytes]] = open) -> bytes:
    """The bytes of `source` (a path, or "-" for standard input) as `opener` reads them (e.g.
    gzip.open: what the file unpacks to); TooLarge past `limit`. OSError as opening or reading
    raises it."""
    if str(source) == "-":
        data = sys.stdin.buffer.read(limit + 1)
    else:
        with opener(source, "rb") as fh:
            data = fh.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"larger than {limit >> 20} MiB" if limit >= 1 << 20 else f"larger than {limit} bytes")
    return data
