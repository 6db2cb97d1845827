"""UTF-8-safe incremental detokenisation for streaming."""

from __future__ import annotations

import codecs
from typing import Callable, Sequence


def joined(token_bytes: Callable[[int], bytes]) -> Callable[[Sequence[int]], bytes]:
    """The bytes of a batch of tokens, each token's in turn (a plain reply's format)."""
    return lambda tokens: b"".join(token_bytes(t) for t in tokens)


class StreamDecoder:
    """Turns a reply's bytes into text, holding back an incomplete UTF-8 sequence until it
    completes. ``to_bytes`` makes the bytes of each batch of committed tokens: ``joined`` for a
    plain reply, ``harmony.HarmonyText.pieces`` for gpt-oss's format."""

    def __init__(self, to_bytes: Callable[[Sequence[int]], bytes]) -> None:
        self._to_bytes = to_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def push(self, tokens: list[int]) -> str:
        """Feed committed tokens; return the newly complete text."""
        out = self._decoder.decode(self._to_bytes(tokens))
        self.text += out
        return out

    def flush(self) -> str:
        out = self._decoder.decode(b"", final=True)
        self.text += out
        return out
