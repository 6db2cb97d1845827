"""UTF-8-safe incremental detokenisation for streaming."""

from __future__ import annotations

import codecs
from typing import Callable


class StreamDecoder:
    """Turns token bytes into text, holding back an incomplete UTF-8 sequence until it completes."""

    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def push(self, tokens: list[int]) -> str:
        """Feed committed tokens; return the newly complete text."""
        data = b"".join(self._token_bytes(t) for t in tokens)
        out = self._decoder.decode(data)
        self.text += out
        return out

    def flush(self) -> str:
        out = self._decoder.decode(b"", final=True)
        self.text += out
        return out
