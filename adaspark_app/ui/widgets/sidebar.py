"""The conversations sidebar: a search box over the stored conversations, newest first."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, OptionList
from textual.widgets.option_list import Option

from ...errors import AdaSparkError
from ...wording import counted
from ..conversation import ChatStore


def _when(updated: str | None) -> str:
    """'2025-01-31T12:34:56…' -> '01-31 12:34' (compact, sortable at a glance)."""
    if not updated or len(updated) < 16:
        return updated or ""
    return f"{updated[5:10]} {updated[11:16]}"


class ConversationList(OptionList):
    """The list itself; Delete / F2 act on the highlighted conversation."""

    BINDINGS = [
        Binding("delete", "screen.delete_chat", "Delete", show=False, id="sidebar_delete"),
    ]


class ConversationSidebar(Vertical):
    """Lists the store's conversations (`store`, set by the screen), those matching the search as
    you type; posts `Selected` when one is chosen."""

    DEFAULT_CSS = """
    ConversationSidebar {
        width: 34;
        height: 1fr;
        border: round $secondary;
        border-title-align: left;
    }
    ConversationSidebar > Input { margin: 0 0 1 0; }
    ConversationSidebar > ConversationList { height: 1fr; border: none; }
    """

    class Selected(Message):
        def __init__(self, conversation_id: str) -> None:
            super().__init__()
            self.conversation_id = conversation_id

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "Conversations"
        self.conversations: list[dict[str, Any]] = []
        self.store: ChatStore | None = None
        self.current: str | None = None  # the open conversation (bold and highlighted)

    def compose(self) -> ComposeResult:
        yield Input(placeholder="Search…", id="search")
        yield ConversationList(id="conversations")

    @property
    def search_text(self) -> str:
        return self.query_one("#search", Input).value

    @property
    def option_list(self) -> ConversationList:
        return self.query_one(ConversationList)

    def reload(self, current: str | None) -> None:
        """List the store's conversations that match the search; `current` is the open one."""
        self.current = current
        if self.store is None:
            return
        try:
            rows = self.store.list_conversations(search=self.search_text or None)
        except AdaSparkError as err:
            self.notify(str(err), title="Store", severity="error")
            return
        self.show(rows, current)

    def rename(self, conversation_id: str, title: str | None) -> None:
        """Rename a conversation (a blank `title`: leave it) and say so."""
        if not title or self.store is None:
            return
        try:
            self.store.rename_conversation(conversation_id, title)
        except AdaSparkError as err:
            self.notify(str(err), title="Store", severity="error")
            return
        self.reload(self.current)
        self.notify(f"Renamed to “{self.title_of(conversation_id) or title}”.")

    def show(self, conversations: list[dict[str, Any]], current: str | None) -> None:
        """Replace the listed conversations ([{id, title, updated, n_messages}])."""
        self.conversations = conversations
        ol = self.option_list
        previous = self.highlighted_id()
        ol.clear_options()
        options = []
        for c in conversations:
            label = Text(c.get("title") or "Untitled", style="bold" if c["id"] == current else "")
            label.append(f"\n{_when(c.get('updated'))} · {counted(c.get('n_messages', 0), 'msg')}", style="dim")
            options.append(Option(label, id=c["id"]))
        ol.add_options(options)
        ids = [c["id"] for c in conversations]
        if current in ids:
            ol.highlighted = ids.index(current)
        elif previous in ids:
            ol.highlighted = ids.index(previous)
        elif ids:
            ol.highlighted = 0
        self.border_subtitle = f"{len(conversations)}"

    def highlighted_id(self) -> str | None:
        ol = self.option_list
        if ol.highlighted is None or ol.option_count == 0:
            return None
        return ol.get_option_at_index(ol.highlighted).id

    def title_of(self, conversation_id: str | None) -> str | None:
        for c in self.conversations:
            if c["id"] == conversation_id:
                return c.get("title")
        return None

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.Selected(event.option.id))

    @on(Input.Changed, "#search")
    def _search_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.reload(self.current)

    @on(Input.Submitted, "#search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.option_list.focus()
