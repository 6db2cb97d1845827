"""The conversation: one `ChatMessage` per message in a scroll view that follows the bottom
only while the reader is near it."""

from __future__ import annotations

import time
from typing import Any

from markdown_it import MarkdownIt
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Collapsible, Label, Markdown, Static

from ...thinking import CLOSE, OPEN, split_thinking, thinking_title
from ..conversation import Turn, context_marks, reply_note
from ..settled import settled_length
from ..stats import SpecStats
from .reply_stream import ReplyStream
from .spec_panel import SpecPanel
from .stream_tail import StreamTail

ROLE_LABELS = {"user": "You", "assistant": "Assistant", "system": "System"}
# A stored conversation opens with its last SHOWN_AT_OPEN messages (about 8 ms each to lay out);
# the earlier ones are shown SHOWN_AT_OPEN at a time when the reader scrolls to the top or clicks
# the line above them, and all at once when an edit or a reply needs one of them.
SHOWN_AT_OPEN = 60
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


class ThinkingBlock(Collapsible):
    """A reasoning model's thinking (adaspark_app/thinking.py), above its answer: open while it
    streams, folded to its title ('Thought (412 words)') once the answer starts; a click or Enter
    on the title shows it again. Plain text, dimmed: it is the model's notes, not its answer."""

    DEFAULT_CSS = """
    ThinkingBlock { margin: 0 0 1 0; padding: 0; border: none; background: transparent; }
    ThinkingBlock > Contents { padding: 0 0 0 2; }
    ThinkingBlock CollapsibleTitle { color: $text-muted; padding: 0 1; }
    ThinkingBlock .thinking-text { color: $text-muted; text-style: italic; }
    """

    def __init__(self, text: str = "", *, collapsed: bool, title: str) -> None:
        self.text = text
        self.body = Static(Text(text), classes="thinking-text")
        self.body.display = bool(text)  # while the first paragraph streams, it is in the tail below
        super().__init__(self.body, title=title, collapsed=collapsed)

    def set_text(self, text: str) -> None:
        self.text = text
        self.body.update(Text(text))
        self.body.display = bool(text)


# A streaming reply's thinking, as far as its text tells (ChatMessage.write).
UNDECIDED, THINKING, ANSWERING = "undecided", "thinking", "answering"


class ChatMessage(Vertical):
    """One message: a role line and a Markdown body (code fences are syntax-highlighted).

    A reply under generation shows its text as plain text (the "tail", with a page of room kept
    below it) under the Markdown of what was settled before (`settled.settled_length`): most
    frames repaint the tail's changed rows alone. When the tail outgrows its room it turns a page
    within itself while the reader follows the end (keeping KEEP_LINES of the last page at the
    top); if the reader has scrolled up, its settled blocks join the Markdown instead (and every
    COMMIT_S). When the reply ends, the tail joins the Markdown.

    Why pages: each time the tail's room is renewed the view moves, and Textual re-renders the
    whole chat column (~30 ms on a 160x48 screen), taken from a verify on two cores. Room of a
    third of the view renewed it 3-4 times in a 512-token reply; a page's worth once; a page
    turned inside the tail never (`write`).

    A reply under generation owns its `ReplyStream` (`start_stream`), which paces the frames
    that write to it.

    A reasoning model's thinking (adaspark_app/thinking.py) goes to a `ThinkingBlock` above the
    Markdown: while it streams, the tail shows it dimmed and its settled paragraphs join the
    block; at `</think>` the block folds and the answer streams into the tail as any reply does.
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
    ChatMessage > .note { color: $text-muted; text-style: italic; width: 1fr; height: auto; }
    ChatMessage > Markdown { margin: 0; padding: 0 1; }
    ChatMessage > .plain { padding: 0 1; height: auto; }
    ChatMessage > .tail { padding: 0 1; height: auto; }
    ChatMessage > .tail.thinking { color: $text-muted; text-style: italic; }
    ChatMessage > Markdown > MarkdownParagraph { margin: 0; }
    ChatMessage MarkdownFence { overflow-x: auto; scrollbar-size-horizontal: 1; }
    """

    HEADROOM_MIN = 6  # lines of room given to the tail at a time, at least (else a page of the view)
    KEEP_LINES = 3  # lines of the previous page left in sight when the tail turns a page
    # While the reader is away from the end, settled blocks move from the plain tail to the
    # Markdown at least this often: a move is one layout (~30 ms), under 0.5% of a core.
    COMMIT_S = 6.0

    def __init__(self, role: str, content: str = "", note: str = "", *, opened_thinking: bool = False,
                 **kwargs) -> None:
        super().__init__(classes=role, **kwargs)
        self.role = role
        self._initial = content
        # a streaming reply: whether its prompt opened the thinking, where its text is in it,
        # and the thinking settled so far (the block's text)
        self._opened_thinking = opened_thinking
        self._phase = UNDECIDED
        self._thinking = ""
        self._block: ThinkingBlock | None = None
        self._note = note
        self._text = content  # everything shown (the Markdown source of a reply)
        self._tail = ""  # a streaming reply's text not yet in the Markdown widget
        self._committed_at = float("-inf")  # monotonic time the Markdown last grew
        self._reserved = 0  # the tail's min-height while the reply streams (see write)
        self.stream: ReplyStream | None = None  # while a reply streams into this message

    def compose(self) -> ComposeResult:
        yield Label(ROLE_LABELS.get(self.role, self.role.title()), classes="role", markup=False)
        if self.role == "assistant":
            split = split_thinking(self._initial)
            if split.thinking is not None:
                self._phase, self._thinking = ANSWERING, split.thinking
                self._block = ThinkingBlock(split.thinking, collapsed=bool(split.answer.strip()),
                                            title=thinking_title(split.thinking, split.closed))
                yield self._block
            yield Markdown(split.answer, parser_factory=shared_parser)
            yield StreamTail(classes="tail")
        else:
            # What the user typed, as typed: line breaks kept, nothing interpreted.
            yield Static(Text(self._initial), classes="plain")
        yield Label(self._note, classes="note", markup=False)

    def on_mount(self) -> None:
        self.query_one(".note", Label).display = bool(self._note)
        if self.role == "assistant":
            self.tail_widget.display = False

    @property
    def body(self) -> Markdown:
        return self.query_one(Markdown)

    @property
    def tail_widget(self) -> StreamTail:
        return self.query_one(".tail", StreamTail)

    @property
    def text(self) -> str:
        """The text shown so far (the Markdown source for a reply: its Markdown and its tail)."""
        return self._text

    @property
    def tail(self) -> str:
        """The part of a streaming reply shown as plain text (not yet rendered as Markdown)."""
        return self._tail

    async def write(self, fragment: str) -> None:
        """Append streamed text (UI thread).

        The text goes to the plain-text tail, which keeps a page of room below it: while the tail
        fits its room, a frame repaints the tail alone, with no layout. Why: a layout pass costs
        ~5 ms, and when the message grows every line of the chat view moves and Textual
        re-renders the whole view and its scroll bar (~20-30 ms on a 160x48 screen).

        When the tail outgrows its room:
        - if the reader follows the end of the chat (`ChatView.following`), the tail turns a page
          within itself (`StreamTail.page`): still no layout, the message keeps its height. The
          Markdown grows when the reply ends (`finish`), after the decode;
        - otherwise (the reader has scrolled up) its settled blocks join the Markdown and it gets
          new room: one layout; the view, not anchored, stays where the reader is. The same
          happens every COMMIT_S while the reader is away from the end.

        Why the pages: on two cores every UI cycle is taken from a verify, and moving settled
        blocks into the Markdown (a parse, new widgets, a layout and a repaint of the view) cost
        40-80 ms each time, 2-4% of a 512-token reply's decode on the bundled model (issue 17)."""
        if not fragment:
            return
        self._text += fragment
        if self._phase == UNDECIDED:
            head = self._text.lstrip()
            if head.startswith(OPEN) or self._opened_thinking:
                await self._begin_thinking()
                fragment = head[len(OPEN):] if head.startswith(OPEN) else self._text
            elif OPEN.startswith(head):
                return  # '<thi' so far: shown with what follows, once it is known
            else:
                self._phase = ANSWERING
                fragment = self._text
        if self._phase == THINKING:
            end = (self._tail + fragment).find(CLOSE)
            if end >= 0:
                await self._end_thinking(self._tail + fragment, end)
                return
        self._tail += fragment
        now = time.monotonic()
        tail = self.tail_widget
        following = self._reader_follows()
        if tail.display and tail.size.width and (following or now - self._committed_at < self.COMMIT_S):
            shown, text = tail.text, self._tail_text()
            if text.startswith(shown):
                tail.append(text[len(shown):])  # repaints the rows the new text changed
            else:
                tail.set_text(text)
            if following and self._reserved > self._room():
                # The view got shorter (a smaller terminal): a page taller than the view would
                # write its new rows out of sight. One layout, to the new size.
                self._reserved = self._room()
                tail.styles.min_height = self._reserved
                if tail.window is not None:
                    tail.page(self._reserved, self.KEEP_LINES)
            if self._tail_height(tail) <= self._reserved:
                return
            if following and self._reserved:
                tail.page(self._reserved, self.KEEP_LINES)
                return
        await self._relayout(now)

    def start_stream(self, stats: SpecStats, panel: SpecPanel) -> ReplyStream:
        """Stream a reply into this message: its rounds go to the returned `ReplyStream` (their
        figures to `stats`), whose frames write here and redraw `panel`."""
        self.stream = ReplyStream(self, stats, panel)
        return self.stream

    def _reader_follows(self) -> bool:
        """Whether the chat view this message is in follows its end (a reader at the bottom)."""
        return bool(getattr(self.parent, "following", False))

    def make_room(self, above: str = "") -> None:
        """Before a reply's first token: show the (empty) tail with its room, so the first text
        is drawn in place instead of moving the view while the engine decodes. `above` is the
        message the reply answers: the room leaves it in sight if it takes at most half the
        view (a long paste leaves its last KEEP_LINES)."""
        tail = self.tail_widget
        tail.display = True
        room = self._room()
        view_height = self._view_height()
        if above and view_height:
            # the message's lines at the view's width, its role line and margin, this role line
            shown = _wrapped_lines(above, max(1, self._view_width() - 4)) + 4
            if shown <= view_height // 2:
                room = max(self.HEADROOM_MIN, room - shown)
        self._reserved = room
        tail.styles.min_height = self._reserved
        self._committed_at = time.monotonic()

    def _view_height(self) -> int:
        return getattr(getattr(self.parent, "size", None), "height", 0)

    def _view_width(self) -> int:
        return getattr(getattr(self.parent, "size", None), "width", 0)

    def _room(self) -> int:
        """Lines of room the tail gets at a time: a page of the view less KEEP_LINES, at least
        HEADROOM_MIN."""
        return max(self.HEADROOM_MIN, self._view_height() - self.KEEP_LINES)

    def _tail_text(self) -> str:
        # The blank lines a settled block leaves at the tail's start are the Markdown's gap.
        return self._tail.lstrip("\n")

    @staticmethod
    def _tail_height(tail: StreamTail) -> int:
        """Lines the tail's whole text takes at its present width (paging or not)."""
        return tail.total_height(tail.size.width)

    async def _begin_thinking(self) -> None:
        """The reply thinks: its block, open, above the Markdown; the tail dimmed."""
        self._phase = THINKING
        self._block = ThinkingBlock(collapsed=False, title=thinking_title("", False, streaming=True))
        await self.mount(self._block, before=self.body)
        self.tail_widget.add_class("thinking")

    @property
    def still_thinking(self) -> bool:
        """Whether the reply's text ends inside its thinking (stopped, or capped, before its answer)."""
        return self._phase == THINKING

    @property
    def thinking_block(self) -> ThinkingBlock | None:
        """The reply's thinking, where it has some."""
        return self._block

    async def _end_thinking(self, text: str, end: int) -> None:
        """`</think>` at `end` of the tail's `text`: the thinking before it joins the block, which
        folds, and the answer after it starts the tail anew."""
        self._thinking = (self._thinking + text[:end]).strip()
        self._phase = ANSWERING
        block = self.thinking_block
        if block is not None:
            block.set_text(self._thinking)
            block.title = thinking_title(self._thinking, True)
            block.collapsed = True
        self.tail_widget.remove_class("thinking")
        self._tail = text[end + len(CLOSE):].lstrip()
        await self._relayout(time.monotonic())

    async def _settle(self, settled: str) -> None:
        """Settled text to where it shows: the thinking block while the reply thinks, else the
        Markdown."""
        block = self.thinking_block if self._phase == THINKING else None
        if block is None:
            await self.body.append(settled)
            return
        self._thinking += settled
        block.set_text(self._thinking.strip())

    async def _relayout(self, now: float) -> None:
        """Move the settled blocks to the Markdown and give the tail room for what follows."""
        tail = self.tail_widget
        cut = settled_length(self._tail)
        if cut:
            settled, self._tail = self._tail[:cut], self._tail[cut:]
            await self._settle(settled)
        self._committed_at = now
        text = self._tail_text()
        tail.unpage()
        tail.set_text(text)
        tail.display = True
        need = self._tail_height(tail)
        # Rendered Markdown is seldom as tall as its source, so the view moves here anyway:
        # room for the next page of text (the view shows the last KEEP_LINES above it).
        self._reserved = need + self._room()
        tail.styles.min_height = self._reserved

    def release_headroom(self) -> None:
        """The reply is complete: the message is as tall as its text again."""
        if self._reserved:
            self._reserved = 0
            self.tail_widget.styles.min_height = None

    async def finish(self, note: str = "") -> None:
        """End the stream (all written text is rendered as Markdown) and show a note under it."""
        if self._phase == UNDECIDED and self._text:  # a reply of white space, or of '<thi'
            self._phase, self._tail = ANSWERING, self._text
        if self._tail:
            tail, self._tail = self._tail, ""
            await self._settle(tail)
        block = self.thinking_block
        if block is not None and self._phase == THINKING:  # stopped inside its thinking: left open
            block.title = thinking_title(self._thinking.strip(), False)
        elif block is not None and not split_thinking(self._text, self._opened_thinking).answer.strip():
            block.collapsed = False  # an answer of nothing: the thinking is all the reply says
        if self.role == "assistant":
            self.tail_widget.unpage()
            self.tail_widget.set_text("")
            self.tail_widget.display = False
        self.release_headroom()
        self.set_note(note)

    def set_note(self, note: str) -> None:
        self._note = note
        label = self.query_one(".note", Label)
        label.update(note)
        label.display = bool(note)


def _wrapped_lines(text: str, width: int) -> int:
    """Lines `text` takes wrapped at `width` columns (an estimate: words are not kept whole)."""
    return sum(max(1, -(-len(line) // width)) for line in text.split("\n"))


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
        self._earlier: list[Turn] = []  # the open conversation's turns not shown yet, oldest first

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
        if new_value <= 0 < old_value and self._earlier and not self.following:
            self.call_after_refresh(self.show_earlier)  # the reader reached the top: the messages before it
        if self.following or not self.is_anchored:
            return
        if new_value >= self.max_scroll_y:  # Textual itself re-anchors at the very end
            self.following = True
        elif new_value > old_value and self.max_scroll_y - new_value <= self.NEAR_BOTTOM:
            self.anchor()

    async def add_message(self, role: str, content: str = "", note: str = "", *,
                          opened_thinking: bool = False) -> ChatMessage:
        message = ChatMessage(role, content, note, opened_thinking=opened_thinking)
        await self.mount(message)
        if self.following:
            self.scroll_end(animate=False)
        return message

    async def clear(self) -> None:
        self._earlier = []
        await self.remove_children()
        self.anchor()

    def messages(self) -> list[ChatMessage]:
        return list(self.query(ChatMessage))

    def turns(self) -> list[ChatMessage]:
        """The messages shown, in order, one per turn of the conversation from turn `first_shown`
        on (while a reply is asked for, the turns it would replace are still among them, hidden,
        until it is recorded)."""
        return [c for c in self.children if isinstance(c, ChatMessage)]

    @property
    def first_shown(self) -> int:
        """The conversation's index of the first message shown (the ones before wait above)."""
        return len(self._earlier)

    async def turns_from(self, index: int) -> list[ChatMessage]:
        """The messages of turns `index` on, every earlier one shown first if it is among them."""
        if index < self.first_shown:
            await self.show_earlier(all_of_them=True)
        return self.turns()[index - self.first_shown:]

    async def show_turns(self, turns: list[Turn]) -> None:
        """Show `turns` (a stored conversation) in place of what the view holds: each reply with
        its note and, if its prompt left turns out, its context marker. The last SHOWN_AT_OPEN
        are laid out now, the earlier ones when asked for (``show_earlier``)."""
        await self.clear()
        cut = max(0, len(turns) - SHOWN_AT_OPEN)
        self._earlier = list(turns[:cut])
        if self._earlier:
            await self.mount(EarlierMessages(len(self._earlier)))
        # one mount, one layout: mounted one by one (each laid out and scrolled to the end),
        # a conversation of 1,000 messages took 31-33 s to open
        await self._mount_turns(turns[cut:])
        if self.following:
            self.scroll_end(animate=False)

    async def show_earlier(self, all_of_them: bool = False) -> None:
        """Show the SHOWN_AT_OPEN messages before the first one shown (`all_of_them`: every one),
        the view kept on what the reader sees."""
        if not self._earlier:
            return
        cut = 0 if all_of_them else max(0, len(self._earlier) - SHOWN_AT_OPEN)
        batch, self._earlier = self._earlier[cut:], self._earlier[:cut]
        line = self.query_one(EarlierMessages)
        height = self.virtual_size.height
        following = self.following
        line.count = len(self._earlier)
        await self._mount_turns(batch, after=line)
        if not self._earlier:
            await line.remove()
        if following:
            self.scroll_end(animate=False)
        else:  # what was at the top stays there: the view moves down by what came in above it
            self.call_after_refresh(lambda: self.scroll_to(
                y=self.scroll_y + self.virtual_size.height - height, animate=False))

    async def _mount_turns(self, turns: list[Turn], after: Any = None) -> None:
        widgets = [ChatMessage(turn.role, turn.content, reply_note(turn.meta) if turn.role == "assistant" else "")
                   for turn in turns]
        if widgets:
            await self.mount_all(widgets, after=after)
        for widget, turn in zip(widgets, turns):
            marks = context_marks(turn.meta)
            if marks is not None:
                await self.mark_context(widget, *marks)

    def mark_editing(self, index: int | None) -> None:
        """Highlight the message of turn `index` as the one being edited (None: none), in sight
        (shown first if it waits above)."""
        turns = self.turns()
        for widget in turns:
            widget.remove_class("editing")
        if index is not None and 0 <= index < self.first_shown:
            self.call_later(self._mark_earlier, index)
            return
        index = None if index is None else index - self.first_shown
        if index is not None and 0 <= index < len(turns):
            turns[index].add_class("editing")
            turns[index].scroll_visible(animate=False)

    async def _mark_earlier(self, index: int) -> None:
        await self.show_earlier(all_of_them=True)
        self.mark_editing(index)

    async def show_request(self, prompt: str | None, answers: str, hide: list[ChatMessage],
                           opened_thinking: bool = False) -> tuple[ChatMessage | None, ChatMessage]:
        """Show a reply being asked for: the messages it would replace (`hide`) are hidden, the
        new user message `prompt` (None for a regenerate) is added and an empty reply below it,
        with room for its first text beside `answers`, the message it answers. Returns both.
        `opened_thinking`: the model's prompt opens its thinking (adaspark_app/thinking.py)."""
        self.following = True
        for widget in hide:
            widget.display = False  # removed once the new reply is recorded, shown again if it fails
        user_msg = None if prompt is None else await self.add_message("user", prompt)
        reply_msg = await self.add_message("assistant", "", opened_thinking=opened_thinking)
        reply_msg.set_note("…")  # until the reply ends: hiding it would move the view
        reply_msg.make_room(answers)  # laid out with the new messages, before the first token
        return user_msg, reply_msg

    async def withdraw(self, user_msg: ChatMessage | None, reply_msg: ChatMessage, hidden: list[ChatMessage]) -> None:
        """Undo `show_request`: its messages leave, the ones it hid are shown again."""
        if user_msg is not None:
            await user_msg.remove()
        await reply_msg.remove()
        for widget in hidden:
            widget.display = True

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


class EarlierMessages(Static):
    """The line above the messages shown, while earlier ones wait: a click shows them."""

    DEFAULT_CSS = """
    EarlierMessages { color: $text-muted; text-style: italic; width: 1fr; padding: 0 0 1 0; }
    """

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    @property
    def count(self) -> int:
        return self._count

    @count.setter
    def count(self, value: int) -> None:
        self._count = value
        self.update(Text(f"▲ {value:,} earlier message{'s' if value != 1 else ''}: scroll up or click to show them"))

    async def on_click(self) -> None:
        view = self.parent
        if isinstance(view, ChatView):
            await view.show_earlier()


def code_at(screen: Any, x: int, y: int) -> str | None:
    """The code of the fenced block at (`x`, `y`) on `screen`, if there is one."""
    from textual.widgets.markdown import MarkdownFence

    try:
        widget, _ = screen.get_widget_at(x, y)
    except Exception:  # the pointer is off the screen or over nothing
        return None
    node: Any = widget
    while node is not None and not isinstance(node, MarkdownFence):
        node = node.parent
    return node.code if node is not None and node.code.strip() else None
