"""The chat screen: conversations sidebar, messages, prompt, and the live speculation panel.

The screen composes the widgets, binds the keys to its actions and routes messages; the work is
done by the parts it holds:

- `Conversation` (ui/conversation.py, no Textual): the turns, settings and edit state, the
  requests a reply is asked with, and the store writes of a conversation;
- `ReplyRunner` (screens/replies.py): the reply in flight, from its send to its end;
- `ChatView` / `ChatMessage` (widgets/chat_view.py): the messages on screen; a streaming reply's
  message owns its `ReplyStream` (widgets/reply_stream.py), which paces frames to a CPU budget;
  the sidebar lists the store's conversations;
- the app, seen as a `ChatHost` (ui/host.py): the store, the engine client, the model. It passes
  the engine client's messages on to this screen; this screen posts `Ready`, `ReplyEnded` and
  `EngineDeathHandled` to it.

Threading: everything here runs on the UI thread; the engine lives in another process
(`engine_client.py`).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Header, Static, TextArea

from ...errors import AdaSparkError
from ...store import title_from
from ...wording import counted
from ..chat_settings import ChatSettings
from ..compositor import install as install_cropped_compositor
from ..conversation import Conversation
from ..cut_replies import settle_cut_replies, settled_notice
from ..drafts import SAVE_INTERVAL_S, DraftKeeper
from ..engine_client import (EngineDied, EngineDone, EngineLoaded, EngineLoadFailed, EnginePrefill, EngineReadAhead,
                             EngineReadingAhead, EngineReplyFailed, EngineRounds, EngineStopped)
from ..export import reply_file_name, write_export
from ..host import ChatHost, EngineStateChanged
from ..stats import SpecStats, gauges_from
from ..widgets import ChatView, ConversationSidebar, KeyFooter, PromptInput, SpecPanel
from ..widgets.chat_view import WARM_LANGUAGES, code_at, warm_up
from .dialogs import ConfirmScreen, RenameScreen, SaveFileScreen
from .replies import BUSY, ReplyRunner
from .settings import SettingsScreen


#: The fewest columns the conversation keeps: on a narrower terminal the sidebar, then the panel,
#: start hidden.
CHAT_MIN_COLUMNS = 50
#: The message box's text is read ahead by the engine this long after it changes, and so every this
#: long while typing goes on (a paste is one change): each reading is of the few tokens typed since
#: the last, and the reply then reads only what was typed in its last half second.
TYPING_PAUSE_S = 0.5


def fits_beside(width: int, *panes: int) -> bool:
    """Whether panes of these widths (columns) fit together beside a conversation of
    CHAT_MIN_COLUMNS on a screen `width` columns wide."""
    return width >= sum(panes) + CHAT_MIN_COLUMNS


def fitting_panels(width: int, sidebar: int, panel: int) -> tuple[bool, bool]:
    """(sidebar, panel): which of the two, `sidebar` and `panel` columns wide, fit beside a
    conversation of CHAT_MIN_COLUMNS on a screen `width` columns wide; the panel (what speculation
    is doing) before the sidebar (Ctrl+B shows it)."""
    show_panel = fits_beside(width, panel)
    return show_panel and fits_beside(width, sidebar, panel), show_panel


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

    class Ready(Message):
        """The screen is up: the app starts the engine process (the window shows meanwhile)."""

    class ReplyEnded(Message):
        """A reply has ended, recorded or given back (a quit waiting for it goes on)."""

    class EngineDeathHandled(Message):
        """The screen has kept (or given back) the reply the engine process's death cut short;
        `kept` says what became of it ('' when none ran), for the app's notice of the death."""

        def __init__(self, died: EngineDied, kept: str) -> None:
            super().__init__()
            self.died = died
            self.kept = kept

    def __init__(self, host: ChatHost) -> None:
        super().__init__()
        install_cropped_compositor(self)  # a frame renders only the widgets it changed (compositor.py)
        self.host = host
        self.stats = SpecStats()
        self.conversation = Conversation(host.store, host.default_settings())
        self.replies: ReplyRunner  # made with the widgets it shows replies in (compose)
        self._warm = list(WARM_LANGUAGES)  # highlighters still to build (see _warm_next)
        self._fitted: tuple[bool, bool] | None = None  # what fitting_panels last decided (see _fit)
        self._made_room: Widget | None = None  # the pane a key showed by hiding the other (_show_pane)
        self.drafts = DraftKeeper(host.store)  # the message box's text per conversation (ui/drafts.py)
        self._draft_timer: Timer | None = None  # the draft's next save (see _prompt_changed)
        self.history_read: EngineReadAhead | None = None  # the engine's last word on reading a history ahead
        self._reading_shown = False  # the status line counts a history being read ahead
        self._typing_timer: Timer | None = None  # the draft's reading, once typing pauses (_prompt_changed)
        self._draft_asked: tuple[str | None, str] | None = None  # (conversation, draft) last asked to be read

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        view, prompt, panel = ChatView(id="chat"), PromptInput(id="prompt"), SpecPanel(self.stats, id="panel")
        self.replies = ReplyRunner(self, self.host, self.conversation, view, prompt, panel, self.stats)
        yield Header(icon="◆")
        with Horizontal(id="main"):
            yield ConversationSidebar(id="sidebar")
            with Vertical(id="chat-column"):
                yield view
                yield Static("", id="status", markup=False)  # quotes paths and errors: text, not markup
                yield prompt
            yield panel
        yield KeyFooter()

    async def on_mount(self) -> None:
        self._fit(self.app.size.width)
        self.sidebar.store = self.host.store
        self._settle_cut_replies()
        self.refresh_conversations()
        self.prompt.focus()
        self.set_status()
        self.post_message(self.Ready())
        self.set_timer(0.2, self._warm_next)
        self._show_draft()  # a new conversation's first: opening another keeps it as it is
        if self.host.resume_id:
            await self.open_conversation(self.host.resume_id)
        self.show_settings()

    def _settle_cut_replies(self) -> None:
        """Keep what a chat killed mid-reply left in the store (`settle_cut_replies`), and say so."""
        try:
            settled = settle_cut_replies(self.host.store)
        except AdaSparkError as err:
            self.notify(f"A reply cut short by the end of a chat could not be kept: {err}", title="Store",
                        severity="error", timeout=10)
            return
        if settled:
            self.notify(settled_notice(settled), timeout=10)

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
    def generating(self) -> bool:
        """Whether a reply is in flight (asked for and not yet ended)."""
        return self.replies.generating

    @property
    def chat_view(self) -> ChatView:
        return self.query_one(ChatView)

    @property
    def prompt(self) -> PromptInput:
        return self.replies.prompt  # also once unmounted (on_unmount saves its draft)

    @property
    def panel(self) -> SpecPanel:
        return self.query_one(SpecPanel)

    @property
    def sidebar(self) -> ConversationSidebar:
        return self.query_one(ConversationSidebar)

    def set_status(self, text: str | None = None) -> None:
        if text is None:
            host = self.host
            if host.load_error is not None:
                text = "The model failed to load." if host.engine.loads == 0 else "The engine is not running."
            elif not host.engine.ready:
                text = "Loading the model… you can type already."
            elif self.generating:
                text = "Generating… Esc stops and keeps the text so far."
            else:
                text = "Ready."
        self.query_one("#status", Static).update(text, layout=False)

    def show_settings(self) -> None:
        """The header follows the open conversation's settings and context."""
        self.host.show_settings(self.conversation.settings, self.conversation.context_used)

    def _refused_while_generating(self) -> bool:
        if self.generating:
            self.notify(BUSY, severity="warning")
        return self.generating

    # ------------------------------------------------------------------ the engine's messages
    def on_engine_loaded(self, message: EngineLoaded) -> None:
        """The engine process has loaded its engine (the app has read its names already)."""
        gauges = gauges_from(message.gauges)
        if gauges is not None and not self.generating:
            self.stats.set_gauges(gauges)
        self.stats.device = message.device
        self.panel.show()
        self.set_status()
        self.read_history_ahead()  # a new engine's cache is empty: the open conversation's history first

    def on_engine_state_changed(self, _: EngineStateChanged) -> None:
        self.set_status()

    async def on_engine_load_failed(self, _: EngineLoadFailed) -> None:
        """The engine did not load (the app has said why): a reply that waited for it is given back."""
        await self.replies.load_failed()
        self.set_status()

    def on_engine_prefill(self, message: EnginePrefill) -> None:
        self.replies.prefill(message)

    def on_engine_reading_ahead(self, message: EngineReadingAhead) -> None:
        """A long history being read ahead: counted on the status line while nothing else is said there."""
        if message.conversation_id == self.conversation.id and self._status_free():
            self._reading_shown = True
            what = "your message" if self._draft_asked and self._draft_asked[1] else "history"
            self.set_status(f"Reading {what} ahead: {message.done:,}/{message.total:,} tokens…")

    def on_engine_read_ahead(self, message: EngineReadAhead) -> None:
        self.history_read = message
        if self._reading_shown:
            self._reading_shown = False
            if self._status_free():
                self.set_status()

    def _status_free(self) -> bool:
        """Whether the status line may count a history's reading (no reply, no edit to explain)."""
        return not self.generating and self.conversation.editing is None and self.host.load_error is None

    def read_history_ahead(self) -> None:
        """Have the engine read the open conversation's history into its cache while the next
        message is typed, and the message box's text as far as it is typed (a pasted text, say), so
        the reply reads only the rest (`ChatEngine.read_ahead`). Asked on opening a conversation,
        on a settings change, when an engine loads, after each reply and every TYPING_PAUSE_S while
        the box changes; never while a reply runs. While an earlier message is edited, the turns
        before it and the edit, once it differs from the message (the resend's prompt; a look at a
        message left unchanged keeps the cache as it is)."""
        conv = self.conversation
        if self.generating or not self.host.read_ahead or self.host.quitting:
            return
        draft, turns = self._box_draft(), conv.history
        if conv.editing is not None and conv.editing < len(turns):
            if draft == turns[conv.editing]["content"]:
                return
            turns = turns[:conv.editing]
        if not turns and not draft:
            return
        self._draft_asked = (conv.id, draft)
        self.host.engine.read_ahead(conv.id, conv.settings.messages(turns), conv.settings.max_tokens, draft)

    async def on_engine_rounds(self, message: EngineRounds) -> None:
        await self.replies.rounds(message)

    async def on_engine_done(self, message: EngineDone) -> None:
        await self.replies.done(message)

    async def on_engine_stopped(self, message: EngineStopped) -> None:
        await self.replies.give_back(message.request_id)

    async def on_engine_reply_failed(self, message: EngineReplyFailed) -> None:
        await self.replies.give_back(message.request_id, message.error)

    async def on_engine_died(self, message: EngineDied) -> None:
        self.post_message(self.EngineDeathHandled(message, await self.replies.engine_died()))

    # ------------------------------------------------------------------ conversations
    def refresh_conversations(self) -> None:
        self.sidebar.reload(self.conversation.id)

    @on(ConversationSidebar.Selected)
    async def _conversation_selected(self, event: ConversationSidebar.Selected) -> None:
        await self.open_conversation(event.conversation_id)

    async def open_conversation(self, conversation_id: str) -> None:
        """Show a stored conversation, and its draft in the message box; the next reply sends its
        whole history to the engine, which rebuilds its KV prefix when that history is not what
        it has cached."""
        if self._refused_while_generating():
            return
        conv = self.conversation
        try:
            stored = conv.read(conversation_id)
        except AdaSparkError as err:
            self.notify(str(err), title="Store", severity="error")
            return
        self.save_draft()
        self.stop_editing(restore=True)
        problems = conv.show(conversation_id, stored, self.host.default_settings())
        await self.chat_view.show_turns(conv.turns)
        if problems:
            self.notify("This conversation's stored settings were partly unusable; the defaults apply "
                        "instead: " + "; ".join(problems), title="Settings", severity="warning", timeout=10)
        if stored.row and stored.row.get("settings"):
            await self.host.follow_model(conv.settings)
        self.show_settings()
        self.chat_view.scroll_end(animate=False)
        self.refresh_conversations()
        self._show_draft()
        self.prompt.focus()
        self.read_history_ahead()

    async def new_conversation(self) -> None:
        if self._refused_while_generating():
            return
        self.save_draft()
        self.stop_editing(restore=True)
        self.conversation.reset(self.host.default_settings())
        self.show_settings()
        await self.chat_view.clear()
        self.refresh_conversations()
        self._show_draft()
        self.prompt.focus()

    # ------------------------------------------------------------------ the message box's draft
    def _show_draft(self) -> None:
        """The open conversation's draft in the message box (what it held when last left)."""
        self.prompt.text = self.drafts.load(self.conversation.id)
        self.prompt.move_cursor(self.prompt.document.end)

    def save_draft(self) -> None:
        """Keep what the message box holds as the open conversation's draft (while a message is
        edited: what it held before, which the edit gives back)."""
        if self._draft_timer is not None:
            self._draft_timer.stop()
            self._draft_timer = None
        conv = self.conversation
        self.drafts.save(conv.id, conv.draft if conv.editing is not None else self.prompt.text)

    @on(TextArea.Changed, "#prompt")
    def _prompt_changed(self, _: TextArea.Changed) -> None:
        """Typed, cleared or given back: saved within SAVE_INTERVAL_S (a kill loses no more), and
        read ahead by the engine TYPING_PAUSE_S after it changed (and so on while typing goes on)."""
        if self._draft_timer is None:
            timer = self._draft_timer = self.set_timer(SAVE_INTERVAL_S, lambda: self._draft_due(timer))
        if self._typing_timer is None:  # not restarted by each key: read every TYPING_PAUSE_S while typing
            self._typing_timer = self.set_timer(TYPING_PAUSE_S, self._typing_read_due)

    def _typing_read_due(self) -> None:
        self._typing_timer = None
        if (self.conversation.id, self._box_draft()) != self._draft_asked:
            self.read_history_ahead()

    def _box_draft(self) -> str:
        """The message box's text as the next message's start ('' where it is only white space)."""
        return self.prompt.text if self.prompt.text.strip() else ""

    def _draft_due(self, timer: Timer) -> None:
        if timer is not self._draft_timer:  # stopped once it had fired: whoever stopped it saved the
            return  # draft then (a switch of conversation; this call may come in the middle of it)
        self._draft_timer = None
        self.save_draft()

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
        """Send a prompt (`ReplyRunner.send`); False if nothing was sent. The draft it was goes
        (also a new conversation's, which sending stored under an id of its own)."""
        before = self.conversation.id
        sent = await self.replies.send(text)
        if sent:
            if before != self.conversation.id:
                self.drafts.save(before, "")
            self.save_draft()
        return sent

    def stop_reply(self) -> bool:
        """Ask the running reply to stop (it ends after the current round). False if none runs."""
        return self.replies.stop()

    def reply_ended(self) -> None:
        """The reply in flight has ended (`ReplyRunner`): the app hears of it, and the engine reads
        the history as the next prompt will hold it (the turn's end and the next one's start, and
        the reply as its text tokenises) while the next message is typed."""
        self.post_message(self.ReplyEnded())
        self.read_history_ahead()

    # ------------------------------------------------------------------ editing an earlier message
    def begin_editing(self, index: int, text: str | None = None) -> None:
        """Select the user message at history `index` for editing: its text (or `text`) goes in the box."""
        conv = self.conversation
        conv.begin_edit(index, self.prompt.text)
        self.chat_view.mark_editing(index)
        self.prompt.show_editing(conv.turns[index].content if text is None else text, *conv.edit_labels(index))
        self.prompt.focus()
        self.set_status("Editing an earlier message: Enter resends it and replaces what followed it.")

    def stop_editing(self, restore: bool) -> None:
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
            self.begin_editing(index)
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
            self.begin_editing(index)
        else:
            self.stop_editing(restore=True)

    # ------------------------------------------------------------------ actions
    def action_stop_reply(self) -> None:
        if self.stop_reply():
            return
        if self.conversation.editing is not None:
            self.stop_editing(restore=True)
        self.prompt.focus()

    async def action_regenerate(self) -> None:
        await self.replies.regenerate()

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
        self.show_settings()
        self.read_history_ahead()  # a new system prompt changes the history's tokens
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
        self.notify(f"Copied {which} ({counted(lines, 'line')}).")

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
                                lambda path: path.write_text(text, encoding="utf-8"), base=self.host.export_dir)
        self.app.push_screen(dialog, done)

    async def action_new_chat(self) -> None:
        await self.new_conversation()

    def action_rename_chat(self) -> None:
        cid = self._target_conversation()
        if cid is None:
            self.notify("No conversation to rename yet.", severity="warning")
            return
        self.app.push_screen(RenameScreen(self.sidebar.title_of(cid) or ""), partial(self.sidebar.rename, cid))

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
                self.host.store.delete_conversation(cid)
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
        self._show_pane(self.sidebar, True)
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
            path = write_export(self.host.export_dir, title, rows, self.host.model_label)
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

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width)
        self.show_settings()  # the header's form follows the width (AdaSparkApp._update_subtitle)

    def _fit(self, width: int) -> None:
        """Show the sidebar and the panel where they fit (fitting_panels). Only when the answer
        changes: Ctrl+B and Ctrl+G hold until the terminal crosses a width where it does (at 80
        columns the two took all but 2 of the conversation's)."""
        fitted = fitting_panels(width, self.sidebar.styles.width.cells, self.panel.styles.width.cells)
        if fitted != self._fitted:
            self._fitted = fitted
            self._made_room = None
            self.sidebar.display, self.panel.display = fitted

    def _show_pane(self, pane: Widget, show: bool) -> None:
        """Ctrl+B or Ctrl+G (or a search) showing or hiding `pane` (the sidebar or the panel). A
        pane shown where the other does not fit beside it and CHAT_MIN_COLUMNS of conversation
        hides the other (at 100 columns the two left the conversation 18), and gives it back when
        hidden again where that still fits."""
        other = self.panel if pane is self.sidebar else self.sidebar
        width = self.size.width
        if show and not pane.display and other.display:
            if not fits_beside(width, self.sidebar.styles.width.cells, self.panel.styles.width.cells):
                other.display = False
                self._made_room = pane
        elif not show and pane.display and self._made_room is pane:
            self._made_room = None
            if fits_beside(width, other.styles.width.cells):
                other.display = True
        pane.display = show

    def action_toggle_sidebar(self) -> None:
        self._show_pane(self.sidebar, not self.sidebar.display)

    def action_toggle_panel(self) -> None:
        self._show_pane(self.panel, not self.panel.display)

    def action_focus_prompt(self) -> None:
        self.prompt.focus()

    def on_unmount(self) -> None:
        self.save_draft()
        self.host.unsaved_drafts = self.drafts.unsaved()
        if self.generating:
            self.host.engine.cancel()
