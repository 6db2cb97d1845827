"""The chat screen: conversations sidebar, messages, prompt, and the live speculation panel.

Threading: everything here runs on the UI thread. The engine lives in another process
(`engine_client.py`); its rounds arrive as messages the app hands to `reply_rounds`,
`reply_done`, `reply_failed` and `engine_died`. The open conversation is a `Conversation`
(ui/conversation.py, no Textual): its turns, settings and edit state, the requests its replies
are asked with, and its store writes.

Rendering a growing reply is kept cheap, because on a small machine every cycle the UI spends
is taken from the decode (issue 17): the reply's message owns a `ReplyStream`
(widgets/reply_stream.py) that appends the text of the rounds in frames paced to a CPU budget,
and the prompt's cursor does not blink while a reply streams (each blink is a repaint).
benchmarks/ui_cpu.py measures it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ...errors import AdaSparkError
from ...store import title_from
from ..chat_settings import ChatSettings
from ..collector import freeze_for_reply, thaw_after_reply
from ..compositor import install as install_cropped_compositor
from ..conversation import Conversation, Refusal, ReplyRequest, cut_reply_meta, reply_meta, reply_note
from ..export import reply_file_name, write_export
from ..stats import EngineGauges, SpecStats, gauges_from
from ..widgets import ChatMessage, ChatView, ConversationSidebar, PromptInput, SpecPanel
from ..widgets.chat_view import WARM_LANGUAGES, code_at, warm_up
from ..widgets.reply_stream import ReplyStream
from .dialogs import ConfirmScreen, RenameScreen, SaveFileScreen
from .settings import SettingsScreen

if TYPE_CHECKING:
    from ..app import AdaSparkApp
    from ..engine_client import EngineDone, EngineRounds

THAW_DELAY_S = 0.3  # after a reply ends, the held-back garbage collection (ui/collector.py)
SEND_WAIT_REFRESHES = 5  # refreshes a request may wait for its messages to be laid out and painted
BUSY = "A reply is being generated; Esc stops it."


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


@dataclass
class Pending:
    """The reply in flight on screen: its messages, its stream, and the turns it would replace
    (hidden meanwhile, removed once it is recorded, shown again if it is withdrawn)."""

    user_msg: ChatMessage | None
    reply_msg: ChatMessage
    stream: ReplyStream
    hidden: list[ChatMessage]


class ChatScreen(Screen):
    """Talk to the model; every action here is also in the command palette and the help screen."""

    BINDINGS = [
        Binding("escape", "stop_reply", "Stop", id="stop_reply",
                tooltip="Stop the reply, keeping what was generated (while editing a message: stop editing)"),
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
        Binding("f3", "settings", "Settings", id="settings",
                tooltip="Conversation settings: system prompt, max tokens, sampling"),
        Binding("f5", "regenerate", "Regenerate", id="regenerate",
                tooltip="Regenerate the last reply with a new seed (earlier turns are kept)"),
        Binding("f4,ctrl+up", "edit_previous", "Edit", id="edit_previous",
                tooltip="Edit an earlier message: the last one, then earlier ones on each press; "
                        "Enter resends it and drops the turns after it, Esc cancels"),
        Binding("ctrl+down", "edit_next", "Edit next", id="edit_next", show=False,
                tooltip="While editing, move to the next (later) message; past the last, stop editing"),
        Binding("f9", "copy_code", "Copy code", id="copy_code", show=False,
                tooltip="Copy the code block under the mouse pointer, else the last code block"),
        Binding("f12", "save_reply", "Save reply", id="save_reply", show=False,
                tooltip="Save the last reply as a Markdown file"),
        Binding("ctrl+b", "toggle_sidebar", "Chats", id="toggle_sidebar",
                tooltip="Show or hide the conversations sidebar"),
        Binding("ctrl+g", "toggle_panel", "Panel", id="toggle_panel",
                tooltip="Show or hide the speculation panel"),
        Binding("ctrl+l", "focus_prompt", "Prompt", id="focus_prompt", show=False,
                tooltip="Move the cursor to the message box"),
    ]

    DEFAULT_CSS = """
    ChatView > ChatMessage.editing { background: $warning 15%; border-left: thick $warning; }
    """

    def __init__(self) -> None:
        super().__init__()
        install_cropped_compositor(self)  # a frame renders only the widgets it changed (compositor.py)
        self.stats = SpecStats()
        self.conversation: Conversation  # the open one (made on mount, with the app's store)
        self.generating = False
        self._request: ReplyRequest | None = None
        self._pending: Pending | None = None
        self._cursor_blink = True  # the prompt's cursor blinks, except while a reply streams
        # Per reply, (monotonic time the round ended in the engine process, the round): lets a
        # test (and a curious reader) count the rounds that ran after Esc.
        self.round_log: list[tuple[float, Any]] = []
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

    async def on_mount(self) -> None:
        self.conversation = Conversation(self.adaspark.store, self.adaspark.default_settings())
        self.refresh_conversations()
        self.query_one(PromptInput).focus()
        self.set_status()
        self.adaspark.start_engine_load()
        self._warm = list(WARM_LANGUAGES)
        self.set_timer(0.2, self._warm_next)
        resume = getattr(self.adaspark, "resume_id", None)
        if resume:
            await self.open_conversation(resume)
        self.adaspark.settings_changed()

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

    def _refused_while_generating(self) -> bool:
        if self.generating:
            self.notify(BUSY, severity="warning")
        return self.generating

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
        self.sidebar.show(rows, self.conversation.id)

    @on(ConversationSidebar.SearchChanged)
    def _search_changed(self) -> None:
        self.refresh_conversations()

    @on(ConversationSidebar.Selected)
    async def _conversation_selected(self, event: ConversationSidebar.Selected) -> None:
        await self.open_conversation(event.conversation_id)

    async def open_conversation(self, conversation_id: str) -> None:
        """Show a stored conversation; the next reply sends its whole history to the engine,
        which rebuilds its KV prefix when that history is not what it has cached."""
        if self._refused_while_generating():
            return
        conv = self.conversation
        try:
            stored = conv.read(conversation_id)
        except AdaSparkError as err:
            self.notify(str(err), title="Store", severity="error")
            return
        self._stop_editing(restore=True)
        problems = conv.show(conversation_id, stored, self.adaspark.default_settings())
        await self.chat_view.show_turns(conv.turns)
        if problems:
            self.notify("This conversation's stored settings were partly unusable; the defaults apply "
                        "instead: " + "; ".join(problems), title="Settings", severity="warning", timeout=10)
        loaded = getattr(self.adaspark, "model_path", None)
        if stored.row and stored.row.get("settings") and not same_model(conv.settings.model_path, loaded):
            await self._follow_model(conv.settings)
        self.adaspark.settings_changed()
        self.chat_view.scroll_end(animate=False)
        self.refresh_conversations()
        self.prompt.focus()

    async def _follow_model(self, settings: ChatSettings) -> None:
        """An opened conversation held with another model: the engine switches to that model, as
        a chat app reopens a chat on its own model; its file gone, the running model answers and
        the notification says so."""
        import os

        held = settings.model or settings.model_path or "the bundled model"
        path = settings.model_path
        if path is not None and not os.path.isfile(path):
            self.notify(f"This conversation was held with {held}, whose file {path} is not there any more; "
                        f"replies now come from {self.adaspark.model_label} (Ctrl+T picks a model).",
                        title="Model", severity="warning", timeout=10)
            return
        switch = getattr(self.adaspark, "switch_model", None)
        if switch is None or not await switch(path, held, new_conversation=False):
            self.notify(f"This conversation was held with {held}; replies now come from "
                        f"{self.adaspark.model_label} (Ctrl+T picks a model).",
                        title="Model", severity="warning", timeout=10)

    async def new_conversation(self) -> None:
        if self._refused_while_generating():
            return
        self._stop_editing(restore=True)
        self.conversation.reset(self.adaspark.default_settings())
        self.adaspark.settings_changed()
        await self.chat_view.clear()
        self.refresh_conversations()
        self.prompt.focus()

    def _target_conversation(self) -> str | None:
        """The highlighted conversation when the list has focus, else the open one."""
        if self.sidebar.option_list.has_focus:
            return self.sidebar.highlighted_id()
        return self.conversation.id

    # ------------------------------------------------------------------ sending
    @on(PromptInput.Submitted)
    async def _submitted(self, event: PromptInput.Submitted) -> None:
        await self.send(event.text)

    async def send(self, text: str) -> bool:
        """Send a prompt: show it, and ask the engine for a reply. False if nothing was sent.

        While a message is being edited, the prompt replaces that message: it and every later
        turn are dropped (no branch is kept) once the new reply is recorded."""
        prompt = text.strip()
        if not prompt or not self._can_start():
            return False
        try:
            request = self.conversation.send_request(prompt, self.adaspark.model_label)
        except AdaSparkError as err:
            self.notify(str(err), title="Store", severity="error")
            return False
        self._stop_editing(restore=False)
        self.prompt.clear()
        return await self._start(request)

    async def regenerate(self) -> bool:
        """A new reply to the last user message, with a new seed; the turns before it are kept
        (the KV cache holds them: only the reply is new). False if nothing was started."""
        if not self._can_start():
            return False
        self._stop_editing(restore=True)
        try:
            request = self.conversation.regenerate_request()
        except Refusal as why:
            self.notify(str(why), severity="warning")
            return False
        if self.conversation.settings.sampling.greedy:
            self.notify("Temperature is 0 (greedy): the same reply comes back. Raise it in the "
                              "settings (F3) for a different one.", severity="warning")
        return await self._start(request)

    def _can_start(self) -> bool:
        if self.generating:
            self.notify(BUSY, severity="warning")
            return False
        if self.adaspark.load_error is not None:
            self.notify(f"The model failed to load: {self.adaspark.load_error}", severity="error")
            return False
        return True

    async def _start(self, request: ReplyRequest) -> bool:
        """Show the request's turns and ask the engine for its reply (once they are painted)."""
        hidden = self.chat_view.turns()[request.keep:]
        user_msg, reply_msg = await self.chat_view.show_request(None if request.regenerate else request.prompt,
                                                                request.prompt, hidden)
        # No await from here on until the request is sent: the engine's answer is handled by
        # the app's message loop, which must find this reply's state in place.
        self._pending = Pending(user_msg, reply_msg, reply_msg.start_stream(self.stats, self.panel), hidden)
        self._request = request
        self.round_log = []
        self.cancel_requested_at = None
        self.stats.start_reply()
        self.stats.generating = True
        self.generating = True
        # A blink is a repaint, taken from the decode: none while the reply streams.
        self._cursor_blink, self.prompt.cursor_blink = self.prompt.cursor_blink, False
        self.set_status()
        self.panel.show()
        if request.created_conversation:
            self.refresh_conversations()
        # The engine is asked once the new messages are laid out and painted. That frame (a
        # layout of the chat column and a full repaint, 30-50 ms) would otherwise run beside the
        # reply's first rounds on a two-core machine and be taken from them: a 256-token second
        # turn decodes in under a second here, so it cost it several percent.
        self.call_after_refresh(self._send_request, request)
        return True

    async def _send_request(self, request: ReplyRequest, waits: int = 0) -> None:
        """Send `request` to the engine (after the first paint of its messages, see _start)."""
        if self._request is not request or request.sent:
            return  # withdrawn meanwhile (the engine died, or the screen moved on)
        if request.stop_before_send:
            await self.reply_stopped_early(request.request_id)  # unsent: its id is still 0
            return
        pending = self._pending
        if waits < SEND_WAIT_REFRESHES and ((pending is not None and not laid_out(pending.reply_msg))
                                            or not screen_settled(self)):
            # the refresh came before the reply's widgets were laid out (a busy machine), or the
            # view's scroll to its end is still to be painted: one more
            self.call_after_refresh(self._send_request, request, waits + 1)
            return
        freeze_for_reply()  # no full collection of the UI's objects beside the decode (ui/collector.py)
        try:
            request.request_id = self.adaspark.engine.generate(request.conversation_id, request.messages,
                                                               request.max_tokens, request.turn,
                                                               sampling=request.sampling)
            request.sent = True
        except RuntimeError as err:
            self._pending = None
            if pending is not None:
                await self._withdraw(request, pending)
            self.notify(f"{err}; your message is back in the box.", severity="error")
            self._end_generation()

    def stop_reply(self) -> bool:
        """Ask the running reply to stop (it ends after the current round). False if none runs."""
        if not self.generating:
            return False
        request = self._request
        if request is not None and not request.sent:
            request.stop_before_send = True  # _send_request gives the prompt back instead
        else:
            self.adaspark.engine.cancel()
        # Stamped once the engine can see the stop (the flag is set): a UI thread kept waiting
        # between the key and the flag must not count as rounds the engine ran past the stop.
        if self.cancel_requested_at is None:
            self.cancel_requested_at = time.monotonic()
        self.set_status("Stopping…")
        return True

    def _is_current(self, request_id: int) -> bool:
        return self._request is not None and self._request.request_id == request_id

    # ------------------------------------------------------------------ the engine answers
    async def reply_rounds(self, message: "EngineRounds") -> None:
        """A batch of rounds from the engine process: figures now, text in the reply's next frame."""
        if not self._is_current(message.request_id) or self._pending is None:
            return  # a reply abandoned after an engine restart
        self.round_log.extend(zip(message.times, message.events))
        await self._pending.stream.receive(message.times, message.events, message.gauges)

    async def reply_done(self, message: "EngineDone") -> None:
        """The reply ended (complete, at the token cap, or stopped by the user)."""
        if not self._is_current(message.request_id):
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
                self.notify("Stopped before the first token; " + request.given_back())
                return
            shown = pending.stream.text
            if result.text.startswith(shown) and len(result.text) > len(shown):
                await pending.reply_msg.write(result.text[len(shown):])  # bytes the decoder held to the end
            # Record first (history, store), then finish the display: nothing is lost if the
            # app is closed while the last fragments render.
            meta = reply_meta(result, self.adaspark.model_label, self.stats.shown_rate, self.stats.lag_max)
            self._record(request, result.text, meta)
            self.conversation.context_used = result.prompt_length + result.n_tokens
            self.adaspark.settings_changed()  # the header's context figure
            await self._drop_replaced(pending)
            await pending.reply_msg.finish(reply_note(meta))
            await self.chat_view.mark_context(pending.reply_msg, result.dropped_turns, result.capped_to)
            self.refresh_conversations()
            if result.stopped:
                self.notify(f"Stopped: kept {result.n_tokens} tokens.")
        finally:
            self._end_generation()

    async def _give_back(self, request_id: int, error: str | None = None) -> None:
        """The reply `request_id` will not come (`reply_stopped_early`, `reply_failed`)."""
        if not self._is_current(request_id):
            return
        request, pending, self._pending = self._request, self._pending, None
        assert request is not None
        try:
            if pending is not None:
                pending.stream.stop()
                await self._withdraw(request, pending)
            if error is not None:
                self.notify(f"{error}\n" + request.given_back().capitalize(), title="Reply failed",
                            severity="error", timeout=10)
            elif pending is not None:
                self.notify("Stopped before the first token; " + request.given_back())
        finally:
            self._end_generation()

    async def reply_stopped_early(self, request_id: int) -> None:
        """Esc before the engine had started the reply (it was still loading, or the request was
        not sent yet: _send_request)."""
        await self._give_back(request_id)

    async def reply_failed(self, request_id: int, error: str) -> None:
        """The engine raised: the prompt goes back in the box, the conversation is kept."""
        await self._give_back(request_id, error)

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
            last = self.round_log[-1][1] if self.round_log else None
            meta = cut_reply_meta(self.adaspark.model_label, stream.received_tokens, last,
                                  self.stats.reply_rate, request.sampling)
            self._record(request, text, meta)
            await self._drop_replaced(pending)
            await pending.reply_msg.write(rest)
            await pending.reply_msg.finish(reply_note(meta))
            self.refresh_conversations()
            return f"Kept the {stream.received_tokens} tokens generated so far. "
        finally:
            self._end_generation()

    # ------------------------------------------------------------------ the reply's end
    def _record(self, request: ReplyRequest, text: str, meta: dict[str, Any]) -> None:
        try:
            self.conversation.record(request, text, meta)
        except AdaSparkError as err:
            self.notify(f"The reply was not saved: {err}", title="Store", severity="error")

    async def _drop_replaced(self, pending: Pending) -> None:
        """Remove the messages of the turns a recorded reply replaced."""
        for widget in pending.hidden:
            await widget.remove()
        pending.hidden = []

    async def _withdraw(self, request: ReplyRequest, pending: Pending) -> None:
        """Undo a send: remove its messages, show the turns it would have replaced again, restore
        the prompt (an edit goes back to editing its message), drop a conversation made for it."""
        await self.chat_view.withdraw(pending.user_msg, pending.reply_msg, pending.hidden)
        pending.hidden = []
        if not request.regenerate:
            if request.edit_index is not None and request.edit_index < len(self.conversation.turns) \
                    and not self.prompt.text.strip():
                self._begin_editing(request.edit_index, text=request.prompt)
            else:
                self.prompt.restore(request.prompt)
        self.prompt.focus()
        if self.conversation.drop_created(request):
            self.refresh_conversations()

    def _end_generation(self) -> None:
        if self._request is not None:
            self.adaspark.engine.reply_ended(self._request.request_id)
        self._request = None
        self.generating = False
        self.stats.generating = False
        self.prompt.cursor_blink = self._cursor_blink
        self.panel.show()
        self.set_status()
        self.adaspark.reply_ended()
        self.set_timer(THAW_DELAY_S, self._thaw_collector)

    def _thaw_collector(self) -> None:
        """The full collection held back while the reply streamed, once none streams (after the
        reply's last paint: THAW_DELAY_S)."""
        if not self.generating:
            thaw_after_reply()
    # ------------------------------------------------------------------ editing an earlier message
    def _begin_editing(self, index: int, text: str | None = None) -> None:
        """Select the user message at history `index` for editing: its text (or `text`) goes in the box."""
        conv = self.conversation
        conv.begin_edit(index, self.prompt.text)
        self.chat_view.mark_editing(index)
        self.prompt.show_editing(conv.turns[index].content if text is None else text, *conv.edit_labels(index))
        self.prompt.focus()
        self.set_status("Editing an earlier message: Enter resends it and replaces what followed it.")

    def _stop_editing(self, restore: bool) -> None:
        """Leave editing; `restore` puts back what the box held before it began."""
        if self.conversation.editing is None:
            return
        self.chat_view.mark_editing(None)
        draft = self.conversation.end_edit()
        self.prompt.end_editing(draft if restore else None)
        self.set_status()

    def action_edit_previous(self) -> None:
        """Start editing the last user message, or move to the one before the one being edited."""
        if self._refused_while_generating():
            return
        index = self.conversation.edit_target(later=False)
        if index is not None:
            self._begin_editing(index)
        elif self.conversation.editing is None:
            self.notify("No message of yours to edit yet.", severity="warning")
        else:
            self.notify("This is your first message.")

    def action_edit_next(self) -> None:
        """While editing, move to the next user message; past the last one, stop editing."""
        if self.conversation.editing is None:
            return
        index = self.conversation.edit_target(later=True)
        if index is not None:
            self._begin_editing(index)
        else:
            self._stop_editing(restore=True)

    # ------------------------------------------------------------------ actions
    def action_stop_reply(self) -> None:
        if self.stop_reply():
            return
        if self.conversation.editing is not None:
            self._stop_editing(restore=True)
        self.prompt.focus()

    async def action_regenerate(self) -> None:
        await self.regenerate()

    def action_settings(self) -> None:
        """The settings dialog for the open conversation (or the next new one)."""
        where = "this conversation" if self.conversation.id else "the new conversation"
        self.app.push_screen(SettingsScreen(self.conversation.settings, where), self.apply_settings)

    def apply_settings(self, settings: ChatSettings | None) -> None:
        """Use `settings` for the open conversation from its next reply on, and store them."""
        if settings is None:
            return
        try:
            self.conversation.save_settings(settings)
        except AdaSparkError as err:
            self.notify(f"The settings were not saved: {err}", title="Store", severity="error")
            return
        self.adaspark.settings_changed()
        when = " from the next reply on" if self.generating else ""
        self.notify(f"Settings saved{when}: {settings.label()}.", title="Settings")

    def action_copy_code(self) -> None:
        code = code_at(self, *self.app.mouse_position)
        which = "the code block under the pointer"
        if code is None:
            blocks = self.conversation.code_blocks()
            if not blocks:
                self.notify("No code block in this conversation.", severity="warning")
                return
            code, which = blocks[-1], "the last code block"
        code = code.rstrip("\n")  # no final line break: pasted into a shell, it would run at once
        self.app.copy_to_clipboard(code)
        lines = code.count("\n") + 1
        self.notify(f"Copied {which} ({lines} line{'s' if lines != 1 else ''}).")

    def action_save_reply(self) -> None:
        """Save the last reply as a Markdown file (a dialog asks where)."""
        reply = self.conversation.last_reply
        if not reply:
            self.notify("No reply to save yet.", severity="warning")
            return
        text = reply if reply.endswith("\n") else reply + "\n"
        title = (self.sidebar.title_of(self.conversation.id) if self.conversation.id else None) or "reply"

        def done(path: Path | None) -> None:
            if path is not None:
                self.notify(f"Saved the reply to {path}", title="Save reply")

        dialog = SaveFileScreen("Save the last reply as Markdown", reply_file_name(title),
                                lambda path: path.write_text(text, encoding="utf-8"),
                                base=self.adaspark.export_dir)
        self.app.push_screen(dialog, done)

    async def action_new_chat(self) -> None:
        await self.new_conversation()

    def action_rename_chat(self) -> None:
        cid = self._target_conversation()
        if cid is None:
            self.notify("No conversation to rename yet.", severity="warning")
            return

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

        self.app.push_screen(RenameScreen(self.sidebar.title_of(cid) or ""), done)

    def action_delete_chat(self) -> None:
        cid = self._target_conversation()
        if cid is None:
            self.notify("No conversation to delete.", severity="warning")
            return
        if cid == self.conversation.id and self.generating:
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
            if cid == self.conversation.id:
                await self.new_conversation()
            else:
                self.refresh_conversations()
            self.notify(f"Deleted “{title}”.")

        self.app.push_screen(ConfirmScreen(f"Delete “{title}”? This cannot be undone."), done)

    def action_search_chats(self) -> None:
        self.sidebar.display = True
        self.sidebar.query_one("#search").focus()

    def action_export_chat(self) -> None:
        self.export_markdown()

    def export_markdown(self) -> Path | None:
        """Write the open conversation to a Markdown file; notify and return its path."""
        conv = self.conversation
        if conv.id is None or not conv.turns:
            self.notify("Nothing to export yet.", severity="warning")
            return None
        try:
            rows = conv.markdown_rows()
        except AdaSparkError as err:
            self.notify(str(err), title="Store", severity="error")
            return None
        title = self.sidebar.title_of(conv.id) or title_from(conv.turns[0].content)
        try:
            path = write_export(self.adaspark.export_dir, title, rows, self.adaspark.model_label)
        except OSError as err:
            self.notify(f"Could not write the export: {err}", severity="error")
            return None
        self.notify(f"Exported to {path}", title="Export")
        return path

    def action_copy_reply(self) -> None:
        reply = self.conversation.last_reply
        if not reply:
            self.notify("No reply to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(reply)
        self.notify(f"Copied the last reply ({len(reply)} characters).")

    def action_toggle_sidebar(self) -> None:
        self.sidebar.display = not self.sidebar.display

    def action_toggle_panel(self) -> None:
        self.panel.display = not self.panel.display

    def action_focus_prompt(self) -> None:
        self.prompt.focus()

    def on_unmount(self) -> None:
        if self.generating:
            self.adaspark.engine.cancel()


def same_model(a: str | None, b: str | None) -> bool:
    """Whether two model paths (None: the bundled model) name the same file."""
    if a == b:
        return True
    try:
        from ...engine.backend import default_model_path

        a, b = (default_model_path() if x is None else x for x in (a, b))
    except AdaSparkError:  # no bundled model: None names nothing else
        return False
    return os.path.realpath(a) == os.path.realpath(b)
