"""The live speculation panel: what the AdaSpark scheduler is doing, round by round."""

from __future__ import annotations

import time

from rich._ratio import ratio_distribute
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from ..stats import RECENT_ROUNDS, SpecStats

BLOCKS = " ▏▎▍▌▋▊▉█"
BAR_WIDTH = 16
SOURCE_LABELS = {"drafter": "drafter", "ngram": "n-gram", "agreed": "agreed"}
PRICED_BY_LABELS = {
    "fitted": "fitted acceptance model",
    "head": "head-based estimate",
    "none": "not priced",
}


def hbar(value: float, top: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of `width` cells, `value / top` full, with eighth-cell resolution."""
    if top <= 0 or value <= 0:
        return " " * width
    eighths = round(min(value / top, 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full + (BLOCKS[part] if part else "")
    return bar.ljust(width)


def _num(value: float | None, fmt: str = "{:.1f}", missing: str = "–") -> str:
    return missing if value is None else fmt.format(value)


class Grid:
    """`rich.table.Grid()` for the panel's short one-line cells, drawn in a
    fraction of the time (issue 17: Rich's table layout took ~6 ms of the UI thread a redraw).

    Same output for what the panel puts in it: columns one space apart, no edge padding, each
    as wide as its widest cell; with `expand`, the spare width shared out as Rich shares it
    (in proportion to the columns' widths). Cells must fit on one line.
    """

    def __init__(self, expand: bool = False) -> None:
        self.expand = expand
        self._columns: list[tuple[str, str]] = []  # (justify, style)
        self._rows: list[list[Text]] = []

    def add_column(self, justify: str = "left", style: str = "", no_wrap: bool = True) -> None:
        self._columns.append((justify, style))

    def add_row(self, *cells: "str | Text") -> None:
        self._rows.append([c if isinstance(c, Text) else Text(c) for c in cells])

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        n = len(self._columns)
        if not n:
            return
        # A column is as wide as its widest cell (1 at least, as in Rich), plus one space of
        # padding on its right unless it is the last.
        widths = [max([row[i].cell_len for row in self._rows if i < len(row)] + [0]) or 1 for i in range(n)]
        widths = [w + (1 if i < n - 1 else 0) for i, w in enumerate(widths)]
        if self.expand and sum(widths) < options.max_width:
            widths = [w + extra for w, extra in zip(widths, ratio_distribute(options.max_width - sum(widths), widths))]
        get_style = console.get_style
        new_line = Segment.line()
        for row in self._rows:
            for i, (justify, col_style) in enumerate(self._columns):
                cell = row[i] if i < len(row) else Text("")
                base = get_style(col_style) if col_style else Style.null()
                pad = 1 if i < n - 1 else 0
                content = widths[i] - pad
                # As Rich does: the cell justified inside its own style, then the column's
                # style under every segment, then the padding in the column's style.
                line = cell.copy()
                line.truncate(content)
                if justify == "right":
                    line.pad_left(content - line.cell_len)
                else:
                    line.pad_right(content - line.cell_len)
                styled = Text()
                styled.append_text(line)
                for seg in styled.render(console, ""):
                    yield Segment(seg.text, base + seg.style if seg.style else base)
                if pad:
                    yield Segment(" ", base)
            yield new_line


def render_panel(stats: SpecStats) -> RenderableType:
    """The panel's contents from the accumulated figures (pure: used by the widget and tests)."""
    head = Grid(expand=True)
    head.add_column(style="dim", no_wrap=True)
    head.add_column(justify="right", no_wrap=True)
    head.add_column(style="dim", no_wrap=True)
    head.add_column(justify="right", no_wrap=True)
    speedup = stats.speedup
    speed_style = "bold green" if speedup is not None and speedup >= 1.0 else "bold yellow"
    # "reply tok/s" is the engine's decode speed measured in its own process as `adaspark run`
    # measures it; "on screen" is what the display delivered (tokens shown over the wall time from
    # the first text's production to the last text shown), so a gap between the two is visible;
    # "shown within" is the longest any text waited to be drawn (the engine sends every 0.25 s).
    head.add_row("reply tok/s", Text(_num(stats.reply_rate), style="bold"),
                 "on screen", _num(stats.shown_rate))
    head.add_row("tok/s now", Text(_num(stats.now_rate), style="bold"),
                 "speedup", Text(_num(speedup, "{:.2f}×"), style=speed_style))
    head.add_row("tok/round", _num(stats.tokens_per_round, "{:.2f}"), "plain", _num(stats.plain_rate))
    measuring = stats.last is not None and stats.last.measured
    head.add_row("width now", Text(_num(stats.width_now, "{}"), style="bold cyan"),
                 "rounds", str(stats.rounds))
    head.add_row("context", str(stats.context),
                 "shown within", _num(None if stats.lag_max is None else stats.lag_max * 1e3, "{:.0f} ms"))
    parts: list[RenderableType] = [head]
    if stats.device:
        parts.append(Text(f"  on {stats.device}", style="dim", no_wrap=True, overflow="ellipsis"))
    if measuring:
        parts.append(Text("  measuring this width (cold start)", style="italic yellow"))

    # Widths chosen over the recent rounds.
    hist = stats.width_histogram()
    parts.append(Text(f"\nWidths, last {RECENT_ROUNDS} rounds", style="bold"))
    if hist:
        top = max(n for _, n in hist)
        t = Grid()
        t.add_column(justify="right", no_wrap=True)
        t.add_column(no_wrap=True)
        t.add_column(justify="right", no_wrap=True)
        for width, n in hist:
            style = "cyan" if width == stats.width_now else "blue"
            t.add_row(str(width), Text(hbar(n, top), style=style), str(n))
        parts.append(t)
    else:
        parts.append(Text("  no rounds yet", style="dim"))

    # Acceptance by source of the draft rows.
    parts.append(Text("\nAccepted / drafted rows", style="bold"))
    acc = Grid()
    acc.add_column(no_wrap=True)
    acc.add_column(no_wrap=True)
    acc.add_column(justify="right", no_wrap=True)
    acc.add_column(justify="right", no_wrap=True)
    for source, rate in stats.acceptance().items():
        share = rate.share
        acc.add_row(SOURCE_LABELS[source], Text(hbar(rate.accepted, rate.rows, 10), style="green"),
                    f"{rate.accepted}/{rate.rows}", _num(None if share is None else share * 100, "{:.0f}%"))
    parts.append(acc)

    # The priced verify time of every offered width at the current context.
    prices = stats.prices_ms()
    parts.append(Text(f"\nVerify price at context {stats.context} (ms)", style="bold"))
    if prices:
        top = max(prices.values())
        pt = Grid()
        pt.add_column(justify="right", no_wrap=True)
        pt.add_column(no_wrap=True)
        pt.add_column(justify="right", no_wrap=True)
        pt.add_column(no_wrap=True)
        for width, ms in prices.items():
            chosen = width == stats.width_now
            pt.add_row(str(width), Text(hbar(ms, top), style="magenta" if chosen else "bright_black"),
                       f"{ms:.1f}", Text("◀" if chosen else " ", style="bold magenta"))
        parts.append(pt)
    else:
        parts.append(Text("  not priced yet", style="dim"))

    tail = Grid()
    tail.add_column(style="dim", no_wrap=True)
    tail.add_column()
    priced = stats.priced_by
    tail.add_row("tree priced by", Text(PRICED_BY_LABELS.get(priced, priced),
                                        style="green" if priced == "fitted" else "yellow"))
    measured, widths = stats.gauges.cold_start
    if widths and measured >= widths:
        tail.add_row("cold start", Text(f"done: {measured}/{widths} widths measured", style="green"))
    else:
        tail.add_row("cold start", Text(f"{measured}/{widths} widths measured", style="yellow"))
    band = stats.last.band_rate if stats.last is not None else None
    if band:
        tail.add_row("long-run rate", f"{band:.1f} tok/s")
    parts.append(Text(""))
    parts.append(tail)
    return Group(*parts)


class SpecPanel(Static):
    """Shows `SpecStats`. While a reply streams, the chat screen redraws it at most every REDRAW_S.

    The figures are read by eye: a redraw every two seconds is plenty, slower than the text
    (which the reader follows), and every redraw is CPU taken from llama.cpp on a small machine
    (~4 ms of the UI thread for this panel, a third of the UI's CPU while a reply streamed at
    one redraw a second: benchmarks/ui/ui_cpu.py). When the reply ends it is redrawn at once.
    """

    REDRAW_S = 2.0

    DEFAULT_CSS = """
    SpecPanel {
        width: 46;
        height: 1fr;
        padding: 0 1;
        border: round $primary;
        border-title-align: left;
    }
    """

    def __init__(self, stats: SpecStats, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stats = stats
        self.border_title = "Speculation"
        self.redraws = 0
        self._drawn_at = float("-inf")

    def on_mount(self) -> None:
        self.show()

    def show(self) -> None:
        """Redraw now (the panel's size is fixed by CSS, so no layout pass is needed)."""
        self.redraws += 1
        self._drawn_at = time.monotonic()
        self.update(render_panel(self.stats), layout=False)

    def redraw_due_in(self, now: float) -> float:
        """Seconds until a redraw is due (<= 0: due now); the chat screen redraws in its frames."""
        return self._drawn_at + self.REDRAW_S - now
