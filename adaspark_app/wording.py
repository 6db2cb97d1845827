"""Words for messages and reports: counts ('1 token', '2 tokens', '3 replies'), and text made safe
to print on a terminal."""

from __future__ import annotations

import re

# Control characters but tab and line feed: ESC, BEL, CR, DEL, the C1 controls; and lone
# surrogates (a file name's byte that is not UTF-8 reaches Python as one), which no UTF-8 stream
# can write.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n` and `noun`, plural unless `n` is 1 (`plural`, else the noun with an s)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def printable(text: str) -> str:
    """`text` with its control characters written as escapes ('\\x1b', a surrogate '\\udcff'), so
    that printing a file name, a GGUF's metadata or a model's words cannot send the terminal a
    command, nor fail to encode."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                         text)


def one_line(text: str) -> str:
    """``printable(text)`` with its line feeds written as ``\\n`` too: an error or a note that
    names a path, a GGUF's tensor or a user's words stays the one line it is meant to be."""
    return printable(text).replace("\n", "\\n")
