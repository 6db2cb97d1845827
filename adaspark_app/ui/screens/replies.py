"""The chat's reply in flight, from the moment it is asked for to its end.

`ReplyRunner` has the `Conversation` build the request (`send`, `regenerate`), shows its
messages, asks the engine once they are laid out and painted, passes the engine's rounds to the
reply's `ReplyStream`, and when the reply ends records it in the `Conversation` (and the store)
or withdraws it: its messages leave, the turns it would have replaced come back, the prompt goes
back in the box. One reply at a time. The chat screen routes the engine client's messages here;
what is the screen's own (its status line, the conversations list, the header, editing) this
calls back through `ReplyOwner`.

Threading: the UI thread only; the engine lives in another process (`engine_client.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from ...engine.events import RoundEvent
from ...errors import AdaSparkError
from ...wording import counted
from ..collector import freeze_for_reply, thaw_after_reply
from ..conversation import (CHAT_ENDED, ENGINE_DIED, Conversation, Refusal, ReplyRequest, cut_reply_meta, reply_meta,
                            reply_note)
from ..engine_client import EngineDone, EnginePrefill, EngineRounds
from ..host import ChatHost
from ..stats import SpecStats, gauges_from
from ..widgets import ChatMessage, ChatView, PromptInput, SpecPanel
from ..widgets.reply_stream import ReplyStream

BUSY = "A reply is being generated; Esc stops it."
THAW_DELAY_S = 0.3  # after a reply ends, the held-back garbage collection (ui/collector.py)
SEND_WAIT_REFRESHES = 5  # refreshes a request may wait for its messages to be laid out and painted
# How often a streaming reply's text so far is written to the store (a reply in flight): what a
# chat killed mid-reply loses at most. One small write on the UI thread.
IN_FLIGHT_INTERVAL_S = 1.0


def laid_out(msg: ChatMessage) -> bool:
    """Whether a reply's message and its streaming tail have a size on screen."""
    return bool(msg.region.height) and bool(msg.tail_widget.size.height)


def screen_settled(screen: Any) -> bool:
    """Whether `screen` has no layout, scroll or repaint left to do.

    Why: the chat view scrolls to its end after the refresh that laid the new messages out, and
    that scroll is one more layout and a repaint of the whole view (30-60 ms here). Sent before
    it, the request's first rounds shared the two cores with it. Textual keeps these flags
    private; a version without them reads as settled (the request then goes at once, as before).
    """
    return not (getattr(screen, "_layout_required", False) or getattr(screen, "_scroll_required", False)
                or getattr(screen, "_repaint_required", False) or getattr(screen, "_dirty_widgets", None))


class ReplyOwner(Protocol):
    """What a `ReplyRunner` needs of the screen whose replies it runs (`ChatScreen`)."""

    def set_status(self, text: str | None = None) -> None: ...

    def refresh_conversations(self) -> None: ...

    def show_settings(self) -> None: ...

    def begin_editing(self, index: int, text: str | None = None) -> None: ...

    def stop_editing(self, restore: bool) -> None: ...

    def reply_ended(self) -> None: ...

    def notify(self, message: str, *, title: str = "", severity: Any = "information",
               timeout: float | None = None, markup: bool = True) -> None: ...

    def call_after_refresh(self, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> bool: ...

    def set_timer(self, delay: float, callback: Callable[[], Awaitable[None] | None]) -> Any: ...


@dataclass
class Pending:
    """The reply in flight on screen: its messages, its stream, and the turns it would replace
    (hidden meanwhile, removed once it is recorded, shown again if it is withdrawn)."""

    user_msg: ChatMessage | None
    reply_msg: ChatMessage
    stream: ReplyStream
    hidden: list[ChatMessage]


class ReplyRunner:
    """Runs the chat's replies one at a time (see the module's docstring)."""

    def __init__(self, owner: ReplyOwner, host: ChatHost, conversation: Conversation, view: ChatView,
                 prompt: PromptInput, panel: SpecPanel, stats: SpecStats) -> None:
        self.owner = owner
        self.host = host
        self.conversation = conversation
        self.view = view
        self.prompt = prompt
        self.panel = panel
        self.stats = stats
        self.generating = False
        self._request: ReplyRequest | None = None
        self._pending: Pending | None = None
        self._cursor_blink = True  # the prompt's cursor blinks, except while a reply streams
        # Per reply, (monotonic time the round ended in the engine process, the round): lets a
        # test (and a curious reader) count the rounds that ran after Esc.
        self.round_log: list[tuple[float, RoundEvent]] = []
        self.cancel_requested_at: float | None = None
        self._in_flight_saved = 0.0  # monotonic time the reply's text was last written (see rounds)

    def is_current(self, request_id: int) -> bool:
        """Whether `request_id` is the reply in flight (late messages of an abandoned one are not)."""
        return self._request is not None and self._request.request_id == request_id

    # ------------------------------------------------------------------ asking
    async def send(self, text: str) -> bool:
        """Send a prompt: show it, and ask the engine for a reply. False if nothing was sent.

        While a message is being edited, the prompt replaces that message: it and every later
        turn are dropped (no branch is kept) once the new reply is recorded."""
        prompt = text.strip()
        if not prompt or not self._can_start():
            return False
        try:
            request = self.conversation.send_request(prompt, self.host.model_label)
        except AdaSparkError as err:
            self.owner.notify(str(err), title="Store", severity="error")
            return False
        self.prompt.clear()
        self.owner.stop_editing(restore=True)  # an edit resent: what the box held before it comes back
        return await self.start(request)

    async def regenerate(self) -> bool:
        """A new reply to the last user message, with a new seed; the turns before it are kept
        (the KV cache holds them: only the reply is new). False if nothing was started."""
        if not self._can_start():
            return False
        self.owner.stop_editing(restore=True)
        try:
            request = self.conversation.regenerate_request()
        except Refusal as why:
            self.owner.notify(str(why), severity="warning")
            return False
        if self.conversation.settings.sampling.greedy:
            self.owner.notify("Temperature is 0 (greedy): the same reply comes back. Raise it in the "
                              "settings (F3) for a different one.", severity="warning")
        return await self.start(request)

    def _can_start(self) -> bool:
        if self.generating:
            self.owner.notify(BUSY, severity="warning")
            return False
        if self.host.load_error is not None:
            self.owner.notify(f"The model failed to load: {self.host.load_error}", severity="error")
            return False
        return True

    async def start(self, request: ReplyRequest) -> bool:
        """Show the request's turns and ask the engine for its reply (once they are painted)."""
        hidden = await self.view.turns_from(request.keep)
        user_msg, reply_msg = await self.view.show_request(None if request.regenerate else request.prompt,
                                                           request.prompt, hidden, self.host.opens_thinking)
        # No await from here on until the request is sent: the engine's answer is handled by
        # the screen's message loop, which must find this reply's state in place.
        self._pending = Pending(user_msg, reply_msg, reply_msg.start_stream(self.stats, self.panel), hidden)
        self._request = request
        self.conversation.begin_in_flight(request, self.host.model_label)
        self._in_flight_saved = float("-inf")  # its first text is written at once
        self.round_log = []
        self.cancel_requested_at = None
        self.stats.start_reply()
        self.stats.generating = True
        self.generating = True
        # A blink is a repaint, taken from the decode: none while the reply streams.
        self._cursor_blink, self.prompt.cursor_blink = self.prompt.cursor_blink, False
        self.owner.set_status()
        self.panel.show()
        if request.created_conversation:
            self.owner.refresh_conversations()
        # The engine is asked once the new messages are laid out and painted. That frame (a
        # layout of the chat column and a full repaint, 30-50 ms) would otherwise run beside the
        # reply's first rounds on a two-core machine and be taken from them: a 256-token second
        # turn decodes in under a second here, so it cost it several percent.
        self.owner.call_after_refresh(self._send, request)
        return True

    async def _send(self, request: ReplyRequest, waits: int = 0) -> None:
        """Send `request` to the engine (after the first paint of its messages, see start)."""
        if self._request is not request or request.sent:
            return  # withdrawn meanwhile (the engine died, or the screen moved on)
        if request.stop_before_send:
            await self.give_back(request.request_id)  # unsent: its id is still 0
            return
        pending = self._pending
        if waits < SEND_WAIT_REFRESHES and ((pending is not None and not laid_out(pending.reply_msg))
                                            or not screen_settled(self.owner)):
            # the refresh came before the reply's widgets were laid out (a busy machine), or the
            # view's scroll to its end is still to be painted: one more
            self.owner.call_after_refresh(self._send, request, waits + 1)
            return
        freeze_for_reply()  # no full collection of the UI's objects beside the decode (ui/collector.py)
        try:
            request.request_id = self.host.engine.generate(request.conversation_id, request.messages,
                                                           request.max_tokens, request.turn,
                                                           sampling=request.sampling)
            request.sent = True
        except RuntimeError as err:
            self._pending = None
            if pending is not None:
                await self._withdraw(request, pending)
            self.owner.notify(f"{err}; your message is back in the box.", severity="error")
            self._end()

    def stop(self) -> bool:
        """Ask the running reply to stop (it ends after the current round). False if none runs."""
        if not self.generating:
            return False
        request = self._request
        if request is not None and not request.sent:
            request.stop_before_send = True  # _send gives the prompt back instead
        else:
            self.host.engine.cancel()
        # Stamped once the engine can see the stop (the flag is set): a UI thread kept waiting
        # between the key and the flag must not count as rounds the engine ran past the stop.
        if self.cancel_requested_at is None:
            self.cancel_requested_at = time.monotonic()
        self.owner.set_status("Stopping…")
        return True

    # ------------------------------------------------------------------ the engine answers
    def prefill(self, message: EnginePrefill) -> None:
        """A long prompt being read (a pasted page on the CPU takes seconds): the status line counts
        it, until the first token or a stop."""
        if not self.is_current(message.request_id) or self._pending is None or self.cancel_requested_at is not None:
            return
        self.owner.set_status(f"Reading prompt: {message.done:,}/{message.total:,} tokens… Esc stops")

    async def rounds(self, message: EngineRounds) -> None:
        """A batch of rounds from the engine process: figures now, text in the reply's next frame."""
        if not self.is_current(message.request_id) or self._pending is None:
            return  # a reply abandoned after an engine restart
        if not self.round_log and self.cancel_requested_at is None:
            self.owner.set_status()  # the first token: "Generating…" again, after a long prompt's count
        self.round_log.extend(zip(message.times, message.events))
        stream = self._pending.stream
        await stream.receive(message.times, message.events, message.gauges)
        now = time.monotonic()
        if self._request is not None and stream.received and now - self._in_flight_saved >= IN_FLIGHT_INTERVAL_S:
            self._in_flight_saved = now
            self.conversation.update_in_flight(self._request, stream.text, self._cut_meta(stream, CHAT_ENDED))

    async def done(self, message: EngineDone) -> None:
        """The reply ended (complete, at the token cap, or stopped by the user)."""
        if not self.is_current(message.request_id):
            return
        result, request, pending = message.result, self._request, self._pending
        assert request is not None
        if pending is not None:
            await pending.stream.flush()
        gauges = gauges_from(message.gauges)
        if gauges is not None:
            self.stats.set_gauges(gauges)
        self.stats.finish(result.tokens_per_s, result.n_tokens)
        self._pending = None
        try:
            if pending is None:
                return
            if result.stopped and not result.text.strip():
                # Nothing was generated: as if the prompt had not been sent.
                await self._withdraw(request, pending)
                self.owner.notify("Stopped before the first token; " + request.given_back())
                return
            shown = pending.stream.text
            if result.text.startswith(shown) and len(result.text) > len(shown):
                await pending.reply_msg.write(result.text[len(shown):])  # bytes the decoder held to the end
            # Record first (history, store), then finish the display: nothing is lost if the
            # app is closed while the last fragments render.
            meta = reply_meta(result, self.host.model_label, self.stats.shown_rate, self.stats.lag_max)
            self._record(request, result.text, meta)
            self.conversation.context_used = result.prompt_length + result.n_tokens
            self.owner.show_settings()  # the header's context figure
            await self._drop_replaced(pending)
            await pending.reply_msg.finish(reply_note(meta))
            await self.view.mark_context(pending.reply_msg, result.dropped_turns, result.capped_to)
            self.owner.refresh_conversations()
            if result.stopped:
                self.owner.notify(f"Stopped: kept {counted(result.n_tokens, 'token')}.")
            elif result.looped and pending.reply_msg.still_thinking:
                self.owner.notify(f"The reply reached its {request.max_tokens:,}-token cap while the model was still "
                                  "thinking: raise Max tokens in the settings (F3) and regenerate (F5).",
                                  title="Token cap", severity="warning", timeout=12)
            if result.learned_not_saved:
                self.owner.notify(f"What this reply taught the scheduler was not saved: {result.learned_not_saved}",
                                  title="Store", severity="warning")
        finally:
            self._end()

    async def give_back(self, request_id: int, error: str | None = None) -> None:
        """The reply `request_id` will not come: Esc before the engine had started it (it was
        still loading, or the request was not sent yet), or the engine raised (`error`). Its
        prompt goes back in the box; the conversation is kept."""
        if not self.is_current(request_id):
            return
        request, pending, self._pending = self._request, self._pending, None
        assert request is not None
        try:
            if pending is not None:
                pending.stream.stop()
                await self._withdraw(request, pending)
            if error is not None:
                self.owner.notify(f"{error}\n" + request.given_back().capitalize(), title="Reply failed",
                                  severity="error", timeout=10)
            elif pending is not None:
                self.owner.notify("Stopped before the first token; " + request.given_back())
        finally:
            self._end()

    async def load_failed(self) -> None:
        """The engine failed to load (the app has said why): a reply asked for meanwhile waits for
        an engine that will not come. Its prompt goes back in the box; the conversation is kept."""
        request, pending, self._pending = self._request, self._pending, None
        if request is None:
            return
        try:
            if pending is not None:
                pending.stream.stop()
                await self._withdraw(request, pending)
            self.owner.notify("No reply: the model did not load; " + request.given_back(), severity="warning")
        finally:
            self._end()

    async def engine_died(self) -> str:
        """The engine process ended mid-reply or idle. A reply in progress keeps the text that
        had arrived (saved as a stopped reply), or gives the prompt back if none had. Returns a
        sentence for the app's notification."""
        request, pending = self._request, self._pending
        if request is None or pending is None:
            return ""
        stream = pending.stream
        stream.stop()
        self._pending = None
        text = stream.text
        try:
            if not text.strip():
                await self._withdraw(request, pending)
                return request.given_back().capitalize() + " "
            rest = stream.take_unshown()
            meta = self._cut_meta(stream, ENGINE_DIED)
            self._record(request, text, meta)
            await self._drop_replaced(pending)
            await pending.reply_msg.write(rest)
            await pending.reply_msg.finish(reply_note(meta))
            self.owner.refresh_conversations()
            n = stream.received_tokens
            return f"Kept the {counted(n, 'token')} generated so far. "
        finally:
            self._end()

    def _cut_meta(self, stream: ReplyStream, ended: str) -> dict[str, Any]:
        """The meta the reply in flight is kept with if it is cut short now (`ended`: why)."""
        assert self._request is not None
        last = self.round_log[-1][1] if self.round_log else None
        return cut_reply_meta(self.host.model_label, stream.received_tokens, last, self.stats.reply_rate,
                              self._request.sampling, ended=ended)

    # ------------------------------------------------------------------ the reply's end
    def _record(self, request: ReplyRequest, text: str, meta: dict[str, Any]) -> None:
        try:
            self.conversation.record(request, text, meta)
        except AdaSparkError as err:
            self.owner.notify(f"The reply was not saved: {err}", title="Store", severity="error")

    async def _drop_replaced(self, pending: Pending) -> None:
        """Remove the messages of the turns a recorded reply replaced."""
        for widget in pending.hidden:
            await widget.remove()
        pending.hidden = []

    async def _withdraw(self, request: ReplyRequest, pending: Pending) -> None:
        """Undo a send: remove its messages, show the turns it would have replaced again, restore
        the prompt (an edit goes back to editing its message), drop a conversation made for it."""
        await self.view.withdraw(pending.user_msg, pending.reply_msg, pending.hidden)
        pending.hidden = []
        if self.host.quitting:
            # The box the prompt would go back to closes with the app: the message stays in the
            # conversation instead, unanswered (F5 answers it).
            self.conversation.keep_unanswered(request)
            return
        if not request.regenerate:
            if request.edit_index is not None and request.edit_index < len(self.conversation.turns):
                # back to editing it; what the box holds meanwhile is kept as the draft it gives back
                self.owner.begin_editing(request.edit_index, text=request.prompt)
            else:
                self.prompt.restore(request.prompt)
        self.prompt.focus()
        self.conversation.end_in_flight(request)
        if self.conversation.drop_created(request):
            self.owner.refresh_conversations()

    def _end(self) -> None:
        if self._request is not None:
            self.host.engine.reply_ended(self._request.request_id)
        self._request = None
        self.generating = False
        self.stats.generating = False
        self.prompt.cursor_blink = self._cursor_blink
        self.panel.show()
        self.owner.set_status()
        self.owner.reply_ended()
        self.owner.set_timer(THAW_DELAY_S, self._thaw_collector)

    def _thaw_collector(self) -> None:
        """The full collection held back while the reply streamed, once none streams (after the
        reply's last paint: THAW_DELAY_S)."""
        if not self.generating:
            thaw_after_reply()
