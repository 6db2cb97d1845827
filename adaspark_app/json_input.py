"""JSON from files the user hands us: scripts, rounds logs, store exports, another app's settings.

JSON's `\\uXXXX` escapes can spell a lone UTF-16 surrogate (`"\\ud800"`). Python's json keeps it
in the string, and nothing that writes UTF-8 accepts it afterwards: llama.cpp's tokenizer, SQLite
and the terminal each raised UnicodeEncodeError, a traceback. `loads` refuses such a document
where it is read, with the usual JSONDecodeError naming the place.
"""

from __future__ import annotations

import json
from typing import Any


def loads(text: str) -> Any:
    """json.loads, and json.JSONDecodeError for a string (a value or a key) holding a lone
    surrogate, at the first place its escape appears in `text`."""
    value = json.loads(text)
    bad = lone_surrogate(value)
    if bad is not None:
        escape = f"\\u{ord(bad):04x}"
        raise json.JSONDecodeError(f"a lone surrogate {escape} in a string", text, max(text.lower().find(escape), 0))
    return value


def lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in any string of a decoded JSON value, or None (iterative: a
    value nested as deep as json allows does not reach the recursion limit here)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return item[exc.start]
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None
