"""The conversation: one `ChatMessage` per message in a scroll view that follows the bottom
only while the reader is near it."""

from __future__ import annotations

from markdown_it import MarkdownIt
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, Markdown, Static
from textual.widgets.markdown import MarkdownStream

ROLE_LABELS = {"user": "You", "assistant": "Assistant", "system": "System"}
# Code-fence languages whose highlighter is built before the first reply (see warm_up).
WARM_LANGUAGES = ("python", "bash", "javascript", "typescript", "json", "c", "cpp", "rust", "java", "go",
                  "html", "sql", "yaml")
_PARSER: MarkdownIt | None = None


def shared_parser() -> MarkdownIt:
    """One Markdown parser for every message: Textual's Markdown builds one per append otherwise
    (parsing is stateless between calls; UI thread only)."""
    global _PARSER
    if _PARSER is None:
        _PARSER = MarkdownIt("gfm-like")
    return _PARSER


def warm_up(language: str) -> None:
    """Build `language`'s highlighter now, while the model loads. Pygments compiles a lexer's
    rules on its first use (Python's: ~20 ms), which would otherwise land in the first reply
    with a code block, when every UI cycle is taken from the decode."""
    from textual.highlight import highlight

    highlight("x = 1\n", language=language)


class ChatMessage(Vertical):
    """One message: a role line and a Markdown body (code fences are syntax-highlighted).

    An assistant message under generation is streamed through Textual's `MarkdownStream`,
    which coalesces fragments when they come faster than the widget can re-render.
    """

    DEFAULT_CSS = """
    ChatMessage {
        height: auto;
        margin: 0 0 1 0;
        padding: 0 1;
    }
    ChatMessage.user { border-left: thick $accent; background: $boost; }
    ChatMessage.assistant { border-left: thick $primary; }
    ChatMessage.system { border-left: thick $warning; color: $text-muted; }
    ChatMessage > .role { color: $text-muted; text-style: bold; }
    ChatMessage > .note { color: $text-muted; text-style: italic; height: auto; }
    ChatMessage > Markdown { margin: 0; padding: 0 1; }
    ChatMessage > .plain { padding: 0 1; height: auto; }
    ChatMessage > Markdown > MarkdownParagraph { margin: 0; }
    """

    def __init__(self, role: str, content: str = "", note: str = "", **kwargs) -> None:
        super().__init__(classes=role, **kwargs)
        self.role = role
        self._initial = content
        self._note = note
        self._stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        yield Label(ROLE_LABELS.get(self.role, self.role.title()), classes="role")
        if self.role == "assistant":
            yield Markdown(self._initial, parser_factory=shared_parser)
        else:
            # What the user typed, as typed: line breaks kept, nothing interpreted.
            yield Static(Text(self._initial), classes="plain")
        yield Label(self._note, classes="note")

    def on_mount(self) -> None:
        self.query_one(".note", Label).display = bool(self._note)

    @property
    def body(self) -> Markdown:
        return self.query_one(Markdown)

    @property
    def text(self) -> str:
        """The text shown so far (the Markdown source for a reply)."""
        if self.role != "assistant":
            return self._initial
        return self.body.source

    async def write(self, fragment: str) -> None:
        """Append streamed text (UI thread)."""
        if not fragment:
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self.body)
        await self._stream.write(fragment)

    async def finish(self, note: str = "") -> None:
        """End the stream (all written text is rendered) and show a note under the message."""
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.set_note(note)

    def set_note(self, note: str) -> None:
        self._note = note
        label = self.query_one(".note", Label)
        label.update(note)
        label.display = bool(note)


def context_marker_text(dropped_turns: int, capped_to: int | None = None) -> str:
    """What the marker above a reply says: the turns the engine left out of its prompt, and the
    cap the context set on it ('' when neither happened)."""
    parts = []
    if dropped_turns > 0:
        turns = "1 earlier turn is" if dropped_turns == 1 else f"{dropped_turns} earlier turns are"
        parts.append(f"{turns} out of the context window")
    if capped_to is not None:
        parts.append(f"the context had room for {capped_to} tokens of this reply")
    return " · ".join(parts)


class ContextMarker(Static):
    """A line above a reply whose prompt left out the oldest turns (engine/context_window.py).

    Mounted inside the reply's ChatMessage, above its role line, so it goes with the reply when
    that is removed (regenerated, or dropped by an edit)."""

    DEFAULT_CSS = """
    ContextMarker { color: $warning; text-style: italic; height: auto; }
    """


class ChatView(VerticalScroll):
    """The messages. Follows the bottom while the view is within NEAR_BOTTOM lines of it.

    Built on Textual's anchoring (the compositor keeps an anchored view at the bottom as content
    grows, and a scroll by the reader releases it). On top of that: a scroll that ends within
    NEAR_BOTTOM lines of the end, or any downward scroll into that band, follows again, so a
    reader is never yanked away from what they read and never has to hit the exact last line.
    """

    NEAR_BOTTOM = 2

    DEFAULT_CSS = """
    ChatView { height: 1fr; padding: 0 1; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.following = True

    def on_mount(self) -> None:
        self.anchor()

    def anchor(self, anchor: bool = True) -> None:
        super().anchor(anchor)
        self.following = anchor

    def release_anchor(self) -> None:
        """Called by Textual when the reader scrolls (wheel, keys, scrollbar)."""
        super().release_anchor()
        self.following = False
        # The scroll's destination is known after this call returns; if it is near the end
        # (e.g. the wheel turned down at the bottom), keep following.
        self.call_after_refresh(self._follow_if_near)

    def _follow_if_near(self) -> None:
        if not self.following and self.max_scroll_y - self.scroll_target_y <= self.NEAR_BOTTOM:
            self.anchor()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self.following or not self.is_anchored:
            return
        if new_value >= self.max_scroll_y:  # Textual itself re-anchors at the very end
            self.following = True
        elif new_value > old_value and self.max_scroll_y - new_value <= self.NEAR_BOTTOM:
            self.anchor()

    async def add_message(self, role: str, content: str = "", note: str = "") -> ChatMessage:
        message = ChatMessage(role, content, note)
        await self.mount(message)
        if self.following:
            self.scroll_end(animate=False)
        return message

    async def clear(self) -> None:
        await self.remove_children()
        self.anchor()

    def messages(self) -> list[ChatMessage]:
        return list(self.query(ChatMessage))

    async def mark_context(self, message: ChatMessage, dropped_turns: int, capped_to: int | None = None) -> None:
        """Show above `message` that its prompt left out `dropped_turns` earlier turns (and the
        cap the context set on it); nothing if neither. Marking again replaces the marker."""
        text = context_marker_text(dropped_turns, capped_to)
        for old in message.query(ContextMarker):
            await old.remove()
        if not text:
            return
        children = list(message.children)
        await message.mount(ContextMarker(Text(f"⋯ {text}")), before=children[0] if children else None)
        if self.following:
            self.scroll_end(animate=False)
