"""The plain-text tail of a streaming reply, repainted by the line.

While a reply streams, its block in progress is shown as plain text below the rendered Markdown
(`ChatMessage`). A `Static` would repaint all of its lines whenever text is appended: with a
page of room that is ~33 lines re-wrapped and re-rendered four times a second, and the largest
share of the UI's CPU left while a reply streams (issue 17: on two cores every UI cycle is taken
from a verify). This widget keeps its text wrapped into rows, re-wraps only the last paragraph
on an append, and marks dirty only the rows that changed, so a frame renders the line or two the
new text touched.

Wrapping is Rich's (the same word wrap a `Static` of the text gives, wide characters included),
applied per paragraph: a paragraph's rows depend on it alone.

Paging: with `page(window, keep)` the tail shows at most `window` rows, and when its text
outgrows them it turns a page within itself (the last `keep` rows of the page stay at the top),
so the message never changes height: no layout and no move of the chat view while a reader
follows the reply (`ChatMessage.write`). The rows above the page are shown again when the
reply ends and its text moves to the Markdown.
"""

from __future__ import annotations

from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

_CONSOLE = Console(width=10_000, legacy_windows=False, color_system=None)  # wrap only; never prints


def wrap_paragraph(paragraph: str, width: int) -> list[str]:
    """`paragraph` (no newline in it) as rows of at most `width` cells, word-wrapped as Rich does."""
    if not paragraph:
        return [""]
    lines = Text(paragraph.expandtabs(4), no_wrap=False, end="").wrap(_CONSOLE, max(1, width), overflow="fold")
    return [line.plain.rstrip(" ") if i < len(lines) - 1 else line.plain for i, line in enumerate(lines)] or [""]


class StreamTail(Widget):
    """Plain text that grows at its end; `append` repaints only the rows it changed."""

    DEFAULT_CSS = """
    StreamTail { height: auto; }
    """

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self._text = text
        self._rows: list[str] = []
        self._last_start = 0  # index in _rows of the last paragraph's first row
        self._wrapped_at: int | None = None  # the width _rows were wrapped at (None: stale)
        self._window: int | None = None  # rows shown at most (None: all); see page()
        self._keep = 0  # rows of a turned page left at the top of the next
        self._pass_style: Style | None = None  # the style of the render pass in progress

    @property
    def text(self) -> str:
        return self._text

    @property
    def rows(self) -> list[str]:
        """The rows shown (wrapped at the widget's present width)."""
        return list(self._rows_at(self.size.width))

    @property
    def window(self) -> int | None:
        """Rows shown at most while paging (None: every row)."""
        return self._window

    def page(self, window: int, keep: int = 0) -> None:
        """Show at most `window` rows from now on, turning a page (keeping `keep` rows of the
        last at the top) whenever the text outgrows them."""
        window = max(1, window)
        keep = max(0, min(keep, window - 1))
        if (window, keep) != (self._window, self._keep):
            self._window, self._keep = window, keep
            self.refresh()

    def unpage(self) -> None:
        """Show every row again (the caller lays the message out: its height changes)."""
        if self._window is not None:
            self._window = None
            self.refresh()

    def first_row(self, n_rows: int) -> int:
        """The first of `n_rows` rows shown: 0, or while paging the start of the page the last
        row is on. Pages start every window - keep rows, so each keeps `keep` of the one before."""
        if self._window is None or n_rows <= self._window:
            return 0
        step = self._window - self._keep
        return -(-(n_rows - self._window) // step) * step

    def set_text(self, text: str) -> None:
        """Replace the whole text (repaints every row; no layout: the caller sets the room)."""
        self._text = text
        self._wrapped_at = None
        self.refresh()

    def append(self, fragment: str) -> None:
        """Add `fragment` at the end; only the rows from the first one it changed are repainted."""
        if not fragment:
            return
        self._text += fragment
        width = self.size.width
        if not width or self._wrapped_at != width:
            self._wrapped_at = None
            self.refresh()
            return
        old = self._rows
        start = self._last_start
        last_para_at = self._text.rfind("\n", 0, len(self._text) - len(fragment)) + 1  # old last paragraph
        new_rows = old[:start] + self._wrap(self._text[last_para_at:], width, start)
        first = start
        while first < min(len(old), len(new_rows)) and old[first] == new_rows[first]:
            first += 1
        self._rows = new_rows
        end = max(len(old), len(new_rows))
        top = self.first_row(len(new_rows))
        if top != self.first_row(len(old)):
            self.refresh()  # a page turned: every row shown changed
        elif first < end:
            self.refresh(Region(0, first - top, width, end - first))

    def content_height(self, width: int) -> int:
        """Rows shown at `width` cells: the whole text's (`total_height`), at most a page while paging."""
        n = self.total_height(width)
        return n if self._window is None else min(n, self._window)

    def total_height(self, width: int) -> int:
        """Rows the whole text takes at `width` cells, paging or not (the widget's content width;
        0: not laid out, the text's lines)."""
        return len(self._rows_at(width)) if width > 0 else self._text.count("\n") + 1

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self.content_height(width)

    def render_lines(self, crop: Region) -> list[Strip]:
        # One style for the whole pass: `rich_style` walks the DOM for the background (~0.3 ms a
        # call here), and a page turn renders every row of the tail.
        self._pass_style = self.rich_style
        try:
            return super().render_lines(crop)
        finally:
            self._pass_style = None

    def render_line(self, y: int) -> Strip:
        rows = self._rows_at(self.size.width)
        style = self._pass_style or self.rich_style
        shown = y < self._window if self._window is not None else True
        y += self.first_row(len(rows))
        if shown and 0 <= y < len(rows):
            return Strip([Segment(rows[y], style)]).adjust_cell_length(self.size.width, style)
        return Strip.blank(self.size.width, style)

    def on_resize(self) -> None:
        self._wrapped_at = None
        self.refresh()

    # ------------------------------------------------------------------ wrapping
    def _rows_at(self, width: int) -> list[str]:
        """The text's rows at `width`, wrapped once per width and text (the layout's height and
        the paint read the same rows)."""
        if self._wrapped_at != width:
            self._rows = self._wrap(self._text, width, 0)
            self._wrapped_at = width
        return self._rows

    def _wrap(self, text: str, width: int, first_row: int) -> list[str]:
        """Rows of `text` (paragraphs split at newlines); records where its last paragraph starts
        (as a row index offset by `first_row`)."""
        rows: list[str] = []
        paragraphs = text.split("\n")
        for i, paragraph in enumerate(paragraphs):
            if i == len(paragraphs) - 1:
                self._last_start = first_row + len(rows)
            rows.extend(wrap_paragraph(paragraph, width) if width > 0 else [paragraph])
        return rows
