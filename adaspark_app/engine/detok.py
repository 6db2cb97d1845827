"""UTF-8-safe incremental detokenisation for streaming."""

from __future__ import annotations

import codecs
from typing import Callable, Sequence


class StreamDecoder:
    """Turns token bytes into text, holding back an incomplete UTF-8 sequence until it completes.
    `pieces`, where given, makes the bytes of each batch of tokens in its place (a reply's format:
    harmony.HarmonyText)."""

    def __init__(self, token_bytes: Callable[[int], bytes],
                 pieces: Callable[[Sequence[int]], bytes] | None = None) -> None:
        self._token_bytes = token_bytes
        self._pieces = pieces
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def push(self, tokens: list[int]) -> str:
        """Feed committed tokens; return the newly complete text."""
        if self._pieces is not None:
            data = self._pieces(tokens)
        else:
            data = b"".join(self._token_bytes(t) for t in tokens)
        out = self._decoder.decode(data)
        self.text += out
        return out

    def flush(self) -> str:
        out = self._decoder.decode(b"", final=True)
        self.text += out
        return out
