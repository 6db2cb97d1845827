"""The chat screen: conversations sidebar, messages, prompt, and the live speculation panel.

Threading: `_run_reply` (with the batcher timer it may start) is the only code here that runs
off the UI thread. It calls the engine, and reaches the UI solely by posting the messages nested
in this class (`post_message` is thread-safe). Everything else, including every store call for
chats, runs on the UI thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Static
from textual.worker import Worker, get_current_worker

from ...engine.events import ReplyResult, RoundEvent
from ...errors import AdaSparkError
from ..export import conversation_markdown, export_path
from ..stats import EngineGauges, SpecStats
from ..streaming import EngineHolder, StreamBatcher
from ..widgets import ChatMessage, ChatView, ConversationSidebar, PromptInput, SpecPanel
from .dialogs import ConfirmScreen, RenameScreen

if TYPE_CHECKING:
    from ..app import AdaSparkApp

MAX_TOKENS = 512  # per reply; the engine stops earlier at the end-of-generation token


def title_from(text: str) -> str:
    from ...store import title_from as store_title_from

    return store_title_from(text)


def read_gauges(engine: Any, context: int) -> EngineGauges:
    """The engine's learned figures at `context`. Call on the engine's thread only."""
    gauges = EngineGauges(context=context)
    gauges.plain_rate = engine.plain_rate(context)
    gauges.cold_start = tuple(engine.cold_start_progress())  # type: ignore[assignment]
    gauges.prices_ms = {int(w): s * 1e3 for w, s in engine.price_table(context).items()}
    return gauges


@dataclass
class ReplyRequest:
    """What one reply worker needs; built on the UI thread, read-only in the worker."""

    conversation_id: str
    messages: list[dict[str, str]]  # history + the new user message
    prompt: str
    turn: int
    created_conversation: bool  # the conversation was created for this prompt
    max_tokens: int = MAX_TOKENS


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

    class ReplyChunk(Message):
        """A batch of rounds from the worker: released text, the rounds, the engine's gauges."""

        def __init__(self, text: str, events: list[RoundEvent], gauges: EngineGauges | None) -> None:
            super().__init__()
            self.text = text
            self.events = events
            self.gauges = gauges

    class ReplyFinished(Message):
        """The reply ended (complete, at the token cap, or stopped by the user)."""

        def __init__(self, request: ReplyRequest, result: ReplyResult, gauges: EngineGauges | None) -> None:
            super().__init__()
            self.request = request
            self.result = result
            self.gauges = gauges

    class ReplyFailed(Message):
        """The engine raised; `error` is the one-line message for the user."""

        def __init__(self, request: ReplyRequest, error: str) -> None:
            super().__init__()
            self.request = request
            self.error = error

    def __init__(self) -> None:
        super().__init__()
        self.stats = SpecStats()
        self.conversation_id: str | None = None
        self.history: list[dict[str, str]] = []
        self.last_reply: str = ""
        self.generating = False
        self._cancel: threading.Event | None = None
        self._pending: tuple[ChatMessage, ChatMessage] | None = None  # (user, assistant) in flight

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
            if app.holder.error is not None:
                text = "The model failed to load."
            elif not app.holder.ready:
                text = "Loading the model… you can type already."
            elif self.generating:
                text = "Generating… Esc stops and keeps the text so far."
            else:
                text = "Ready."
        self.query_one("#status", Static).update(text, layout=False)

    def engine_ready(self, gauges: EngineGauges | None) -> None:
        """Called by the app on the UI thread once the engine has loaded."""
        if gauges is not None and not self.generating:
            self.stats.set_gauges(gauges)
        self.panel.show()
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
        """Send a prompt: show it, and start a reply worker. False if nothing was sent."""
        prompt = text.strip()
        if not prompt:
            return False
        if self.generating:
            self.notify("A reply is being generated; Esc stops it.", severity="warning")
            return False
        app = self.adaspark
        if app.holder.error is not None:
            self.notify(f"The model failed to load: {app.holder.error}", severity="error")
            return False
        created = False
        if self.conversation_id is None:
            try:
                self.conversation_id = app.store.create_conversation(title_from(prompt), app.model_label)
            except AdaSparkError as err:
                self.notify(str(err), title="Store", severity="error")
                return False
            created = True
        self.prompt.clear()
        view = self.chat_view
        view.following = True
        user_msg = await view.add_message("user", prompt)
        reply_msg = await view.add_message("assistant", "")
        reply_msg.set_note("…")
        self._pending = (user_msg, reply_msg)
        self.stats.start_reply()
        self.stats.generating = True
        self.generating = True
        self._cancel = threading.Event()
        messages = [*self.history, {"role": "user", "content": prompt}]
        request = ReplyRequest(self.conversation_id, messages, prompt,
                               turn=sum(1 for m in messages if m["role"] == "user") - 1,
                               created_conversation=created, max_tokens=app.max_tokens)
        self.set_status()
        self.panel.show()
        if created:
            self.refresh_conversations()
        self._run_reply(request, self._cancel, app.holder)
        return True

    @work(thread=True, exclusive=True, group="reply", name="reply", exit_on_error=False)
    def _run_reply(self, request: ReplyRequest, cancel: threading.Event, holder: EngineHolder) -> None:
        """Thread boundary: runs in a worker thread. Blocks in the engine; touches no widget.

        Text and rounds go to the UI in batches (StreamBatcher, ~40 ms); the worker's own
        cancellation and the Esc event both stop the engine between rounds.
        """
        worker = get_current_worker()
        engine_thread = threading.current_thread()
        engine = None

        def gauges_now(context: int) -> EngineGauges | None:
            try:
                return read_gauges(engine, context)
            except Exception:  # a gauge the engine cannot give yet must not end the reply
                return None

        def emit(text: str, events: list[RoundEvent]) -> None:
            # The batcher's timer may flush from its own thread: only the engine's thread reads
            # the engine's learners, so a timer batch carries no gauges (the next one will).
            on_engine_thread = threading.current_thread() is engine_thread
            context = events[-1].context if events else 0
            self.post_message(self.ReplyChunk(text, events, gauges_now(context) if on_engine_thread else None))

        batcher = StreamBatcher(emit)

        def on_round(event: RoundEvent) -> None:
            batcher.add(event)
            if worker.is_cancelled:
                cancel.set()

        try:
            engine = holder.wait(cancel)
            if engine is None:  # stopped while the model was still loading
                raise AdaSparkError("stopped before the model had loaded")
            with holder.busy:
                if holder.closed:
                    raise AdaSparkError("the engine has been closed")
                result = engine.generate(request.conversation_id, request.messages, max_tokens=request.max_tokens,
                                         on_round=on_round, cancel=cancel, turn=request.turn)
                batcher.flush()
                gauges = gauges_now(result.context)
        except AdaSparkError as err:
            batcher.discard()
            self.post_message(self.ReplyFailed(request, str(err)))
            return
        except Exception as err:  # an engine bug: still give the prompt back and say what happened
            batcher.discard()
            self.post_message(self.ReplyFailed(request, f"{type(err).__name__}: {err}"))
            return
        self.post_message(self.ReplyFinished(request, result, gauges))

    @on(ReplyChunk)
    async def _reply_chunk(self, message: ReplyChunk) -> None:
        for event in message.events:
            self.stats.add(event)
        if message.gauges is not None:
            self.stats.set_gauges(message.gauges)
        self.panel.show_soon()
        if self._pending is not None and message.text:
            reply_msg = self._pending[1]
            if reply_msg.text == "":
                reply_msg.set_note("")
            await reply_msg.write(message.text)

    @on(ReplyFinished)
    async def _reply_finished(self, message: ReplyFinished) -> None:
        result, request = message.result, message.request
        if message.gauges is not None:
            self.stats.set_gauges(message.gauges)
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
            # Record first (history, store), then finish the display: nothing is lost if the
            # app is closed while the last fragments render.
            meta = reply_meta(result, self.adaspark.model_label)
            self.history = [*request.messages, {"role": "assistant", "content": result.text}]
            self.last_reply = result.text
            try:
                store = self.adaspark.store
                store.add_message(request.conversation_id, "user", request.prompt)
                store.add_message(request.conversation_id, "assistant", result.text, meta=meta)
            except AdaSparkError as err:
                self.notify(f"The reply was not saved: {err}", title="Store", severity="error")
            await reply_msg.finish(reply_note(meta))
            self.refresh_conversations()
            if result.stopped:
                self.notify(f"Stopped: kept {result.n_tokens} tokens.")
        finally:
            self._end_generation()

    @on(ReplyFailed)
    async def _reply_failed(self, message: ReplyFailed) -> None:
        pending, self._pending = self._pending, None
        try:
            if pending is not None:
                await self._withdraw(message.request, *pending)
            self.notify(f"{message.error}\nYour message is back in the box.", title="Reply failed",
                        severity="error", timeout=10)
        finally:
            self._end_generation()

    async def _withdraw(self, request: ReplyRequest, user_msg: ChatMessage, reply_msg: ChatMessage) -> None:
        """Undo a send: remove its messages, restore the prompt, drop a conversation made for it."""
        await user_msg.remove()
        await reply_msg.remove()
        self.prompt.restore(request.prompt)
        self.prompt.focus()
        if request.created_conversation and not self.history:
            try:
                self.adaspark.store.delete_conversation(request.conversation_id)
            except AdaSparkError:
                pass
            if self.conversation_id == request.conversation_id:
                self.conversation_id = None
            self.refresh_conversations()

    def _end_generation(self) -> None:
        self.generating = False
        self.stats.generating = False
        self._cancel = None
        self.panel.show()
        self.set_status()
        self.adaspark.reply_ended()

    def stop_reply(self) -> bool:
        """Ask the running reply to stop (it ends after the current round). False if none runs."""
        if not self.generating or self._cancel is None:
            return False
        self._cancel.set()
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

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # A worker that died outside the engine call (should not happen) must not leave the
        # screen stuck in "generating".
        if event.worker.group == "reply" and event.worker.state.name == "ERROR" and self.generating:
            self._end_generation()
            self.notify(f"Reply worker failed: {event.worker.error}", severity="error")

    def on_unmount(self) -> None:
        if self._cancel is not None:
            self._cancel.set()


def reply_meta(result: ReplyResult, model: str) -> dict[str, Any]:
    """What is stored with an assistant message (and shown under it)."""
    return {
        "model": model, "arm": result.arm, "n_tokens": result.n_tokens, "decode_s": round(result.decode_s, 4),
        "tokens_per_s": round(result.tokens_per_s, 2), "rounds": result.rounds,
        "widths": {str(k): v for k, v in sorted(result.widths.items())}, "stopped": result.stopped,
        "looped": result.looped,
    }


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
    if meta.get("stopped"):
        parts.append("stopped")
    elif meta.get("looped"):
        parts.append("token cap reached")
    return " · ".join(parts)
