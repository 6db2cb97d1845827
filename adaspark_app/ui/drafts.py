"""The message box's unsent text, per conversation, kept in the store as it is typed
(`Store.save_draft`), so quitting, a kill, or a switch to another conversation loses none of it:
the chat screen saves it at most SAVE_INTERVAL_S after a change and before every switch, and
puts a conversation's draft back in the box when it opens it. No Textual."""

from __future__ import annotations

from typing import Protocol

from ..errors import AdaSparkError

SAVE_INTERVAL_S = 1.0  # what a kill loses at most of what was typed


class DraftStore(Protocol):
    def save_draft(self, conversation_id: str | None, text: str) -> None: ...

    def draft(self, conversation_id: str | None) -> str: ...


class DraftKeeper:
    """Drafts read and written through the store, each write only when the text changed."""

    def __init__(self, store: DraftStore) -> None:
        self.store = store
        self._known: dict[str, str] = {}  # the text the store holds, per conversation ('' new)
        self._unsaved: dict[str, tuple[str, str]] = {}  # text the store refused, and why

    def unsaved(self) -> list[tuple[str, str]]:
        """(text, why) of each draft the store refused at its last save (a full disk): the chat
        prints them when it ends, so they are not lost with it."""
        return [kept for kept in self._unsaved.values() if kept[0].strip()]

    def load(self, conversation_id: str | None) -> str:
        """The conversation's draft (None: a new conversation's); '' when the store fails."""
        try:
            text = self.store.draft(conversation_id)
        except AdaSparkError:
            return ""
        self._known[conversation_id or ""] = text
        return text

    def save(self, conversation_id: str | None, text: str) -> None:
        """Keep `text` as the conversation's draft ('' forgets it). A store that refuses is
        tried again at the next save; until one succeeds, `unsaved` holds the text."""
        key = conversation_id or ""
        if self._known.get(key) == text:
            return
        try:
            self.store.save_draft(conversation_id, text)
        except AdaSparkError as err:
            self._unsaved[key] = (text, str(err))
            return
        self._unsaved.pop(key, None)
        self._known[key] = text
