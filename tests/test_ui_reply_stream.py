"""A streaming reply's frames (widgets/reply_stream.py): a real `ChatMessage` and `SpecPanel` in a
Textual app, rounds handed in as the chat screen hands them, Textual's own timers.

What it guards: text shows in frames at least TEXT_INTERVAL_S apart, further apart when a frame
costs CPU (the 2% budget, capped at MAX_FRAME_GAP_S); the panel is redrawn in those frames at most
every SpecPanel.REDRAW_S; text never waits for a panel-only frame; the end of a reply shows
everything at once. Only lower bounds on time are asserted (a busy machine is late, never early).
"""

from __future__ import annotations

import contextlib
import time

from textual.app import App, ComposeResult

from adaspark_app.engine.events import RoundEvent
from adaspark_app.ui.stats import SpecStats
from adaspark_app.ui.widgets import ChatView, SpecPanel
from adaspark_app.ui.widgets.reply_stream import MAX_FRAME_GAP_S, TEXT_INTERVAL_S, ReplyStream
from ui_fakes import wait_until

EARLY = 0.01  # a timer may wake this much before its due time (clock granularity)


class StreamHost(App):
    def compose(self) -> ComposeResult:
        yield ChatView()
        yield SpecPanel(SpecStats())


def rounds(*texts: str, start: int = 0) -> tuple[list[float], list[RoundEvent]]:
    """A batch of rounds, one per text (an empty text: a round with figures only), ending now."""
    events = [RoundEvent(conversation="c", turn=0, round_index=start + i, context=50 + start + i, width=2,
                         measured=False, verify_ms_predicted=10.0, verify_ms=10.0, fixed_ms=1.0,
                         expected_accepted=1.0, accepted=1, committed=1, priced_by="fitted",
                         rows_by_source={"ngram": 1}, accepted_by_source={"ngram": 1}, offered={1: 10.0, 2: 18.0},
                         band_rate=None, text=text, reply_tokens=start + i + 1, reply_seconds=0.01 * (start + i))
              for i, text in enumerate(texts)]
    return [time.monotonic()] * len(events), events


@contextlib.asynccontextmanager
async def streaming():
    """A reply message with its stream, laid out; frame start times are recorded in `frames`."""
    app = StreamHost()
    async with app.run_test(size=(100, 30)) as pilot:
        view, panel = app.query_one(ChatView), app.query_one(SpecPanel)
        msg = await view.add_message("assistant", "")
        msg.make_room()
        stream = msg.start_stream(panel.stats, panel)
        await pilot.pause()
        frames: list[float] = []
        frame = stream.frame

        async def recorded() -> None:
            frames.append(time.monotonic())
            await frame()

        stream.frame = recorded  # type: ignore[method-assign]
        yield pilot, msg, stream, panel, frames


async def test_the_message_owns_the_stream_of_its_reply():
    async with streaming() as (pilot, msg, stream, panel, frames):
        assert isinstance(stream, ReplyStream) and msg.stream is stream and stream.message is msg


async def test_text_shows_in_frames_at_least_the_interval_apart():
    async with streaming() as (pilot, msg, stream, panel, frames):
        await stream.receive(*rounds("Hello"), None)
        assert msg.text == "Hello" and len(frames) == 1  # the first text shows at once
        await stream.receive(*rounds(" world", start=1), None)
        assert msg.text == "Hello"  # too soon after the last frame: it waits for the next
        await wait_until(pilot, lambda: msg.text == "Hello world", what="the next frame")
        assert len(frames) == 2 and frames[1] - frames[0] >= TEXT_INTERVAL_S - EARLY
        assert stream.text == "Hello world" and stream.received_tokens == 2


async def test_a_frame_that_costs_cpu_puts_the_next_one_further_away_up_to_the_cap():
    async with streaming() as (pilot, msg, stream, panel, frames):
        await stream.receive(*rounds("a"), None)
        spin_until = time.thread_time() + 0.015  # 15 ms of this thread's CPU: 0.75 s at 2% of a core
        while time.thread_time() < spin_until:
            pass
        await stream.receive(*rounds("b", start=1), None)
        await wait_until(pilot, lambda: msg.text == "ab", what="the second frame")
        await stream.receive(*rounds("c", start=2), None)
        await wait_until(pilot, lambda: msg.text == "abc", what="the third frame")
        assert frames[2] - frames[1] >= MAX_FRAME_GAP_S - EARLY


async def test_the_end_of_a_reply_shows_everything_at_once_and_cancels_the_waiting_frame():
    async with streaming() as (pilot, msg, stream, panel, frames):
        await stream.receive(*rounds("one"), None)
        await stream.receive(*rounds(" two", start=1), None)
        assert msg.text == "one"
        await stream.flush()
        assert msg.text == "one two" and len(frames) == 2
        await pilot.pause(TEXT_INTERVAL_S + 0.1)
        assert len(frames) == 2  # the frame that was waiting never ran


async def test_the_panel_is_redrawn_in_frames_no_more_often_than_its_redraw_time():
    async with streaming() as (pilot, msg, stream, panel, frames):
        panel.show()
        drawn_at, redraws = time.monotonic(), panel.redraws
        for i in range(4):  # text for a second: frames, but the panel's figures wait
            await stream.receive(*rounds(f"w{i} ", start=i), None)
            await pilot.pause(TEXT_INTERVAL_S)
        assert panel.redraws == redraws and len(frames) >= 2
        await stream.receive(*rounds("", start=4), None)  # figures only: a frame for the panel alone
        await wait_until(pilot, lambda: panel.redraws > redraws, timeout=SpecPanel.REDRAW_S + 10,
                         what="the panel's redraw")
        assert time.monotonic() - drawn_at >= SpecPanel.REDRAW_S - EARLY
        assert panel.redraws == redraws + 1


async def test_text_does_not_wait_for_a_later_panel_only_frame():
    async with streaming() as (pilot, msg, stream, panel, frames):
        panel.show()  # the next redraw is due in REDRAW_S
        await stream.receive(*rounds("x"), None)  # shows at once; the panel's frame is set for later
        await stream.receive(*rounds("", start=1), None)
        asked = time.monotonic()
        await stream.receive(*rounds("y", start=2), None)
        await wait_until(pilot, lambda: msg.text == "xy", what="the text's frame")
        assert time.monotonic() - asked < SpecPanel.REDRAW_S - TEXT_INTERVAL_S
