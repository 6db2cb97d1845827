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
"""

from __future__ import annotations

from rich.console import Console
from rich.segment import Segment
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

    @property
    def text(self) -> str:
        return self._text

    @property
    def rows(self) -> list[str]:
        """The rows shown (wrapped at the widget's present width)."""
        return list(self._rows_at(self.size.width))

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
        if first < end:
            self.refresh(Region(0, first, width, end - first))

    def content_height(self, width: int) -> int:
        """Rows the text takes at `width` cells (the widget's content width; 0: not laid out, the
        text's lines)."""
        if width <= 0:
            return self._text.count("\n") + 1
        return len(self._rows_at(width))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self.content_height(width)

    def render_line(self, y: int) -> Strip:
        rows = self._rows_at(self.size.width)
        style = self.rich_style
        if 0 <= y < len(rows):
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
