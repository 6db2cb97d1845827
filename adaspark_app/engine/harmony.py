"""gpt-oss's harmony format: its replies' channels as thinking and answer.

A gpt-oss reply is a sequence of messages, each a header and a body between control tokens:

    <|channel|>analysis<|message|>We need to add 2 and 2.<|end|>
    <|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>

The template's prompt ends with `<|start|>assistant`, so the reply starts at its first channel.
llama.cpp writes these markers into a reply's text (llama-vocab.cpp makes `<|start|>`,
`<|channel|>`, `<|message|>` and gpt-oss's `<|end|>` user-defined tokens, which render), so the
chat showed them raw, and the reply sent back as history made the template raise: it refuses
`<|channel|>` tags in a message's content. (A llama.cpp that kept them control tokens would
write `analysisWe need to add 2 and 2.assistantfinal2 + 2 = 4.` instead.)

Here the reply's text is written as every other reasoning model's is (thinking.py): the analysis
and commentary channels' bodies between `<think>` and `</think>`, the final channel's body after
it, headers dropped. `HarmonyText` does it token by token, so the stream, the stored reply and
`adaspark run`'s output agree, and both arms of a comparison see the same text. A harmony
template gets each earlier reply's answer alone (`history_messages`): the template keeps no
earlier thinking either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..thinking import CLOSE, OPEN, answer_of

START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
FINAL = "final"  # the channel of the answer; analysis and commentary are thinking


def is_harmony_template(source: str) -> bool:
    """Whether a chat template writes harmony messages (gpt-oss's)."""
    return f"{CHANNEL}final{MESSAGE}" in source


def history_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with each assistant reply's content its answer alone (no `<think>` part)."""
    out = []
    for m in messages:
        content = str(m.get("content", ""))
        if m.get("role") == "assistant" and (OPEN in content or CLOSE in content):
            m = {**m, "content": answer_of(content)}
        out.append(m)
    return out


@dataclass(frozen=True)
class HarmonyTokens:
    """The ids of the four harmony markers in a vocabulary (special tokens: control or user-defined)."""

    start: int
    channel: int
    message: int
    end: int


def harmony_tokens(tokenize: Callable[[str], list[int]], is_special: Callable[[int], bool]) -> HarmonyTokens | None:
    """The vocabulary's harmony tokens, or None where any of the four markers is not one special
    token (control or user-defined) when `tokenize` parses special tokens."""
    ids = []
    for marker in (START, CHANNEL, MESSAGE, END):
        toks = tokenize(marker)
        if len(toks) != 1 or not is_special(toks[0]):
            return None
        ids.append(toks[0])
    return HarmonyTokens(*ids)


class HarmonyText:
    """A harmony reply's tokens as text (the module docstring): `pieces` for each batch of
    committed tokens, in order. Headers are held back and dropped; bodies pass through."""

    def __init__(self, ids: HarmonyTokens, token_bytes: Callable[[int], bytes]) -> None:
        self.ids = ids
        self.token_bytes = token_bytes
        self._in_header = False
        self._header = bytearray()  # the text after the header's last channel token
        self._thinking = False  # a <think> written and not yet closed
        self._bodies = 0  # message bodies begun

    def pieces(self, tokens: Sequence[int]) -> bytes:
        """The text of `tokens`, continuing the reply."""
        out = bytearray()
        ids = self.ids
        for t in tokens:
            if t == ids.start or t == ids.channel:  # a header begins, or its channel name
                self._in_header, self._header = True, bytearray()
            elif t == ids.message:
                out += self._open_body()
            elif t == ids.end:
                self._in_header = False
            elif self._in_header:
                self._header += self.token_bytes(t)
            else:
                out += self.token_bytes(t)
        return bytes(out)

    def _open_body(self) -> bytes:
        """What a body begins with: `<think>` for the first thinking message, `</think>` for the
        answer after thinking, else a blank line between two messages of the same part."""
        channel = self._header.decode("utf-8", "replace").split()
        self._in_header, self._header = False, bytearray()
        first, self._bodies = self._bodies == 0, self._bodies + 1
        thinking = bool(channel) and channel[0] != FINAL
        if thinking and first:
            self._thinking = True
            return OPEN.encode()
        if not thinking and self._thinking:
            self._thinking = False
            return CLOSE.encode()
        return b"" if first else b"\n\n"
