"""Which messages of a conversation go into the prompt: the context window rule of `chat` and `run`.

Pure: no llama.cpp here. The engine passes a token counter (its chat template and tokenizer), the
context size and the reply's token cap; tests pass synthetic counters with known answers.

The rule (shared/DESIGN.md, "A conversation longer than the context drops its oldest turns"):

* A *turn* is a user message and the messages after it up to the next user message (its
  reply). Messages before the first user message, other than a leading system prompt, form a
  turn of their own. The leading system prompt always stays; the newest user message always
  stays.
* The prompt fits when prompt tokens + the reply's max tokens <= n_ctx - 1 (the decoder keeps
  one cell free: it stops at context n_ctx - 1).
* When the whole history does not fit, the oldest turns are dropped, in blocks of about
  `n_ctx // DROP_BLOCK_DIVISOR` tokens of history, until it fits. Why blocks: the prompt's
  prefix changes with every drop, and everything after the changed part is prefilled again.
  Dropping exactly what is needed moves the window's start on every turn once the conversation
  is full, so every turn would prefill the whole history again. Block edges are fixed by the
  turns' own sizes, counted from the conversation's start, so they do not move as new turns
  are added: between two drops the kept prefix stays the same and the KV cache holds all of it.
  At most about one block (plus one turn) more is dropped than the least that would fit.
* If the system prompt and the newest user message fit but leave less than max_tokens for the
  reply, every earlier turn is dropped and the reply is capped to what fits (`reply_tokens`
  below max_tokens, `capped`), provided at least min(max_tokens, MIN_REPLY_TOKENS) remain.
  Otherwise the message is refused with MessageTooLongError and nothing is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import MessageTooLongError

Message = dict[str, str]

#: The decoder stops a reply when the context reaches n_ctx - 1 (decoder.run_reply).
RESERVED_CELLS = 1
#: A message that leaves less room than this for its reply is refused (or max_tokens if smaller).
MIN_REPLY_TOKENS = 16
#: History is dropped in blocks of about n_ctx // this many tokens (see the module docstring).
DROP_BLOCK_DIVISOR = 8


@dataclass(frozen=True)
class Window:
    """The messages that go into the prompt, and what was left out."""

    messages: list[Message]  # the leading system prompt, the kept turns, the newest user message
    dropped_turns: int  # oldest turns left out
    prompt_tokens: int  # tokens of the prompt built from `messages`
    reply_tokens: int  # tokens the reply may emit: max_tokens, or less if `capped`
    capped: bool  # the context left less than max_tokens for the reply


def split_turns(messages: Sequence[Message]) -> tuple[list[Message], list[list[Message]], Message]:
    """(leading system messages, earlier turns oldest first, the newest user message)."""
    if not messages or messages[-1].get("role") != "user":
        raise ValueError("the conversation must end with the user's message")
    head = 0
    while head < len(messages) - 1 and messages[head].get("role") == "system":
        head += 1
    system = list(messages[:head])
    turns: list[list[Message]] = []
    for m in messages[head:-1]:
        if m.get("role") == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return system, turns, messages[-1]


def block_cuts(turn_sizes: Sequence[int], block: int) -> list[int]:
    """Where the window may start: 0, then for j = 1, 2, ... the fewest oldest turns whose sizes
    sum to at least j * block, and finally all of them. Sorted, without repeats.

    The cuts depend only on the sizes of the turns before them, so appending turns keeps every
    cut already there (the kept prefix is stable between drops)."""
    n = len(turn_sizes)
    cuts = [0]
    if block <= 0:
        return list(range(n + 1))
    total = 0
    for i, size in enumerate(turn_sizes, start=1):
        before = total
        total += max(0, size)
        if total // block > before // block:  # this turn crosses a block edge: a cut after it
            cuts.append(i)
    if cuts[-1] != n:
        cuts.append(n)
    return cuts


def fit_messages(messages: Sequence[Message], count_tokens: Callable[[list[Message]], int], n_ctx: int,
                 max_tokens: int, turn_size: Callable[[list[Message]], int] | None = None,
                 block: int | None = None) -> Window:
    """The window of `messages` (system first if present, the user's new message last) for a
    reply of up to `max_tokens` in a context of `n_ctx` tokens; see the module docstring.

    count_tokens(messages) is the exact prompt length of a message list (the template rendered
    and tokenised). turn_size(turn) sizes a turn for the block edges (default: count_tokens of
    the turn alone); block defaults to n_ctx // DROP_BLOCK_DIVISOR, and 1 drops exactly as few
    turns as fit. Raises MessageTooLongError when even the system prompt and the new message
    leave less than min(max_tokens, MIN_REPLY_TOKENS) tokens for a reply.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    system, turns, last = split_turns(messages)
    limit = n_ctx - RESERVED_CELLS
    counted: dict[int, int] = {}

    def kept(k: int) -> list[Message]:
        return [*system, *(m for t in turns[k:] for m in t), last]

    def tokens(k: int) -> int:
        if k not in counted:
            counted[k] = count_tokens(kept(k))
        return counted[k]

    def fits(k: int) -> bool:
        return tokens(k) + max_tokens <= limit

    if fits(0):  # the common case: one count, nothing dropped
        return Window(kept(0), 0, tokens(0), max_tokens, False)
    n = len(turns)
    if n and fits(n):
        size = turn_size or count_tokens
        cuts = block_cuts([size(t) for t in turns], n_ctx // DROP_BLOCK_DIVISOR if block is None else block)
        # Dropping more turns never lengthens the prompt, so the first cut that fits is found by
        # bisection (a template that breaks this still gets a cut that fits: cuts[hi] fits).
        lo, hi = 0, len(cuts) - 1  # cuts[lo] = 0 does not fit, cuts[hi] = n does
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(cuts[mid]):
                hi = mid
            else:
                lo = mid
        k = cuts[hi]
        return Window(kept(k), k, tokens(k), max_tokens, False)
    # Even the system prompt with the new message alone leaves less than max_tokens.
    room = limit - tokens(n)
    need = min(max_tokens, MIN_REPLY_TOKENS)
    if room < need:
        raise MessageTooLongError(tokens(n), n_ctx, need)
    return Window(kept(n), n, tokens(n), room, True)
