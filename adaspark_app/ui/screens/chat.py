"""The chat screen: conversations sidebar, messages, prompt, and the live speculation panel.

Threading: everything here runs on the UI thread. The engine lives in another process
(`engine_client.py`); its rounds arrive as messages the app hands to `reply_rounds`,
`reply_done`, `reply_failed` and `engine_died`. Every store call for chats is made here.

Rendering a growing reply is kept cheap, because on a small machine every cycle the UI spends
is taken from the decode (issue 17): the reply's message owns a `ReplyStream`
(widgets/reply_stream.py) that appends the text of the rounds in frames paced to a CPU budget,
and the prompt's cursor does not blink while a reply streams (each blink is a repaint).
benchmarks/ui_cpu.py measures it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from markdown_it import MarkdownIt
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ...engine.events import ReplyResult, RoundEvent
from ...engine.sampling import SamplingSettings
from ...errors import AdaSparkError
from ..chat_settings import DEFAULT_MAX_TOKENS, ChatSettings
from ..collector import freeze_for_reply, thaw_after_reply
from ..compositor import install as install_cropped_compositor
from ..export import conversation_markdown, export_path, slug
from ..stats import EngineGauges, SpecStats, gauges_from
from ..widgets import ChatMessage, ChatView, ConversationSidebar, PromptInput, SpecPanel
from ..widgets.chat_view import WARM_LANGUAGES, warm_up
from ..widgets.reply_stream import ReplyStream
from .dialogs import ConfirmScreen, RenameScreen, SaveFileScreen
from .settings import SettingsScreen

if TYPE_CHECKING:
    from ..app import AdaSparkApp
    from ..engine_client import EngineDone, EngineRounds

MAX_TOKENS = DEFAULT_MAX_TOKENS  # per reply; the engine stops earlier at the end-of-generation token
THAW_DELAY_S = 0.3  # after a reply ends, the held-back garbage collection (ui/collector.py)
SEND_WAIT_REFRESHES = 5  # refreshes a request may wait for its messages to be laid out and painted


def _laid_out(msg: "ChatMessage") -> bool:
    """Whether a reply's message and its streaming tail have a size on screen."""
    return bool(msg.region.height) and bool(msg.tail_widget.size.height)


def _screen_settled(screen: Any) -> bool:
    """Whether `screen` has no layout, scroll or repaint left to do.

    Why: the chat view scrolls to its end after the refresh that laid the new messages out, and
    that scroll is one more layout and a repaint of the whole view (30-60 ms here). Sent before
    it, the request's first rounds shared the two cores with it. Textual keeps these flags
    private; a version without them reads as settled (the request then goes at once, as before).
    """
    return not (getattr(screen, "_layout_required", False) or getattr(screen, "_scroll_required", False)
                or getattr(screen, "_repaint_required", False) or getattr(screen, "_dirty_widgets", None))


def title_from(text: str) -> str:
    from ...store import title_from as store_title_from

    return store_title_from(text)


@dataclass
class ReplyRequest:
    """One reply in flight; built on the UI thread."""

    conversation_id: str
    messages: list[dict[str, str]]  # what the engine is sent: system prompt, kept turns, the new user message
    prompt: str
    turn: int
    created_conversation: bool  # the conversation was created for this prompt
    max_tokens: int = MAX_TOKENS
    request_id: int = 0  # the engine client's number for it
    base: list[dict[str, str]] = field(default_factory=list)  # the turns kept before this one
    regenerate: bool = False  # a new reply to the last user message (no new user message)
    replace_from: int | None = None  # store id of the first message this reply replaces
    hidden: list[ChatMessage] = field(default_factory=list)  # the replaced turns' widgets, hidden meanwhile
    edit_index: int | None = None  # the history index of the edited user message
    sampling: SamplingSettings | None = None  # the settings (and seed, if fixed) of this reply
    sent: bool = False  # asked of the engine (after the first paint of its messages: _send_request)
    stop_before_send: bool = False  # Esc came before the request was sent


@dataclass
class Shown:
    """What the screen knows of one turn of `ChatScreen.history`: its store id, widget and meta."""

    id: int | None
    widget: ChatMessage
    meta: dict[str, Any] | None = None


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

    def __init__(self) -> None:
        super().__init__()
        install_cropped_compositor(self)  # a frame renders only the widgets it changed (compositor.py)
        self.stats = SpecStats()
        self.conversation_id: str | None = None
        self.history: list[dict[str, str]] = []
        self.last_reply: str = ""
        self._shown: list[Shown] = []  # parallel to `history`
        self.settings: ChatSettings = ChatSettings()  # the open conversation's (set on mount)
        # tokens of the context the last reply's prompt and text took (the header shows it
        # against n_ctx); None: not known (a conversation stored before it was recorded)
        self.context_used: int | None = 0
        self.editing: int | None = None  # the history index of the user message being edited
        self._draft = ""  # the message box's text before editing began
        self._prompt_titles: tuple[str, str] | None = None  # the box's titles before editing began
        self.generating = False
        self._request: ReplyRequest | None = None
        # (user, assistant) in flight; the assistant message streams the reply (its `stream`)
        self._pending: tuple[ChatMessage | None, ChatMessage] | None = None
        self._cursor_blink = True  # the prompt's cursor blinks, except while a reply streams
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

    DEFAULT_CSS = """
    ChatView > ChatMessage.editing { background: $warning 15%; border-left: thick $warning; }
    """

    async def on_mount(self) -> None:
        self.settings = self.adaspark.default_settings()
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
        self._stop_editing(restore=True)
        # The turns only: the system prompt is the conversation's setting, sent first by
        # ChatSettings.messages.
        history: list[dict[str, str]] = []
        shown: list[Shown] = []
        view = self.chat_view
        await view.clear()
        for m in rows:
            if m["role"] not in ("system", "user", "assistant"):
                continue
            history.append({"role": m["role"], "content": m["content"]})
            meta = m.get("meta") if isinstance(m.get("meta"), dict) else None
            widget = await view.add_message(m["role"], m["content"],
                                            note=reply_note(meta) if m["role"] == "assistant" else "")
            if meta and (meta.get("dropped_turns") or meta.get("capped_to")):
                dropped, capped = meta.get("dropped_turns"), meta.get("capped_to")
                await view.mark_context(widget, dropped if isinstance(dropped, int) else 0,
                                        capped if isinstance(capped, int) else None)
            shown.append(Shown(m["id"], widget, meta))
        self.conversation_id = conversation_id
        self.history = history
        self._shown = shown
        self.last_reply = next((m["content"] for m in reversed(history) if m["role"] == "assistant"), "")
        self.context_used = context_used_from(rows)
        self.settings, problems = ChatSettings.from_stored(conv, self.adaspark.default_settings())
        if problems:
            self.notify("This conversation's stored settings were partly unusable; the defaults apply "
                        "instead: " + "; ".join(problems), title="Settings", severity="warning", timeout=10)
        loaded = getattr(self.adaspark, "model_path", None)
        if conv and conv.get("settings") and not same_model(self.settings.model_path, loaded):
            await self._follow_model(self.settings)
        self.adaspark.settings_changed()
        view.scroll_end(animate=False)
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
        if self.generating:
            self.notify("A reply is being generated; Esc stops it.", severity="warning")
            return
        self._stop_editing(restore=True)
        self.conversation_id = None
        self.history = []
        self._shown = []
        self.last_reply = ""
        self.context_used = 0
        self.settings = self.adaspark.default_settings()
        self.adaspark.settings_changed()
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
        """Send a prompt: show it, and ask the engine for a reply. False if nothing was sent.

        While a message is being edited (`editing`), the prompt replaces that message: it and
        every later turn are dropped (no branch is kept) once the new reply is recorded."""
        prompt = text.strip()
        if not prompt:
            return False
        if not self._can_start():
            return False
        app = self.adaspark
        created = False
        if self.conversation_id is None:
            try:
                self.conversation_id = app.store.create_conversation(
                    title_from(prompt), app.model_label, system=self.settings.system,
                    settings=self.settings.to_json())
            except AdaSparkError as err:
                self.notify(str(err), title="Store", severity="error")
                return False
            created = True
        keep, edit_index = len(self.history), None
        if self.editing is not None and self.editing < len(self.history):
            keep = edit_index = self.editing
        base = self.history[:keep]
        messages = self.settings.messages([*base, {"role": "user", "content": prompt}])
        request = ReplyRequest(self.conversation_id, messages, prompt,
                               turn=sum(1 for m in messages if m["role"] == "user") - 1,
                               created_conversation=created, max_tokens=self.settings.max_tokens,
                               base=base, replace_from=self._first_id(keep), edit_index=edit_index,
                               hidden=[t.widget for t in self._shown[keep:]],
                               sampling=self.settings.reply_sampling())
        self._stop_editing(restore=False)
        self.prompt.clear()
        return await self._start(request)

    def _can_start(self) -> bool:
        if self.generating:
            self.notify("A reply is being generated; Esc stops it.", severity="warning")
            return False
        app = self.adaspark
        if app.load_error is not None:
            self.notify(f"The model failed to load: {app.load_error}", severity="error")
            return False
        return True

    def _first_id(self, index: int) -> int | None:
        """The store id of the first of the turns from `index` on that has one (None: none has)."""
        ids = [t.id for t in self._shown[index:] if t.id is not None]
        return min(ids) if ids else None

    async def _start(self, request: ReplyRequest) -> bool:
        """Show the request's turns and ask the engine for its reply."""
        app = self.adaspark
        view = self.chat_view
        view.following = True
        for widget in request.hidden:
            widget.display = False  # removed once the new reply is recorded, shown again if it fails
        user_msg = None if request.regenerate else await view.add_message("user", request.prompt)
        reply_msg = await view.add_message("assistant", "")
        reply_msg.set_note("…")  # until the reply ends: hiding it would move the view
        reply_msg.make_room(request.prompt)  # laid out with the new messages, before the first token
        # No await from here on until the request is sent: the engine's answer is handled by the
        # app's message loop, which must find this reply's state in place.
        reply_msg.start_stream(self.stats, self.panel)
        self._pending = (user_msg, reply_msg)
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
        if waits < SEND_WAIT_REFRESHES and ((pending is not None and not _laid_out(pending[1]))
                                            or not _screen_settled(self)):
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
                await self._withdraw(request, *pending)
            self.notify(f"{err}; your message is back in the box.", severity="error")
            self._end_generation()

    async def regenerate(self) -> bool:
        """A new reply to the last user message, with a new seed; the turns before it are kept
        (the KV cache holds them: only the reply is new). False if nothing was started."""
        if not self._can_start():
            return False
        if self.conversation_id is None or not self.history:
            self.notify("No reply to regenerate yet.", severity="warning")
            return False
        self._stop_editing(restore=True)
        n = len(self.history)
        previous_seed = None
        if self.history[-1]["role"] == "assistant":
            keep = n - 1
            meta = self._shown[-1].meta or {}
            seed = meta.get("seed")  # a stored value: an imported store may hold anything there
            previous_seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
        else:
            keep = n  # a user message with no reply (e.g. an imported conversation): answer it
        if keep == 0 or self.history[keep - 1]["role"] != "user":
            self.notify("The last reply does not follow a message of yours; nothing to regenerate.",
                        severity="warning")
            return False
        if self.settings.sampling.greedy:
            self.notify("Temperature is 0 (greedy): the same reply comes back. Raise it in the "
                        "settings (F3) for a different one.", severity="warning")
        base = self.history[:keep]
        messages = self.settings.messages(base)
        request = ReplyRequest(self.conversation_id, messages, base[-1]["content"],
                               turn=sum(1 for m in messages if m["role"] == "user") - 1,
                               created_conversation=False, max_tokens=self.settings.max_tokens,
                               base=base, regenerate=True, replace_from=self._first_id(keep),
                               hidden=[t.widget for t in self._shown[keep:]],
                               sampling=self.settings.regenerate_sampling(previous_seed))
        return await self._start(request)

    def _is_current(self, request_id: int) -> bool:
        return self._request is not None and self._request.request_id == request_id

    # ------------------------------------------------------------------ the reply streams in
    async def reply_rounds(self, message: "EngineRounds") -> None:
        """A batch of rounds from the engine process: figures now, text in the reply's next frame."""
        stream = self._stream()
        if not self._is_current(message.request_id) or stream is None:
            return  # a reply abandoned after an engine restart
        self.round_log.extend(zip(message.times, message.events))
        await stream.receive(message.times, message.events, message.gauges)

    def _stream(self) -> ReplyStream | None:
        """The stream of the reply in flight (None: none is)."""
        return self._pending[1].stream if self._pending is not None else None

    async def reply_done(self, message: "EngineDone") -> None:
        """The reply ended (complete, at the token cap, or stopped by the user)."""
        if not self._is_current(message.request_id):
            return
        result, request, stream = message.result, self._request, self._stream()
        assert request is not None
        if stream is not None:
            await stream.flush()
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
                self.notify("Stopped before the first token; " + _given_back(request))
                return
            shown = reply_msg.stream.text if reply_msg.stream is not None else ""
            if result.text.startswith(shown) and len(result.text) > len(shown):
                await reply_msg.write(result.text[len(shown):])  # bytes the decoder held to the end
            # Record first (history, store), then finish the display: nothing is lost if the
            # app is closed while the last fragments render.
            meta = reply_meta(result, self.adaspark.model_label, self.stats.shown_rate, self.stats.lag_max)
            self._record(request, result.text, meta, user_msg, reply_msg)
            self.context_used = result.prompt_length + result.n_tokens
            self.adaspark.settings_changed()  # the header's context figure
            await self._drop_replaced(request)
            await reply_msg.finish(reply_note(meta))
            await self.chat_view.mark_context(reply_msg, result.dropped_turns, result.capped_to)
            self.refresh_conversations()
            if result.stopped:
                self.notify(f"Stopped: kept {result.n_tokens} tokens.")
        finally:
            self._end_generation()

    def _record(self, request: ReplyRequest, text: str, meta: dict[str, Any],
                user_msg: ChatMessage | None, reply_msg: ChatMessage) -> None:
        """The turn joins the history and the store; the turns it replaces (a regenerated reply,
        an edited message and what followed it) leave both, in the same store transaction."""
        new: list[tuple[str, str, dict[str, Any] | None]] = []
        if not request.regenerate:
            new.append(("user", request.prompt, None))
        new.append(("assistant", text, meta))
        keep = len(request.base)
        self.history = [*request.base, *({"role": r, "content": c} for r, c, _ in new)]
        self.last_reply = text
        ids: list[int | None] = [None] * len(new)
        try:
            ids = list(self.adaspark.store.replace_messages_from(request.conversation_id, request.replace_from, new))
        except AdaSparkError as err:
            self.notify(f"The reply was not saved: {err}", title="Store", severity="error")
        widgets = [w for w in (user_msg, reply_msg) if w is not None]
        self._shown = [*self._shown[:keep], *(Shown(i, w, m) for i, w, (_, _, m) in zip(ids, widgets, new))]

    async def _drop_replaced(self, request: ReplyRequest) -> None:
        """Remove the widgets of the turns a recorded reply replaced."""
        for widget in request.hidden:
            await widget.remove()
        request.hidden = []

    async def reply_stopped_early(self, request_id: int) -> None:
        """Esc before the engine had started the reply (it was still loading, or the request was
        not sent yet: _send_request)."""
        if not self._is_current(request_id):
            return
        request, pending, self._pending = self._request, self._pending, None
        try:
            if pending is not None and request is not None:
                await self._withdraw(request, *pending)
                self.notify("Stopped before the first token; " + _given_back(request))
        finally:
            self._end_generation()

    async def reply_failed(self, request_id: int, error: str) -> None:
        """The engine raised: the prompt goes back in the box, the conversation is kept."""
        if not self._is_current(request_id):
            return
        stream = self._stream()
        if stream is not None:
            stream.stop()
        request, pending, self._pending = self._request, self._pending, None
        try:
            if pending is not None and request is not None:
                await self._withdraw(request, *pending)
            self.notify(f"{error}\n" + _given_back(request).capitalize(), title="Reply failed",
                        severity="error", timeout=10)
        finally:
            self._end_generation()

    async def engine_died(self) -> str:
        """The engine process ended mid-reply or idle. A reply in progress keeps the text that
        had arrived (saved as a stopped reply), or gives the prompt back if none had. Returns a
        sentence for the app's notification."""
        request, pending, stream = self._request, self._pending, self._stream()
        if request is None or pending is None or stream is None:
            return ""
        stream.stop()
        self._pending = None
        text = stream.text
        user_msg, reply_msg = pending
        try:
            if not text.strip():
                await self._withdraw(request, user_msg, reply_msg)
                return _given_back(request).capitalize() + " "
            rest = stream.take_unshown()
            last = self.round_log[-1][1] if self.round_log else None
            meta = {"model": self.adaspark.model_label, "n_tokens": stream.received_tokens,
                    "decode_s": round(last.reply_seconds, 4) if last else 0.0,
                    "tokens_per_s": round(self.stats.reply_rate or 0.0, 2), "stopped": True,
                    "engine_died": True}
            # the seed the engine drew with (each round reports it), for a later regenerate
            seed = last.seed if last is not None and last.seed is not None else None
            if seed is None and request.sampling is not None and not request.sampling.greedy:
                seed = request.sampling.seed
            if seed is not None:
                meta["seed"] = seed
            self._record(request, text, meta, user_msg, reply_msg)
            await self._drop_replaced(request)
            await reply_msg.write(rest)
            await reply_msg.finish(reply_note(meta))
            self.refresh_conversations()
            return f"Kept the {stream.received_tokens} tokens generated so far. "
        finally:
            self._end_generation()

    async def _withdraw(self, request: ReplyRequest, user_msg: ChatMessage | None, reply_msg: ChatMessage) -> None:
        """Undo a send: remove its messages, show the turns it would have replaced again, restore
        the prompt (an edit goes back to editing its message), drop a conversation made for it."""
        if user_msg is not None:
            await user_msg.remove()
        await reply_msg.remove()
        for widget in request.hidden:
            widget.display = True
        request.hidden = []
        if not request.regenerate:
            if request.edit_index is not None and request.edit_index < len(self.history) \
                    and not self.prompt.text.strip():
                self._begin_editing(request.edit_index, text=request.prompt)
            else:
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

    # ------------------------------------------------------------------ editing an earlier message
    def _user_indices(self) -> list[int]:
        return [i for i, m in enumerate(self.history) if m["role"] == "user"]

    def _begin_editing(self, index: int, text: str | None = None) -> None:
        """Select the user message at history `index` for editing: its text goes in the box."""
        if self.editing is None:
            self._draft = self.prompt.text
            self._prompt_titles = (str(self.prompt.border_title or ""), str(self.prompt.border_subtitle or ""))
        elif 0 <= self.editing < len(self._shown):
            self._shown[self.editing].widget.remove_class("editing")
        self.editing = index
        widget = self._shown[index].widget
        widget.add_class("editing")
        widget.scroll_visible(animate=False)
        later = len(self.history) - index - 1
        self.prompt.text = self.history[index]["content"] if text is None else text
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.border_title = (f"Editing message {self._user_indices().index(index) + 1} of "
                                    f"{len(self._user_indices())}")
        self.prompt.border_subtitle = (f"Enter resends, dropping the {later} later message"
                                       f"{'s' if later != 1 else ''} · Ctrl+Up/Down other message · Esc cancels"
                                       if later else "Enter resends · Ctrl+Up earlier message · Esc cancels")
        self.prompt.focus()
        self.set_status("Editing an earlier message: Enter resends it and replaces what followed it.")

    def _stop_editing(self, restore: bool) -> None:
        """Leave editing; `restore` puts back what the box held before it began."""
        if self.editing is None:
            return
        if 0 <= self.editing < len(self._shown):
            self._shown[self.editing].widget.remove_class("editing")
        self.editing = None
        if restore:
            self.prompt.text = self._draft
            self.prompt.move_cursor(self.prompt.document.end)
        self._draft = ""
        if self._prompt_titles is not None:
            self.prompt.border_title, self.prompt.border_subtitle = self._prompt_titles
            self._prompt_titles = None
        self.set_status()

    def action_edit_previous(self) -> None:
        """Start editing the last user message, or move to the one before the one being edited."""
        if self.generating:
            self.notify("A reply is being generated; Esc stops it.", severity="warning")
            return
        users = self._user_indices()
        if not users:
            self.notify("No message of yours to edit yet.", severity="warning")
            return
        if self.editing is None:
            self._begin_editing(users[-1])
            return
        earlier = [i for i in users if i < self.editing]
        if not earlier:
            self.notify("This is your first message.")
            return
        self._begin_editing(earlier[-1])

    def action_edit_next(self) -> None:
        """While editing, move to the next user message; past the last one, stop editing."""
        if self.editing is None:
            return
        later = [i for i in self._user_indices() if i > self.editing]
        if later:
            self._begin_editing(later[0])
        else:
            self._stop_editing(restore=True)

    # ------------------------------------------------------------------ actions
    def action_stop_reply(self) -> None:
        if self.stop_reply():
            return
        if self.editing is not None:
            self._stop_editing(restore=True)
        self.prompt.focus()

    async def action_regenerate(self) -> None:
        await self.regenerate()

    def action_settings(self) -> None:
        """The settings dialog for the open conversation (or the next new one)."""
        where = "this conversation" if self.conversation_id else "the new conversation"
        self.app.push_screen(SettingsScreen(self.settings, where), self.apply_settings)

    def apply_settings(self, settings: ChatSettings | None) -> None:
        """Use `settings` for the open conversation from its next reply on, and store them."""
        if settings is None:
            return
        if self.conversation_id is not None:
            try:
                self.adaspark.store.set_conversation_settings(self.conversation_id, settings.system,
                                                              settings.to_json())
            except AdaSparkError as err:
                self.notify(f"The settings were not saved: {err}", title="Store", severity="error")
                return
        self.settings = settings
        self.adaspark.settings_changed()
        when = " from the next reply on" if self.generating else ""
        self.notify(f"Settings saved{when}: {settings.label()}.", title="Settings")

    def code_blocks(self) -> list[str]:
        """Every fenced code block of the conversation's messages, in order."""
        parser = MarkdownIt("gfm-like")
        out: list[str] = []
        for m in self.history:
            out += [t.content for t in parser.parse(m["content"]) if t.type == "fence" and t.content.strip()]
        return out

    def _code_under_pointer(self) -> str | None:
        """The code of the fenced block under the mouse pointer, if there is one."""
        from textual.widgets.markdown import MarkdownFence

        try:
            widget, _ = self.get_widget_at(*self.app.mouse_position)
        except Exception:  # the pointer is off the screen or over nothing
            return None
        node: Any = widget
        while node is not None and not isinstance(node, MarkdownFence):
            node = node.parent
        return node.code if node is not None and node.code.strip() else None

    def action_copy_code(self) -> None:
        code = self._code_under_pointer()
        which = "the code block under the pointer"
        if code is None:
            blocks = self.code_blocks()
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
        if not self.last_reply:
            self.notify("No reply to save yet.", severity="warning")
            return
        text = self.last_reply if self.last_reply.endswith("\n") else self.last_reply + "\n"
        app = self.adaspark
        title = (self.sidebar.title_of(self.conversation_id) if self.conversation_id else None) or "reply"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        default = Path(f"reply-{slug(title)}-{stamp}.md")

        def write(path: Path) -> None:
            path.write_text(text, encoding="utf-8")

        def done(path: Path | None) -> None:
            if path is not None:
                self.notify(f"Saved the reply to {path}", title="Save reply")

        app.push_screen(SaveFileScreen("Save the last reply as Markdown", default, write, base=app.export_dir), done)

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
        if self.settings.system:  # what the replies followed: part of the conversation
            rows = [{"role": "system", "content": self.settings.system}, *rows]
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


def _given_back(request: ReplyRequest) -> str:
    """The end of a notice that a reply did not happen."""
    if request.regenerate:
        return "the previous reply is kept."
    return "your message is back in the box."


def reply_meta(result: ReplyResult, model: str, shown_rate: float | None = None,
               shown_lag_s: float | None = None) -> dict[str, Any]:
    """What is stored with an assistant message (and shown under it).

    `tokens_per_s` is the engine's n_tokens / decode_s, measured in the engine process exactly
    as `adaspark run` measures it; `shown_tokens_per_s` is the speed the display delivered, and
    `shown_lag_ms` the longest any of its text waited to be drawn.
    """
    meta = {
        "model": model, "arm": result.arm, "n_tokens": result.n_tokens, "decode_s": round(result.decode_s, 4),
        "tokens_per_s": round(result.tokens_per_s, 2), "rounds": result.rounds,
        "widths": {str(k): v for k, v in sorted(result.widths.items())}, "stopped": result.stopped,
        "looped": result.looped,
    }
    if shown_rate is not None:
        meta["shown_tokens_per_s"] = round(shown_rate, 2)
    if shown_lag_s is not None:
        meta["shown_lag_ms"] = round(shown_lag_s * 1e3, 1)
    # What the reply was drawn with (a regenerate needs the seed to pick a new one) and how much
    # of the prompt was prefilled (the rest came from the KV cache).
    if result.sampling:
        meta["sampling"] = {k: v for k, v in result.sampling.items() if k != "seed"}
    if result.seed is not None:
        meta["seed"] = result.seed
    meta["prompt_tokens"] = result.prompt_tokens
    meta["prompt_length"] = result.prompt_length  # the whole prompt: with n_tokens, the context used
    if result.dropped_turns:  # the marker above the reply, shown again when the chat is reopened
        meta["dropped_turns"] = result.dropped_turns
    if result.capped_to is not None:
        meta["capped_to"] = result.capped_to
    return meta


def same_model(a: str | None, b: str | None) -> bool:
    """Whether two model paths (None: the bundled model) name the same file."""
    import os

    if a == b:
        return True
    try:
        from ...engine.backend import default_model_path

        a, b = (default_model_path() if x is None else x for x in (a, b))
    except AdaSparkError:  # no bundled model: None names nothing else
        return False
    return os.path.realpath(a) == os.path.realpath(b)


def context_used_from(rows: list[dict[str, Any]]) -> int | None:
    """The context tokens a stored conversation's last reply took (its prompt and its text), from
    that reply's meta; 0 with no reply, None when the meta does not tell (stored before)."""
    for m in reversed(rows):
        if m.get("role") != "assistant":
            continue
        meta = m.get("meta") if isinstance(m.get("meta"), dict) else {}
        length, n = meta.get("prompt_length"), meta.get("n_tokens")
        if isinstance(length, int) and isinstance(n, int):
            return length + n
        return None
    return 0


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
