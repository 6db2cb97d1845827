"""The chat screen: conversations sidebar, messages, prompt, and the live speculation panel.

Threading: everything here runs on the UI thread. The engine lives in another process
(`engine_client.py`); its rounds arrive as messages the app hands to `reply_rounds`,
`reply_done`, `reply_failed` and `engine_died`. Every store call for chats is made here.

Rendering a growing reply is kept cheap, because on a small machine every cycle the UI spends
is taken from the decode (issue 17: a repaint of this screen costs ~10-20 ms of Python, most of
it Textual's compositor re-assembling the scrolled chat column): the text of the rounds that
arrived is appended to the reply (Textual's Markdown re-parses only from its last block) in one
frame, frames are at least TEXT_INTERVAL_S apart and further apart when they cost more, so the
UI stays within FRAME_CPU_BUDGET of a core, and the panel is redrawn in those same frames at a
lower rate still (SpecPanel.REDRAW_S).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, Static

from ...engine.events import ReplyResult, RoundEvent
from ...errors import AdaSparkError
from ..export import conversation_markdown, export_path
from ..stats import EngineGauges, SpecStats, gauges_from
from ..widgets import ChatMessage, ChatView, ConversationSidebar, PromptInput, SpecPanel
from ..widgets.chat_view import WARM_LANGUAGES, warm_up
from .dialogs import ConfirmScreen, RenameScreen

if TYPE_CHECKING:
    from ..app import AdaSparkApp
    from ..engine_client import EngineDone, EngineRounds

MAX_TOKENS = 512  # per reply; the engine stops earlier at the end-of-generation token
TEXT_INTERVAL_S = 0.1  # streamed text is appended at most ~10 times a second
# While a reply streams the UI thread may use at most this share of one core: after each frame
# the next waits until the CPU it used since the previous one fits the budget (a 10 ms repaint
# of a 160x48 screen -> 4 frames a second). On two cores every UI cycle is taken from a verify.
FRAME_CPU_BUDGET = 0.04
MAX_FRAME_GAP_S = 0.5  # text shows at least twice a second, whatever a repaint costs


def title_from(text: str) -> str:
    from ...store import title_from as store_title_from

    return store_title_from(text)


@dataclass
class ReplyRequest:
    """One reply in flight; built on the UI thread."""

    conversation_id: str
    messages: list[dict[str, str]]  # history + the new user message
    prompt: str
    turn: int
    created_conversation: bool  # the conversation was created for this prompt
    max_tokens: int = MAX_TOKENS
    request_id: int = 0  # the engine client's number for it


class ChatScreen(Screen):
    """Talk to the model; every action here is also in the command palette and the help screen."""

    BINDINGS = [
        Binding("escape", "stop_reply", "Stop", id="stop_reply",
                tooltip="Stop the reply, keeping what was generated"),
        Binding("ctrl+n", "new_chat", "New", id="new_chat", tooltip="Start a new conversation"),
        Binding("f2,ctrl+r", "rename_chat", "Rename", id="rename_chat",
                tooltip="Rename the conversation (the highlighted one when the list has focus)"),
        Binding("f8", "delete_chat", "Delete", id="delete_chat",
                tooltip="Delete the conversation (the highlighted one when the list has focus)"),
        Binding("ctrl+f", "search_chats", "Search", id="search_chats", priority=True,
                tooltip="Search conversations by title and text"),
        Binding("ctrl+s", "export_chat", "Export", id="export_chat", priority=True,
                tooltip="Export the conversation as a Markdown file"),
        Binding("ctrl+o", "copy_reply", "Copy", id="copy_reply", tooltip="Copy the last reply to the clipboard"),
        Binding("ctrl+b", "toggle_sidebar", "Chats", id="toggle_sidebar",
                tooltip="Show or hide the conversations sidebar"),
        Binding("ctrl+g", "toggle_panel", "Panel", id="toggle_panel",
                tooltip="Show or hide the speculation panel"),
        Binding("ctrl+l", "focus_prompt", "Prompt", id="focus_prompt", show=False,
                tooltip="Move the cursor to the message box"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.stats = SpecStats()
        self.conversation_id: str | None = None
        self.history: list[dict[str, str]] = []
        self.last_reply: str = ""
        self.generating = False
        self._request: ReplyRequest | None = None
        self._pending: tuple[ChatMessage, ChatMessage] | None = None  # (user, assistant) in flight
        self._received: list[str] = []  # the reply's text as it arrived from the engine
        self._unshown: list[str] = []  # received but not yet appended to the reply widget
        self._received_tokens = 0
        self._flush_timer: Timer | None = None  # the next frame (see _frame)
        self._last_flush = 0.0
        self._frame_gap = TEXT_INTERVAL_S  # the wait before the next frame (see _frame)
        self._frame_cpu: float | None = None  # UI thread CPU seconds when the last frame began
        self._panel_stale = False  # the panel's figures changed since it was drawn
        # Per reply, (monotonic time the round ended in the engine process, the round): lets a
        # test (and a curious reader) count the rounds that ran after Esc.
        self.round_log: list[tuple[float, RoundEvent]] = []
        self.cancel_requested_at: float | None = None

    @property
    def adaspark(self) -> "AdaSparkApp":
        return self.app  # type: ignore[return-value]

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Header(icon="◆")
        with Horizontal(id="main"):
            yield ConversationSidebar(id="sidebar")
            with Vertical(id="chat-column"):
                yield ChatView(id="chat")
                yield Static("", id="status")
                yield PromptInput(id="prompt")
            yield SpecPanel(self.stats, id="panel")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_conversations()
        self.query_one(PromptInput).focus()
        self.set_status()
        self.adaspark.start_engine_load()
        self._warm = list(WARM_LANGUAGES)
        self.set_timer(0.2, self._warm_next)

    def _warm_next(self) -> None:
        """One highlighter per tick while the model loads, so the UI stays responsive; none once a
        reply runs (its cost would be taken from the decode)."""
        if not self._warm:
            return
        if self.generating:
            self.set_timer(1.0, self._warm_next)
            return
        warm_up(self._warm.pop(0))
        self.set_timer(0.02, self._warm_next)

    @property
    def chat_view(self) -> ChatView:
        return self.query_one(ChatView)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    @property
    def panel(self) -> SpecPanel:
        return self.query_one(SpecPanel)

    @property
    def sidebar(self) -> ConversationSidebar:
        return self.query_one(ConversationSidebar)

    def set_status(self, text: str | None = None) -> None:
        if text is None:
            app = self.adaspark
            if app.load_error is not None:
                text = "The model failed to load." if app.engine.loads == 0 else "The engine is not running."
            elif not app.engine.ready:
                text = "Loading the model… you can type already."
            elif self.generating:
                text = "Generating… Esc stops and keeps the text so far."
            else:
                text = "Ready."
        self.query_one("#status", Static).update(text, layout=False)

    def engine_ready(self, gauges: EngineGauges | None) -> None:
        """Called by the app once the engine process has loaded its engine."""
        if gauges is not None and not self.generating:
            self.stats.set_gauges(gauges)
        self.panel.show()
        self.set_status()

    def engine_unavailable(self) -> None:
        """Called by the app when no engine will answer (its load failed, or it kept dying)."""
        self.set_status()

    # ------------------------------------------------------------------ conversations
    def refresh_conversations(self) -> None:
        try:
            rows = self.adaspark.store.list_conversations(search=self.sidebar.search_text or None)
        except AdaSparkError as err:
            self.notify(str(err), title="Store", severity="error")
            return
        self.sidebar.show(rows, self.conversation_id)

    @on(ConversationSidebar.SearchChanged)
    def _search_changed(self) -> None:
        self.refresh_conversations()

    @on(ConversationSidebar.Selected)
    async def _conversation_selected(self, event: ConversationSidebar.Selected) -> None:
        await self.open_conversation(event.conversation_id)

    async def open_conversation(self, conversation_id: str) -> None:
        """Show a stored conversation; the next reply sends its whole history to the engine,
        which rebuilds its KV prefix when that history is not what it has cached."""
        if self.generating:
            self.notify("A reply is being generated; Esc stops it.", severity="warning")
            return
        store = self.adaspark.store
        try:
            conv = store.get_conversation(conversation_id)
            rows = store.get_messages(conversation_id)
        except AdaSparkError as err:
            self.notify(str(err), title="Store", severity="error")
            return
        history: list[dict[str, str]] = []
        if conv and conv.get("system"):
            history.append({"role": "system", "content": conv["system"]})
        view = self.chat_view
        await view.clear()
        for m in rows:
            if m["role"] not in ("system", "user", "assistant"):
                continue
            history.append({"role": m["role"], "content": m["content"]})
            await view.add_message(m["role"], m["content"], note=reply_note(m.get("meta")) if m["role"] == "assistant" else "")
        self.conversation_id = conversation_id
        self.history = history
        self.last_reply = next((m["content"] for m in reversed(history) if m["role"] == "assistant"), "")
        view.scroll_end(animate=False)
        self.refresh_conversations()
        self.prompt.focus()

    async def new_conversation(self) -> None:
        if self.generating:
            self.notify("A reply is being generated; Esc stops it.", severity="warning")
            return
        self.conversation_id = None
        self.history = []
        self.last_reply = ""
        await self.chat_view.clear()
        self.refresh_conversations()
        self.prompt.focus()

    def _target_conversation(self) -> str | None:
        """The highlighted conversation when the list has focus, else the open one."""
        if self.sidebar.option_list.has_focus:
            return self.sidebar.highlighted_id()
        return self.conversation_id

    # ------------------------------------------------------------------ sending
    @on(PromptInput.Submitted)
    async def _submitted(self, event: PromptInput.Submitted) -> None:
        await self.send(event.text)

    async def send(self, text: str) -> bool:
        """Send a prompt: show it, and ask the engine for a reply. False if nothing was sent."""
        prompt = text.strip()
        if not prompt:
            return False
        if self.generating:
            self.notify("A reply is being generated; Esc stops it.", severity="warning")
            return False
        app = self.adaspark
        if app.load_error is not None:
            self.notify(f"The model failed to load: {app.load_error}", severity="error")
            return False
        created = False
        if self.conversation_id is None:
            try:
                self.conversation_id = app.store.create_conversation(title_from(prompt), app.model_label)
            except AdaSparkError as err:
                self.notify(str(err), title="Store", severity="error")
                return False
            created = True
        messages = [*self.history, {"role": "user", "content": prompt}]
        request = ReplyRequest(self.conversation_id, messages, prompt,
                               turn=sum(1 for m in messages if m["role"] == "user") - 1,
                               created_conversation=created, max_tokens=app.max_tokens)
        self.prompt.clear()
        view = self.chat_view
        view.following = True
        user_msg = await view.add_message("user", prompt)
        reply_msg = await view.add_message("assistant", "")
        reply_msg.set_note("…")
        # No await from here on until the request is sent: the engine's answer is handled by the
        # app's message loop, which must find this reply's state in place.
        self._pending = (user_msg, reply_msg)
        self._request = request
        self._received, self._unshown, self._received_tokens = [], [], 0
        self._frame_gap, self._frame_cpu = TEXT_INTERVAL_S, None
        self.round_log = []
        self.cancel_requested_at = None
        self.stats.start_reply()
        self.stats.generating = True
        self.generating = True
        try:
            request.request_id = app.engine.generate(request.conversation_id, request.messages,
                                                     request.max_tokens, request.turn,
                                                     sampling=getattr(app, "sampling", None))
        except RuntimeError as err:
            self._pending = None
            await self._withdraw(request, user_msg, reply_msg)
            self.notify(f"{err}; your message is back in the box.", severity="error")
            self._end_generation()
            return False
        self.set_status()
        self.panel.show()
        if created:
            self.refresh_conversations()
        return True

    def _is_current(self, request_id: int) -> bool:
        return self._request is not None and self._request.request_id == request_id

    # ------------------------------------------------------------------ the reply streams in
    async def reply_rounds(self, message: "EngineRounds") -> None:
        """A batch of rounds from the engine process: figures now, text within TEXT_INTERVAL_S."""
        if not self._is_current(message.request_id):
            return  # a reply abandoned after an engine restart
        for t, event in zip(message.times, message.events):
            self.stats.add(event)
            self.round_log.append((t, event))
            if event.text:
                self._received.append(event.text)
                self._unshown.append(event.text)
            self._received_tokens = max(self._received_tokens, event.reply_tokens)
        gauges = gauges_from(message.gauges)
        if gauges is not None:
            self.stats.set_gauges(gauges)
        self._panel_stale = True
        if self._flush_timer is None:
            wait = self._frame_gap - (time.monotonic() - self._last_flush)
            if wait <= 0:
                await self._frame()
            else:
                self._flush_timer = self.set_timer(wait, self._frame)

    async def _frame(self) -> None:
        """One repaint for everything that arrived since the last: the new text is appended to
        the reply, and the panel is redrawn if SpecPanel.REDRAW_S has passed (else a later frame
        does it). Text and panel share the frame, so streaming costs at most ~10 repaints a second."""
        self._flush_timer = None
        now = time.monotonic()
        self._last_flush = now
        # The CPU this thread used since the last frame began (that frame's layout and paint,
        # and the rounds handled since) sets the gap to the next one.
        cpu = time.thread_time()
        if self._frame_cpu is not None:
            self._frame_gap = min(MAX_FRAME_GAP_S, max(TEXT_INTERVAL_S, (cpu - self._frame_cpu) / FRAME_CPU_BUDGET))
        self._frame_cpu = cpu
        if self._pending is not None and self._unshown:
            text = "".join(self._unshown)
            self._unshown = []
            reply_msg = self._pending[1]
            if reply_msg.text == "":
                reply_msg.set_note("")
            await reply_msg.write(text)
            # The paint follows in the same turn of the event loop: a UI starved of CPU flushes
            # late, and that is the delay this figure is meant to show.
            self.stats.shown(time.monotonic(), self._received_tokens)
        if self._panel_stale:
            panel_wait = self.panel.redraw_due_in(now)
            if panel_wait <= 0:
                self._panel_stale = False
                self.panel.show()
            elif self._flush_timer is None:
                self._flush_timer = self.set_timer(max(panel_wait, self._frame_gap), self._frame)

    async def _flush_text(self) -> None:
        """Show every text received so far now (at the end of a reply)."""
        self._stop_flushing()
        self._panel_stale = False
        await self._frame()

    def _stop_flushing(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.stop()
            self._flush_timer = None

    async def reply_done(self, message: "EngineDone") -> None:
        """The reply ended (complete, at the token cap, or stopped by the user)."""
        if not self._is_current(message.request_id):
            return
        result, request = message.result, self._request
        assert request is not None
        self._stop_flushing()
        await self._flush_text()
        gauges = gauges_from(message.gauges)
        if gauges is not None:
            self.stats.set_gauges(gauges)
        self.stats.finish(result.tokens_per_s, result.n_tokens)
        pending, self._pending = self._pending, None
        try:
            if pending is None:
                return
            user_msg, reply_msg = pending
            if result.stopped and not result.text.strip():
                # Nothing was generated: as if the prompt had not been sent.
                await self._withdraw(request, user_msg, reply_msg)
                self.notify("Stopped before the first token; your message is back in the box.")
                return
            shown = "".join(self._received)
            if result.text.startswith(shown) and len(result.text) > len(shown):
                await reply_msg.write(result.text[len(shown):])  # bytes the decoder held to the end
            # Record first (history, store), then finish the display: nothing is lost if the
            # app is closed while the last fragments render.
            meta = reply_meta(result, self.adaspark.model_label, self.stats.shown_rate)
            self._record(request, result.text, meta)
            await reply_msg.finish(reply_note(meta))
            self.refresh_conversations()
            if result.stopped:
                self.notify(f"Stopped: kept {result.n_tokens} tokens.")
        finally:
            self._end_generation()

    def _record(self, request: ReplyRequest, text: str, meta: dict[str, Any]) -> None:
        """The turn joins the history and the store."""
        self.history = [*request.messages, {"role": "assistant", "content": text}]
        self.last_reply = text
        try:
            store = self.adaspark.store
            store.add_message(request.conversation_id, "user", request.prompt)
            store.add_message(request.conversation_id, "assistant", text, meta=meta)
        except AdaSparkError as err:
            self.notify(f"The reply was not saved: {err}", title="Store", severity="error")

    async def reply_stopped_early(self, request_id: int) -> None:
        """Esc before the engine had started the reply (it was still loading)."""
        if not self._is_current(request_id):
            return
        request, pending, self._pending = self._request, self._pending, None
        try:
            if pending is not None and request is not None:
                await self._withdraw(request, *pending)
                self.notify("Stopped before the first token; your message is back in the box.")
        finally:
            self._end_generation()

    async def reply_failed(self, request_id: int, error: str) -> None:
        """The engine raised: the prompt goes back in the box, the conversation is kept."""
        if not self._is_current(request_id):
            return
        self._stop_flushing()
        request, pending, self._pending = self._request, self._pending, None
        try:
            if pending is not None and request is not None:
                await self._withdraw(request, *pending)
            self.notify(f"{error}\nYour message is back in the box.", title="Reply failed",
                        severity="error", timeout=10)
        finally:
            self._end_generation()

    async def engine_died(self) -> str:
        """The engine process ended mid-reply or idle. A reply in progress keeps the text that
        had arrived (saved as a stopped reply), or gives the prompt back if none had. Returns a
        sentence for the app's notification."""
        request, pending = self._request, self._pending
        if request is None or pending is None:
            return ""
        self._stop_flushing()
        self._pending = None
        text = "".join(self._received)
        user_msg, reply_msg = pending
        try:
            if not text.strip():
                await self._withdraw(request, user_msg, reply_msg)
                return "Your message is back in the box. "
            rest, self._unshown = "".join(self._unshown), []
            last = self.round_log[-1][1] if self.round_log else None
            meta = {"model": self.adaspark.model_label, "n_tokens": self._received_tokens,
                    "decode_s": round(last.reply_seconds, 4) if last else 0.0,
                    "tokens_per_s": round(self.stats.reply_rate or 0.0, 2), "stopped": True,
                    "engine_died": True}
            self._record(request, text, meta)
            await reply_msg.write(rest)
            await reply_msg.finish(reply_note(meta))
            self.refresh_conversations()
            return f"Kept the {self._received_tokens} tokens generated so far. "
        finally:
            self._end_generation()

    async def _withdraw(self, request: ReplyRequest, user_msg: ChatMessage, reply_msg: ChatMessage) -> None:
        """Undo a send: remove its messages, restore the prompt, drop a conversation made for it."""
        await user_msg.remove()
        await reply_msg.remove()
        self.prompt.restore(request.prompt)
        self.prompt.focus()
        self._drop_conversation(request)

    def _drop_conversation(self, request: ReplyRequest) -> None:
        if request.created_conversation and not self.history:
            try:
                self.adaspark.store.delete_conversation(request.conversation_id)
            except AdaSparkError:
                pass
            if self.conversation_id == request.conversation_id:
                self.conversation_id = None
            self.refresh_conversations()

    def _end_generation(self) -> None:
        if self._request is not None:
            self.adaspark.engine.reply_ended(self._request.request_id)
        self._request = None
        self.generating = False
        self.stats.generating = False
        self.panel.show()
        self.set_status()
        self.adaspark.reply_ended()

    def stop_reply(self) -> bool:
        """Ask the running reply to stop (it ends after the current round). False if none runs."""
        if not self.generating:
            return False
        if self.cancel_requested_at is None:
            self.cancel_requested_at = time.monotonic()
        self.adaspark.engine.cancel()
        self.set_status("Stopping…")
        return True

    # ------------------------------------------------------------------ actions
    def action_stop_reply(self) -> None:
        if not self.stop_reply():
            self.prompt.focus()

    async def action_new_chat(self) -> None:
        await self.new_conversation()

    def action_rename_chat(self) -> None:
        cid = self._target_conversation()
        if cid is None:
            self.notify("No conversation to rename yet.", severity="warning")
            return
        current = self.sidebar.title_of(cid) or ""

        def done(title: str | None) -> None:
            if not title:
                return
            try:
                self.adaspark.store.rename_conversation(cid, title)
            except AdaSparkError as err:
                self.notify(str(err), title="Store", severity="error")
                return
            self.refresh_conversations()
            self.notify(f"Renamed to “{self.sidebar.title_of(cid) or title}”.")

        self.app.push_screen(RenameScreen(current), done)

    def action_delete_chat(self) -> None:
        cid = self._target_conversation()
        if cid is None:
            self.notify("No conversation to delete.", severity="warning")
            return
        if cid == self.conversation_id and self.generating:
            self.notify("A reply is being generated; Esc stops it first.", severity="warning")
            return
        title = self.sidebar.title_of(cid) or "this conversation"

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            try:
                self.adaspark.store.delete_conversation(cid)
            except AdaSparkError as err:
                self.notify(str(err), title="Store", severity="error")
                return
            if cid == self.conversation_id:
                await self.new_conversation()
            else:
                self.refresh_conversations()
            self.notify(f"Deleted “{title}”.")

        self.app.push_screen(ConfirmScreen(f"Delete “{title}”? This cannot be undone."), done)

    def action_search_chats(self) -> None:
        sidebar = self.sidebar
        sidebar.display = True
        sidebar.query_one("#search").focus()

    def action_export_chat(self) -> None:
        self.export_markdown()

    def export_markdown(self) -> Path | None:
        """Write the open conversation to a Markdown file; notify and return its path."""
        if self.conversation_id is None or not self.history:
            self.notify("Nothing to export yet.", severity="warning")
            return None
        app = self.adaspark
        try:
            rows = app.store.get_messages(self.conversation_id)
        except AdaSparkError as err:
            self.notify(str(err), title="Store", severity="error")
            return None
        title = self.sidebar.title_of(self.conversation_id) or title_from(self.history[0]["content"])
        text = conversation_markdown(title, rows, app.model_label)
        try:
            app.export_dir.mkdir(parents=True, exist_ok=True)
            path = export_path(app.export_dir, title)
            path.write_text(text, encoding="utf-8")
        except OSError as err:
            self.notify(f"Could not write the export: {err}", severity="error")
            return None
        self.notify(f"Exported to {path}", title="Export")
        return path

    def action_copy_reply(self) -> None:
        if not self.last_reply:
            self.notify("No reply to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(self.last_reply)
        self.notify(f"Copied the last reply ({len(self.last_reply)} characters).")

    def action_toggle_sidebar(self) -> None:
        self.sidebar.display = not self.sidebar.display

    def action_toggle_panel(self) -> None:
        self.panel.display = not self.panel.display

    def action_focus_prompt(self) -> None:
        self.prompt.focus()

    def on_unmount(self) -> None:
        if self.generating:
            self.adaspark.engine.cancel()


def reply_meta(result: ReplyResult, model: str, shown_rate: float | None = None) -> dict[str, Any]:
    """What is stored with an assistant message (and shown under it).

    `tokens_per_s` is the engine's n_tokens / decode_s, measured in the engine process exactly
    as `adaspark run` measures it; `shown_tokens_per_s` is the speed the display delivered.
    """
    meta = {
        "model": model, "arm": result.arm, "n_tokens": result.n_tokens, "decode_s": round(result.decode_s, 4),
        "tokens_per_s": round(result.tokens_per_s, 2), "rounds": result.rounds,
        "widths": {str(k): v for k, v in sorted(result.widths.items())}, "stopped": result.stopped,
        "looped": result.looped,
    }
    if shown_rate is not None:
        meta["shown_tokens_per_s"] = round(shown_rate, 2)
    return meta


def reply_note(meta: dict[str, Any] | None) -> str:
    """'42 tokens · 95.3 tok/s · 20 rounds · stopped' from a reply's stored meta."""
    if not meta:
        return ""
    parts = []
    if meta.get("n_tokens") is not None:
        parts.append(f"{meta['n_tokens']} tokens")
    if meta.get("tokens_per_s"):
        parts.append(f"{meta['tokens_per_s']:.1f} tok/s")
    if meta.get("rounds"):
        parts.append(f"{meta['rounds']} rounds")
    if meta.get("engine_died"):
        parts.append("stopped: the engine process ended")
    elif meta.get("stopped"):
        parts.append("stopped")
    elif meta.get("looped"):
        parts.append("token cap reached")
    return " · ".join(parts)
