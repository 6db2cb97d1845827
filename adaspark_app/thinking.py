"""A reasoning model's thinking in a reply: the text between `<think>` and `</think>`.

Reasoning models (Qwen3, DeepSeek-R1 and its distills, SmolLM3, GLM, Phi-4-reasoning) write
their thinking before the answer, between these tags. Their tokens are ordinary text to the
engine (the reply, stored and sent back as history, keeps them; the models' own templates drop
the thinking of earlier turns). The chat shows the thinking apart from the answer, dimmed and
folded once the answer starts, and copies, saves and exports the answer as the answer.

Two ways a reply thinks:
- it starts with `<think>` (after white space);
- its prompt opened the thinking: the template's generation prompt ends with `<think>` (the
  DeepSeek-R1 distills'), so the reply starts inside it and only closes it. The engine says so
  when it loads (`ChatEngine.opens_thinking`). A stored reply shows it by a `</think>` on a line of
  its own or at its start, with no `<think>` and no code fence before it.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN = "<think>"
CLOSE = "</think>"


@dataclass(frozen=True)
class Split:
    """A reply's text, its thinking apart: `thinking` None where the reply has none; `closed`
    whether the thinking ended (False: the reply stopped, or is still streaming, inside it)."""

    thinking: str | None
    answer: str
    closed: bool = True


def split_thinking(text: str, opened: bool = False) -> Split:
    """`text` (a reply) as its thinking and its answer. `opened`: the reply's prompt opened the
    thinking (see the module docstring); without it a reply closing a thinking it never opened
    still counts as one where the close stands at a line's start, after no fence."""
    head = text.lstrip()
    if head.startswith(OPEN):
        body = head[len(OPEN):]
    elif opened or _closes_unopened(text):
        body = text
    else:
        return Split(None, text)
    end = body.find(CLOSE)
    if end < 0:
        return Split(body.strip(), "", closed=False)
    return Split(body[:end].strip(), body[end + len(CLOSE):].lstrip())


def answer_of(text: str) -> str:
    """A reply's answer: its text less the thinking (the whole text where it has none)."""
    return split_thinking(text).answer


def _closes_unopened(text: str) -> bool:
    end = text.find(CLOSE)
    if end < 0:
        return False
    before = text[:end]
    at_line_start = end == 0 or before.endswith("\n") or not before.strip()
    return at_line_start and OPEN not in before and "```" not in before and "~~~" not in before


def thinking_title(thinking: str, closed: bool, streaming: bool = False) -> str:
    """The fold's title: 'Thinking…' while it streams, else how long the thinking was."""
    if streaming:
        return "Thinking…"
    words = len(thinking.split())
    size = f"{words:,} word{'s' if words != 1 else ''}"
    return f"Thought ({size})" if closed else f"Thinking, stopped ({size})"
