"""What a frame renders while a reply streams (issue 17): the streaming tail repaints only the
rows new text changed, and the chat screen's compositor renders a partial update exactly as
Textual's own does, from fewer widgets."""

from __future__ import annotations

import random

from textual._compositor import Compositor
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.geometry import Region
from textual.widgets import Footer, Header, Static

from adaspark_app.ui.compositor import CroppedCompositor, install
from adaspark_app.ui.widgets import ChatView
from adaspark_app.ui.widgets.stream_tail import StreamTail, wrap_paragraph

PROSE = ("The function checks whether a string reads the same backwards. It first normalises the "
         "text, then compares it with its reverse; an empty string counts as a palindrome.\n\n"
         "```python\ndef is_palindrome(s: str) -> bool:\n\treturn s == s[::-1]\n```\n\n"
         "Wide characters wrap too: 回文は前から読んでも後ろから読んでも同じです。 " * 3)


class TailHost(App):
    def compose(self) -> ComposeResult:
        yield StreamTail(id="tail")


class SpyTail(StreamTail):
    """The real widget, recording the regions it asks to repaint."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.asked: list[tuple[Region, ...]] = []

    def refresh(self, *regions, **kwargs):
        self.asked.append(regions)
        return super().refresh(*regions, **kwargs)


class SpyHost(App):
    def compose(self) -> ComposeResult:
        yield SpyTail(id="tail")


async def test_tail_appended_in_fragments_wraps_as_the_whole_text_would():
    rng = random.Random(17)
    async with TailHost().run_test(size=(50, 40)) as pilot:
        tail = pilot.app.query_one(StreamTail)
        await pilot.pause()
        i = 0
        while i < len(PROSE):
            n = rng.randint(1, 9)
            tail.append(PROSE[i:i + n])
            i += n
        streamed = tail.rows
        width = tail.size.width
    expected = [row for paragraph in PROSE.split("\n") for row in wrap_paragraph(paragraph, width)]
    assert streamed == expected
    assert all(len(row) <= width for row in streamed if row.isascii())
    assert len(expected) > PROSE.count("\n") + 3  # the prose did wrap


async def test_an_append_repaints_only_the_rows_it_changed():
    async with SpyHost().run_test(size=(60, 30)) as pilot:
        tail = pilot.app.query_one(SpyTail)
        await pilot.pause()
        tail.set_text("line one\nline two\nthe third line is being wri")
        tail.rows  # wrapped at the present width
        tail.asked.clear()
        tail.append("tten")
        assert tail.asked == [(Region(0, 2, tail.size.width, 1),)]
        tail.asked.clear()
        tail.append(" and ends.\nA fourth")
        assert tail.asked == [(Region(0, 2, tail.size.width, 2),)]
        assert tail.rows[-2:] == ["the third line is being written and ends.", "A fourth"]


async def test_a_paged_tail_turns_a_page_keeping_rows_of_the_last_and_repaints_rows_within_it():
    async with SpyHost().run_test(size=(60, 30)) as pilot:
        tail = pilot.app.query_one(SpyTail)
        await pilot.pause()
        tail.set_text("\n".join(f"row {i}" for i in range(5)))
        tail.rows
        tail.page(4, keep=1)  # pages start every 3 rows: 0, 3, 6, ...
        assert tail.content_height(tail.size.width) == 4 and tail.total_height(tail.size.width) == 5

        def shown() -> list[str]:
            return [tail.render_line(y).text.rstrip() for y in range(4)]

        assert shown() == ["row 3", "row 4", "", ""]
        tail.asked.clear()
        tail.append(" and more")  # within the page: only that row, at its place in the page
        assert tail.asked == [(Region(0, 1, tail.size.width, 1),)]
        tail.append("\nrow 5\nrow 6")  # fills the page: rows 3-6
        assert shown() == ["row 3", "row 4 and more", "row 5", "row 6"]
        tail.asked.clear()
        tail.append("\nrow 7")  # turns it: row 6 kept at the top
        assert shown() == ["row 6", "row 7", "", ""] and tail.asked == [()]
        assert tail.rows[-1] == "row 7" and len(tail.rows) == 8  # every row is kept
        tail.unpage()
        assert tail.content_height(tail.size.width) == 8
        assert [tail.render_line(y).text.rstrip() for y in range(2)] == ["row 0", "row 1"]


class ChatLike(App):
    """The chat screen's shape: header, sidebar, a scrolling column, a side panel, footer."""

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield Static("\n".join(f"conversation {i}" for i in range(40)), id="side")
            with Vertical(id="col"):
                yield ChatView(id="chat")
            yield Static("\n".join(f"panel row {i} " * 2 for i in range(40)), id="panel")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#side").styles.width = 24
        self.query_one("#panel").styles.width = 30


def _chops(compositor: Compositor, crop: Region, base: bool) -> list[dict]:
    if base:  # Textual's own choice of widgets, on the same map
        compositor._get_renders = lambda c=None: Compositor._get_renders(compositor, c)  # type: ignore[method-assign]
    try:
        lines = set(crop.line_range)
        return compositor._render_chops(crop, lines.__contains__)
    finally:
        compositor.__dict__.pop("_get_renders", None)


async def test_cropped_compositor_renders_partial_updates_as_textual_does():
    rng = random.Random(3)
    app = ChatLike()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert install(screen)
        compositor = screen._compositor
        screen.refresh(layout=True)
        view = app.query_one(ChatView)
        await view.add_message("user", "Write a palindrome checker.")
        msg = await view.add_message("assistant", "")
        msg.make_room("Write a palindrome checker.")
        await pilot.pause()
        for i in range(0, len(PROSE), 40):
            await msg.write(PROSE[i:i + 40])
        await pilot.pause(0.1)
        cuts = compositor.cuts
        for _ in range(40):
            x, y = rng.randrange(0, 119), rng.randrange(0, 39)
            crop = Region(x, y, rng.randint(1, 120 - x), rng.randint(1, 40 - y))
            ours, theirs = _chops(compositor, crop, False), _chops(compositor, crop, True)
            for line in crop.line_range:
                inside = [c for c in cuts[line][:-1] if crop.x <= c < crop.right]
                assert all(ours[line][c] is not None for c in inside)
                assert [ours[line][c] for c in inside] == [theirs[line][c] for c in inside]
        # and it renders fewer widgets for a one-line update inside the reply
        region, clip = compositor.visible_widgets[msg.tail_widget]
        shown = region.intersection(clip)
        assert shown.height > 3
        one_line = Region(shown.x, shown.y, shown.width, 1)
        ours = list(compositor._get_renders(one_line))
        theirs = list(Compositor._get_renders(compositor, one_line))
        assert len(ours) < len(theirs)


async def test_install_gives_a_fresh_screen_the_cropped_compositor():
    from textual.screen import Screen

    screen = Screen()
    assert install(screen) is True and isinstance(screen._compositor, CroppedCompositor)


class ViewHost(App):
    def compose(self) -> ComposeResult:
        yield ChatView()


async def test_a_code_line_wider_than_the_reply_shows_a_scrollbar_and_scrolls_to_its_end():
    """A fenced line wider than the reply was cut at the column's edge with no sign of the rest
    (Textual's fence scrolls with its scrollbar 0 rows high); its fence now shows one, and
    scrolls to the line's end. A fence that fits shows none."""
    from textual.widgets.markdown import MarkdownFence

    long_line = "print(reverse_string('Hello, World!'))  # prints '!dlroW ,olleH', the text read from its end"
    async with ViewHost().run_test(size=(60, 30)) as pilot:
        view = pilot.app.query_one(ChatView)
        await view.add_message("assistant", f"```python\ndef f(s):\n    return s[::-1]\n```\n\n```python\n{long_line}\n```")
        await pilot.pause()
        short, wide = pilot.app.query(MarkdownFence)
        assert short.max_scroll_x == 0 and not short.horizontal_scrollbar.display
        assert wide.max_scroll_x > 0 and wide.horizontal_scrollbar.display
        assert wide.scrollbar_size_horizontal == 1
        wide.scroll_to(x=wide.max_scroll_x, animate=False, immediate=True)
        await pilot.pause()
        assert wide.scroll_x == wide.max_scroll_x
