"""What a chat killed mid-reply left in the store, kept by the next chat.

The chat writes its reply in flight to the store as it streams (`Conversation.begin_in_flight`,
`Store.begin_reply`); recording or withdrawing the reply deletes that row. A row left behind is a
chat that ended without either (SIGKILL, a crash): at start the chat keeps its message and text
here, once the process that wrote it is gone (`store/owner.py`), and says so. No Textual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..store.owner import owner_alive
from ..wording import counted
from .conversation import CHAT_ENDED, ENGINE_DIED, ChatStore

# Another host's reply in flight (a store on a shared disk) not written for this long: its chat
# has gone (a live one writes its text every IN_FLIGHT_INTERVAL_S, ui/screens/replies.py).
STALE_IN_FLIGHT_S = 600.0


@dataclass
class Settled:
    """A reply in flight that a chat left behind, as the next chat kept it (`settle_cut_replies`)."""

    conversation_id: str
    prompt: str | None  # the message it answered, kept (None: a regenerate)
    replied: bool  # text had arrived: it is kept as a stopped reply
    n_tokens: int  # the tokens of that text, as its meta counts them (0: not counted)


def settle_cut_replies(store: ChatStore, alive: Callable[[str], bool | None] = owner_alive) -> list[Settled]:
    """Keep the replies in flight whose chat has gone (killed mid-reply, a crash) as that
    chat would have kept them on a stop: the new message, and the text so far as a stopped reply
    (its meta says CHAT_ENDED), in place of the turns it was replacing. A regenerate with no text
    yet leaves the previous reply; a message with none is kept on its own (regenerate answers it).
    A reply whose chat still runs (`alive`) is left to it. AdaSparkError from the store."""
    settled: list[Settled] = []
    for row in store.replies_in_flight():
        live = alive(str(row.get("owner")))
        if live is None:  # another host's chat: gone once it stopped writing
            live = _age_s(row.get("updated")) < STALE_IN_FLIGHT_S
        if live:
            continue
        prompt = row["prompt"] if isinstance(row.get("prompt"), str) else None
        text = row["content"] if isinstance(row.get("content"), str) else ""
        new: list[tuple[str, str, dict[str, Any] | None]] = [] if prompt is None else [("user", prompt, None)]
        n_tokens = 0
        if text.strip():
            meta = {**row["meta"], "stopped": True, CHAT_ENDED: True}
            meta.pop(ENGINE_DIED, None)
            n = meta.get("n_tokens")
            n_tokens = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
            new.append(("assistant", text, meta))
        if store.settle_reply(row["id"], new):
            settled.append(Settled(row["conversation_id"], prompt, bool(text.strip()), n_tokens))
    return settled


def settled_notice(settled: list[Settled]) -> str:
    """What the chat says at start of the replies it kept for a chat that ended mid-reply."""
    where = "in the first conversation of the list (Ctrl+B)"
    if len(settled) > 1:
        return (f"{len(settled)} replies were cut short when a chat ended. Their messages and the text "
                "generated so far are kept, in the first conversations of the list (Ctrl+B).")
    s = settled[0]
    tokens = f"the {counted(s.n_tokens, 'token')}" if s.n_tokens else "the text"
    tokens += " generated so far"
    if s.prompt is None:
        verb = "is" if s.n_tokens <= 1 else "are"
        return f"The chat ended during a regenerated reply last time. {tokens.capitalize()} {verb} kept, {where}."
    if not s.replied:
        return f"The chat ended before its reply to your last message began. The message is kept, {where}: F5 answers it."
    return f"The chat ended during a reply last time. Your message and {tokens} are kept, {where}."


def _age_s(iso: Any) -> float:
    """Seconds since the store's timestamp `iso` (infinite when it cannot be read)."""
    try:
        then = datetime.fromisoformat(str(iso))
    except ValueError:
        return float("inf")
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    return (datetime.now(timezone.utc) - then).total_seconds()
