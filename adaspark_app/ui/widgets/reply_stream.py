"""A reply's text on its way from the engine's rounds to its `ChatMessage`: frames, their pacing
and the UI's CPU budget while a reply streams.

Why frames are paced (issue 17): on a small machine every cycle the UI spends is taken from the
decode, and a repaint of the chat column costs ~20 ms of Python, most of it Textual's compositor.
So the text of the rounds that arrived is appended in one frame, where only the reply's
plain-text tail changes and the message keeps room below it (`ChatMessage.write`); frames are at
least TEXT_INTERVAL_S apart, and further apart when they cost more, so that the UI stays within
FRAME_CPU_BUDGET of a core; the speculation panel is redrawn in those same frames at a lower rate
still (`SpecPanel.REDRAW_S`). benchmarks/ui/ui_cpu.py measures it.

Everything here runs on the UI thread: the rounds come from the chat screen's handler of the
engine's messages, and frames from a timer of the message widget.
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable, Protocol

from textual.timer import Timer

from ...engine.events import RoundEvent
from ..stats import SpecStats, gauges_from
from .spec_panel import SpecPanel

TEXT_INTERVAL_S = 0.25  # streamed text is appended at most 4 times a second
# While a reply streams the UI thread may use at most this share of one core: after each frame
# the next waits until the CPU it used since the previous one fits the budget (a 10 ms frame
# -> 0.5 s to the next). On two cores every UI cycle is taken from a verify.
FRAME_CPU_BUDGET = 0.02
MAX_FRAME_GAP_S = 0.5  # text shows at least twice a second, whatever a repaint costs


class StreamTarget(Protocol):
    """What a `ReplyStream` writes to: a message widget that appends text and keeps timers."""

    async def write(self, fragment: str) -> None: ...

    def set_timer(self, delay: float, callback: Callable[[], Awaitable[None] | None]) -> Timer: ...


class ReplyStream:
    """The text and figures of one streaming reply, shown in frames paced to a CPU budget.

    `receive` takes each batch of rounds (its figures go to `stats` at once); the text waits for
    the next frame, which appends all of it to the message and redraws the panel when its turn
    has come. `flush` shows what is left when the reply ends.
    """

    def __init__(self, message: StreamTarget, stats: SpecStats, panel: SpecPanel) -> None:
        self.message = message
        self.stats = stats
        self.panel = panel
        self.received: list[str] = []  # the reply's text as it arrived from the engine
        self._unshown: list[str] = []  # received but not yet appended to the message
        self.received_tokens = 0
        self._timer: Timer | None = None  # the next frame (see frame)
        self._due = 0.0  # monotonic time the next frame is due
        self._last_frame = 0.0
        self._gap = TEXT_INTERVAL_S  # the wait before the next frame (see frame)
        self._frame_cpu: float | None = None  # UI thread CPU seconds when the last frame began
        self._panel_stale = False  # the panel's figures changed since it was drawn

    @property
    def text(self) -> str:
        """Everything received so far."""
        return "".join(self.received)

    async def receive(self, times: list[float], events: list[RoundEvent], gauges: dict[str, Any] | None) -> None:
        """A batch of rounds from the engine process (each with the monotonic time it ended
        there): the figures now, the text within TEXT_INTERVAL_S."""
        for t, event in zip(times, events):
            self.stats.add(event)
            if event.text:
                self.received.append(event.text)
                self._unshown.append(event.text)
                # the engine's clock (CLOCK_MONOTONIC, one for every process): the display's
                # speed runs from when the text existed, so a starved UI reads as late
                self.stats.arrived(t, event.reply_tokens)
            self.received_tokens = max(self.received_tokens, event.reply_tokens)
        engine_gauges = gauges_from(gauges)
        if engine_gauges is not None:
            self.stats.set_gauges(engine_gauges)
        self._panel_stale = True
        now = time.monotonic()
        due = self._last_frame + self._gap
        if self._timer is not None and self._unshown and self._due > due:
            self.stop()  # a panel-only frame was due later: text must not wait for it
        if self._timer is None:
            if due <= now:
                await self.frame()
            else:
                self._set_timer(due - now)

    def _set_timer(self, wait: float) -> None:
        self._due = time.monotonic() + wait
        self._timer = self.message.set_timer(wait, self.frame)

    async def frame(self) -> None:
        """One repaint for everything that arrived since the last: the new text is appended to
        the message, and the panel is redrawn if SpecPanel.REDRAW_S has passed (else a later frame
        does it). Text and panel share the frame, so streaming costs at most 4 repaints a second."""
        self._timer = None
        now = time.monotonic()
        self._last_frame = now
        # The CPU this thread used since the last frame began (that frame's layout and paint,
        # and the rounds handled since) sets the gap to the next one.
        cpu = time.thread_time()
        if self._frame_cpu is not None:
            self._gap = min(MAX_FRAME_GAP_S, max(TEXT_INTERVAL_S, (cpu - self._frame_cpu) / FRAME_CPU_BUDGET))
        self._frame_cpu = cpu
        if self._unshown:
            await self.message.write(self.take_unshown())
            # The paint follows in the same turn of the event loop: a UI starved of CPU flushes
            # late, and that is the delay this figure is meant to show.
            self.stats.shown(time.monotonic(), self.received_tokens)
        if self._panel_stale:
            panel_wait = self.panel.redraw_due_in(now)
            if panel_wait <= 0:
                self._panel_stale = False
                self.panel.show()
            elif self._timer is None:
                # The panel alone, when no text comes before (receive brings a text frame forward).
                self._set_timer(max(panel_wait, self._gap))

    def take_unshown(self) -> str:
        """The text received and not yet shown, which the caller shows (no longer waiting)."""
        text = "".join(self._unshown)
        self._unshown = []
        return text

    async def flush(self) -> None:
        """Show every text received so far now (the reply has ended: the panel is redrawn by the
        caller, so no frame waits for it)."""
        self.stop()
        self._panel_stale = False
        await self.frame()

    def stop(self) -> None:
        """Cancel the next frame."""
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
