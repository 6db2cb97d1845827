"""`adaspark chat`: the Textual app and its entry point.

The engine runs in its own process (`engine_client.EngineClient`, `engine/worker.py`), started
when the chat screen mounts: the window appears at once, and a prompt typed while the model
loads waits in the command pipe. If the engine process dies, the app says so, keeps the
conversation and the text so far, and starts a new engine.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from ..engine.sampling import GREEDY
from ..errors import AdaSparkError
from ..models import BUNDLED_NAME
from .chat_settings import ChatSettings
from .conversation import MAX_TOKENS
from .engine_client import (EngineClient, EngineDied, EngineDone, EngineLoaded, EngineLoadFailed,
                            EngineReplyFailed, EngineRounds, EngineStopped, lower_ui_priority)
from .screens import ChatScreen, HelpScreen
from .stats import gauges_from
from .widgets.sidebar import ConversationList

QUIT_GRACE_S = 5.0  # how long Ctrl+Q waits for a running reply to stop and be saved
MAX_RESTARTS = 3  # engine deaths in a row (no reply completed between them) before giving up

# Keys handled inside widgets rather than by bindings, listed so the help screen shows them.
PROMPT_KEYS = [
    Binding("enter", "send", "Send", id="send", tooltip="Send the message"),
    Binding("ctrl+j,shift+enter", "newline", "New line", id="newline",
            tooltip="Insert a new line in the message (Shift+Enter where the terminal reports it)"),
]


class AdaSparkApp(App[int]):
    """Terminal chat with a local model, decoded speculatively and scheduled by AdaSpark."""

    CSS_PATH = "app.tcss"
    TITLE = "AdaSpark"
    BINDINGS = [
        Binding("f1", "help", "Help", id="help", tooltip="Show every key and action"),
        Binding("question_mark", "help", "Help", show=False, id="help_question_mark",
                tooltip="Show every key and action (when not typing)"),
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True, tooltip="Quit AdaSpark"),
        Binding("ctrl+t", "pick_model", "Model", id="pick_model", show=False,
                tooltip="Choose a model (those `adaspark models` lists): a new conversation starts on it"),
    ]

    def __init__(self, engine_factory: Callable[[], Any], store: Any, model_label: str = BUNDLED_NAME,
                 drafter_label: str | None = None, store_label: str = "", *, export_dir: Path | None = None,
                 max_tokens: int = MAX_TOKENS, exit_on_load_error: bool = True,
                 engine_log: str | None = None, sampling: Any = None, system: str | None = None,
                 model_path: str | None = None, resume_id: str | None = None,
                 sampling_given: dict[str, Any] | None = None) -> None:
        """`engine_factory` builds the engine inside the engine process, so it must be picklable
        (an `EngineConfig`, or a module-level callable): it crosses a "spawn" process start.

        max_tokens, sampling and system are the settings a new conversation starts with (each
        conversation then keeps its own: `Conversation.settings`); resume_id opens that stored
        conversation at start (`chat --continue`). sampling_given: the sampling values the user
        set (options, config file); with it, a model switch gives new conversations the new
        model's recommended settings (its GGUF's general.sampling.*) under those values."""
        super().__init__()
        self.engine = EngineClient(engine_factory, self.post_message, log_path=engine_log)
        self.engine_factory = engine_factory  # what the engine process is built from (the picker swaps it)
        self.switching_to: str | None = None  # the model the picker asked for, until it has loaded
        self.deaths_in_a_row = 0
        self.store = store
        self.model_label = model_label
        self.drafter_label = drafter_label
        self.store_label = store_label
        self.export_dir = export_dir or Path.cwd()
        self.max_tokens = max_tokens
        self.sampling = sampling  # SamplingSettings of a new conversation (None: greedy)
        self.sampling_given = sampling_given
        self.n_ctx: int | None = None  # the context the engine opened (EngineLoaded tells it)
        self.system = system  # system prompt of a new conversation (None: none)
        self.model_path = model_path  # the GGUF the engine loads (None: the bundled model)
        self.resume_id = resume_id
        self.exit_on_load_error = exit_on_load_error
        self.load_error: str | None = None
        self._load_started = False
        self._quitting = False
        self._update_subtitle()

    # ------------------------------------------------------------------ screens
    def get_default_screen(self) -> Screen:
        return ChatScreen()

    @property
    def chat_screen(self) -> ChatScreen:
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                return screen
        raise LookupError("the chat screen is not mounted")

    def default_settings(self) -> ChatSettings:
        """The settings a new conversation starts with (from the options, see run_chat)."""
        return ChatSettings(system=self.system, max_tokens=self.max_tokens, sampling=self.sampling or GREEDY,
                            model=self.model_label, model_path=self.model_path)

    def settings_changed(self) -> None:
        """The open conversation's settings changed (opened, edited, new): the header follows."""
        self._update_subtitle()

    def _update_subtitle(self) -> None:
        drafter = self.drafter_label or "none (n-gram drafts)"
        try:
            settings = self.chat_screen.conversation.settings
        except Exception:  # before the chat screen exists: what a new conversation gets
            settings = self.default_settings()
        self.sub_title = (f"model {self.model_label} · {self._context_label()}{settings.label()} · "
                          f"drafter {drafter} · store {self.store_label}")

    def _context_label(self) -> str:
        """'context 312 of 8192 tok · ': what the open conversation takes of the engine's
        context ('context 8192 tok · ' where that is not known)."""
        if not self.n_ctx:
            return ""
        try:
            used = self.chat_screen.conversation.context_used
        except (LookupError, AttributeError):  # AttributeError: the screen has not mounted yet
            used = 0
        return f"context {self.n_ctx} tok · " if used is None else f"context {used} of {self.n_ctx} tok · "

    def start_engine_load(self) -> None:
        """Start the engine process (once); the chat screen calls it when it has mounted."""
        if not self._load_started:
            self._load_started = True
            self.engine.start()

    # ------------------------------------------------------------------ the engine
    # Messages from the engine process arrive here (posted by the io thread) and the reply ones
    # go on to the chat screen; every handler runs on the UI thread.
    @on(EngineLoaded)
    def _engine_loaded(self, message: EngineLoaded) -> None:
        if message.model_name:
            self.model_label = message.model_name
        if message.drafter_name:
            self.drafter_label = message.drafter_name
        if message.n_ctx:
            self.n_ctx = message.n_ctx
        self._update_subtitle()
        if self.switching_to is not None:
            self.switching_to = None
            then = ("a new conversation starts on it" if getattr(self, "_new_conversation_on_load", True)
                    else "this conversation goes on with it")
            self.notify(f"{self.model_label}: {then}.", title="Model loaded")
        elif message.restarted:
            self.notify("The engine is running again.", title="Engine")
        for note in message.notices:
            self.notify(note, title="Engine", severity="warning", timeout=10)
        try:
            self.chat_screen.engine_ready(gauges_from(message.gauges))
        except LookupError:
            pass

    @on(EngineLoadFailed)
    def _engine_failed(self, message: EngineLoadFailed) -> None:
        self.load_error = message.error
        self.switching_to = None  # a picked model that fails: said below; Ctrl+T picks another
        if self.exit_on_load_error and not message.restarted:
            self.exit(2, return_code=2, message=f"adaspark: error: {message.error}")  # as the CLI says it
            return
        self.notify(message.error, title="The model failed to load", severity="error", timeout=30)
        try:
            self.chat_screen.engine_unavailable()
        except LookupError:
            pass

    @on(EngineDied)
    async def _engine_died(self, message: EngineDied) -> None:
        self.deaths_in_a_row += 1
        how = f"exit code {message.exitcode}" if message.exitcode is not None else "no exit code"
        if message.exitcode is not None and message.exitcode < 0:
            how = f"signal {-message.exitcode}"
        try:
            kept = await self.chat_screen.engine_died()
        except LookupError:
            kept = ""
        if self.deaths_in_a_row > MAX_RESTARTS:
            self.load_error = f"the engine process stopped {self.deaths_in_a_row} times in a row ({how})"
            self.notify(f"{self.load_error}; not restarting it. Your conversations are saved.",
                        title="Engine stopped", severity="error", timeout=30)
            try:
                self.chat_screen.engine_unavailable()
            except LookupError:
                pass
            return
        where = f" Its output is in {self.engine.log_path}." if self.engine.log_path else ""
        self.notify(f"The engine process stopped ({how}). {kept}Restarting it…{where}",
                    title="Engine stopped", severity="error", timeout=15)
        if not self._quitting:
            self.engine.start()

    @on(EngineRounds)
    async def _engine_rounds(self, message: EngineRounds) -> None:
        try:
            await self.chat_screen.reply_rounds(message)
        except LookupError:
            pass

    @on(EngineDone)
    async def _engine_done(self, message: EngineDone) -> None:
        self.deaths_in_a_row = 0
        try:
            await self.chat_screen.reply_done(message)
        except LookupError:
            pass

    @on(EngineStopped)
    async def _engine_stopped(self, message: EngineStopped) -> None:
        try:
            await self.chat_screen.reply_stopped_early(message.request_id)
        except LookupError:
            pass

    @on(EngineReplyFailed)
    async def _engine_reply_failed(self, message: EngineReplyFailed) -> None:
        try:
            await self.chat_screen.reply_failed(message.request_id, message.error)
        except LookupError:
            pass

    async def action_quit(self) -> None:
        """Quit; a reply in progress is stopped first and its partial text saved, then we exit."""
        try:
            stopping = self.chat_screen.stop_reply()
        except LookupError:
            stopping = False
        if stopping:
            self._quitting = True
            self.set_timer(QUIT_GRACE_S, self.exit)  # a reply that does not stop must not keep us open
            return
        self.exit()

    def reply_ended(self) -> None:
        """Called by the chat screen when a reply has been recorded (UI thread)."""
        if self._quitting:
            self.exit()

    async def on_unmount(self) -> None:
        """Stop a running reply and close the engine process (waiting off the event loop)."""
        try:
            self.chat_screen.stop_reply()
        except LookupError:
            pass
        await asyncio.to_thread(self.engine.close, 10.0)

    # ------------------------------------------------------------------ help and palette
    def key_bindings(self) -> list[tuple[str, Binding]]:
        """Every binding with an id, with where it applies: the help screen and palette use it."""
        rows: list[tuple[str, Binding]] = [("message box", b) for b in PROMPT_KEYS]
        rows += [("chat", b) for b in ChatScreen.BINDINGS if isinstance(b, Binding)]
        rows += [("conversation list", b) for b in ConversationList.BINDINGS if isinstance(b, Binding)]
        rows += [("anywhere", b) for b in self.BINDINGS if isinstance(b, Binding)]
        rows.append(("anywhere", Binding("ctrl+p", "command_palette", "Commands", id="command_palette",
                                         tooltip="Open the command palette (search every action)")))
        return rows

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(self.key_bindings()))

    # ------------------------------------------------------------------ the model picker
    def action_pick_model(self) -> None:
        """Open the model picker (screens/model_picker.py); the chosen model gets a new conversation."""
        from ..config import load_config
        from .screens.model_picker import ModelPickerScreen

        if isinstance(self.screen, ModelPickerScreen):
            return
        try:
            folders = [str(f) for f in load_config().folders()]
        except AdaSparkError as err:
            self.notify(f"{err}; its model folders are not searched.", title="Config", severity="warning")
            folders = []
        picker = ModelPickerScreen(getattr(self, "model_path", None), folders,
                                   learned_rows=getattr(self.store, "list_learned", None))
        self.push_screen(picker, callback=self._model_picked)

    async def _model_picked(self, entry: Any) -> None:
        if entry is not None:
            await self.switch_model(entry.path, entry.name)

    async def switch_model(self, path: str | None, label: str, *, new_conversation: bool = True) -> bool:
        """Run the model at `path` (None: the bundled one) from now on: the engine process is
        restarted with it (its learned state is the store's for that model) and, with
        new_conversation, a new conversation starts (else the open one goes on: a stored
        conversation reopened on its own model). New conversations then take that model's
        recommended sampling settings under the ones the user set (`sampling_given`). False (and
        a notification) while a reply runs, or if this app's engine cannot change models."""
        try:
            chat = self.chat_screen
        except LookupError:
            return False
        if chat.generating:
            self.notify("A reply is being generated; Esc stops it, then choose the model again.",
                        severity="warning")
            return False
        factory = factory_with_model(self.engine_factory, path)
        if factory is None:
            self.notify("This engine cannot change models.", title="Model", severity="error")
            return False
        self.engine_factory = factory
        self.model_path, self.model_label = path, label
        self.load_error = None
        self.deaths_in_a_row = 0
        self.switching_to = label
        self.n_ctx = None  # until the new engine says its context
        if self.sampling_given is not None:
            from ..engine.sampling import SamplingSettings, chat_defaults

            self.sampling = SamplingSettings(**{**chat_defaults(path), **self.sampling_given})
        self._new_conversation_on_load = new_conversation
        self.engine.switch(factory)
        if new_conversation:
            await chat.new_conversation()  # its settings name the new model (default_settings)
        self._update_subtitle()
        chat.set_status()
        return True

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Model", "Choose a model: a new conversation starts on it (ctrl+t)",
                            self.action_pick_model)
        try:
            chat = self.chat_screen
        except LookupError:
            return
        seen: set[str] = set()
        for b in ChatScreen.BINDINGS:
            if not isinstance(b, Binding) or b.id in seen:
                continue
            seen.add(b.id or b.action)
            keys = " / ".join(k.strip() for k in b.key.split(","))
            yield SystemCommand(b.tooltip or b.description, f"{b.description} ({keys})",
                                getattr(chat, f"action_{b.action}"))
        yield SystemCommand("Help", "Every key and action (f1)", self.action_help)


def factory_with_model(factory: Any, path: str) -> Any:
    """`factory` building the engine on the model at `path` instead: an EngineConfig with another
    model_path, also inside a functools.partial (the tests' recording wrapper); None if the
    factory holds no EngineConfig."""
    import dataclasses
    import functools

    from ..engine.worker import EngineConfig

    if isinstance(factory, EngineConfig):
        return dataclasses.replace(factory, model_path=path)
    if isinstance(factory, functools.partial):
        args, changed = [], False
        for a in factory.args:
            new = factory_with_model(a, path) if isinstance(a, (EngineConfig, functools.partial)) else None
            changed = changed or new is not None
            args.append(a if new is None else new)
        return functools.partial(factory.func, *args, **factory.keywords) if changed else None
    return None


def _store_label(store: Any, store_path: str | None) -> str:
    path = getattr(store, "path", None) or store_path or ""
    text = str(path)
    home = str(Path.home())
    return "~" + text[len(home):] if text.startswith(home + "/") else text


def engine_log_path() -> str | None:
    """Where the engine process writes what it prints (llama.cpp, a crash's stack): the user
    log directory, or None (discarded) if it cannot be made."""
    try:
        from platformdirs import user_log_path

        d = user_log_path("adaspark", appauthor=False)
        d.mkdir(parents=True, exist_ok=True)
        return str(d / "engine.log")
    except Exception:
        return None


def run_chat(model: str | None, drafter: str | None, store_path: str | None, max_tokens: int = MAX_TOKENS,
             sampling: Any = None, n_ctx: int | None = None, system: str | None = None,
             resume_id: str | None = None, sampling_given: dict[str, Any] | None = None) -> int:
    """Run `adaspark chat`; returns the exit code (2 with a one-line message on a user error).

    max_tokens, sampling and system: a new conversation's settings; resume_id: the stored
    conversation to open at start (`--continue`), which keeps its own; sampling_given: the
    sampling values set by the options and the config file (a model switch keeps them)."""
    from ..engine.worker import EngineConfig
    from ..store import Store

    try:
        store = Store.open(store_path)
    except AdaSparkError as err:
        print(f"adaspark: error: {err}", file=sys.stderr)
        return err.exit_code

    # The engine process opens the same file for its learned state (WAL, busy timeout).
    config = EngineConfig(model_path=model, drafter_path=drafter, store_path=str(store.path), n_ctx=n_ctx)
    app = AdaSparkApp(
        config, store,
        model_label=Path(model).name if model else BUNDLED_NAME,
        drafter_label=Path(drafter).name if drafter else None,
        store_label=_store_label(store, store_path),
        max_tokens=max_tokens, engine_log=engine_log_path(), sampling=sampling,
        system=system, model_path=model, resume_id=resume_id,
        sampling_given=dict(sampling_given or {}),
    )
    from ..config import load_config

    try:
        theme = load_config().theme  # checked by the CLI already: a Textual theme name, or None
    except AdaSparkError:
        theme = None  # the file changed since: the CLI said what was wrong with it
    if theme:
        app.theme = theme
    lower_ui_priority()  # after the app made its engine io thread, which keeps the priority
    try:
        app.run()
    finally:
        app.engine.close(timeout=10.0)
        store.close()
    return app.return_code or 0
