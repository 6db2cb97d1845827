"""`adaspark chat`: the Textual app and its entry point.

The engine runs in its own process (`engine_client.EngineClient`, `engine/worker.py`), started
once the chat screen is up (`ChatScreen.Ready`): the window appears at once, and a prompt typed
while the model loads waits in the command pipe. If the engine process dies, the app says so, keeps the
conversation and the text so far, and starts a new engine.

The app owns the engine's lifecycle (start, restarts, load errors, model switches) and the
header; the chat screen owns the conversation. The screen sees the app as a `ChatHost`
(ui/host.py) and never imports this module: the app passes the engine client's messages down to
it, and it posts its own (`ChatScreen.Ready`, `ReplyEnded`, `EngineDeathHandled`) up.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.filter import LineFilter
from textual.message import Message
from textual.screen import Screen

from ..engine.sampling import GREEDY
from ..errors import AdaSparkError
from ..models import BUNDLED_NAME
from ..wording import one_line, printable
from .chat_settings import ChatSettings
from .control_filter import DropControls
from .conversation import MAX_TOKENS
from .engine_client import (EngineClient, EngineDied, EngineDone, EngineLoaded, EngineLoadFailed, EnginePrefill,
                            EngineReadAhead, EngineReadingAhead, EngineReplyFailed, EngineRounds, EngineStopped,
                            lower_ui_priority)
from .host import EngineStateChanged
from .screens import ChatScreen, HelpScreen
from .styles_cache_fix import install as install_styles_cache_fix
from .widgets.sidebar import ConversationList

QUIT_GRACE_S = 5.0  # how long Ctrl+Q waits for a running reply to stop and be saved
QUIT_SIGNALS = ("SIGHUP", "SIGTERM")  # the terminal closed (an SSH link dropped, a window shut), or `kill`
MAX_RESTARTS = 3  # engine deaths in a row (no reply completed between them) before giving up
# Narrower than this, the header's subtitle takes its short form: at 80 columns about 50 of its
# characters show, and the full form was cut inside the model's name, before the context figure.
SHORT_HEADER_BELOW = 100

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
                 sampling_given: dict[str, Any] | None = None, quit_on_signals: bool = False,
                 read_ahead: bool = True) -> None:
        """`engine_factory` builds the engine inside the engine process, so it must be picklable
        (an `EngineConfig`, or a module-level callable): it crosses a "spawn" process start.

        max_tokens, sampling and system are the settings a new conversation starts with (each
        conversation then keeps its own: `Conversation.settings`); resume_id opens that stored
        conversation at start (`chat --continue`). sampling_given: the sampling values the user
        set (options, config file); with it, a model switch gives new conversations the new
        model's recommended settings (its GGUF's general.sampling.*) under those values.
        quit_on_signals: SIGHUP and SIGTERM quit as Ctrl+Q does (`adaspark chat`; not for an app a
        test drives in its own process). read_ahead: the engine reads the open conversation's
        history while the next message is typed (the config file's `read_ahead`)."""
        install_styles_cache_fix()  # Textual keeps dead widgets' lines alive otherwise (styles_cache_fix.py)
        super().__init__()
        self._drop_controls = DropControls()  # replies and names may hold ESC and its kin (control_filter.py)
        self.engine = EngineClient(engine_factory, self.post_message, log_path=engine_log)
        self.engine_factory = engine_factory  # what the engine process is built from (the picker swaps it)
        self.read_ahead = read_ahead
        self.switching_to: str | None = None  # the model the picker asked for, until it has loaded
        self.deaths_in_a_row = 0
        self.store = store
        self.model_label = model_label
        self.drafter_label = drafter_label
        self.device_label: str | None = None  # where the engine runs the model (EngineLoaded tells it)
        self.opens_thinking = False  # the model's prompt opens its thinking (EngineLoaded tells it)
        self.store_label = store_label
        self.export_dir = export_dir or Path.cwd()
        self.max_tokens = max_tokens
        self.sampling = sampling  # SamplingSettings of a new conversation (None: greedy)
        self.sampling_given = sampling_given
        self.n_ctx: int | None = None  # the context the engine opened (EngineLoaded tells it)
        self.system = system  # system prompt of a new conversation (None: none)
        self.model_path = model_path  # the GGUF the engine loads (None: the bundled model)
        self.resume_id = resume_id
        self.unsaved_drafts: list[tuple[str, str]] = []  # the chat screen's, as it closed
        self.exit_on_load_error = exit_on_load_error
        self.load_error: str | None = None
        self._load_started = False
        self._quitting = False
        self._quit_on_signals = quit_on_signals
        # what the header shows of the open conversation (show_settings; None: a new one's)
        self._shown_settings: ChatSettings | None = None
        self._context_used: int | None = 0
        self._update_subtitle()

    def notify(self, message: str, *, title: str = "", severity: Any = "information", timeout: float | None = None,
               markup: bool = False) -> None:
        """A notification, always plain text (`markup` is ignored): notifications quote file
        names, GGUF names, titles of conversations and errors, where `[/]` is text, not markup
        (Textual's default would raise on it and end the app)."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    def get_line_filters(self) -> Sequence[LineFilter]:
        """Textual's filters, then DropControls: no text drawn carries a terminal command."""
        return [*super().get_line_filters(), self._drop_controls]

    @property
    def quitting(self) -> bool:
        """Whether a quit waits for the reply in flight to end (`action_quit`)."""
        return self._quitting

    # ------------------------------------------------------------------ screens
    def get_default_screen(self) -> Screen:
        return ChatScreen(self)

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

    def show_settings(self, settings: ChatSettings, context_used: int | None) -> None:
        """The open conversation's settings and context changed (opened, edited, new, a reply
        recorded): the header follows. Called by the chat screen (`ChatHost`)."""
        self._shown_settings, self._context_used = settings, context_used
        self._update_subtitle()

    def _update_subtitle(self) -> None:
        drafter = self.drafter_label or "none (n-gram drafts)"
        settings = self._shown_settings or self.default_settings()  # none shown yet: a new conversation's
        device = f"on {self.device_label} · " if self.device_label else ""
        rest = f"{device}{settings.label()} · drafter {drafter} · store {self.store_label}"
        if self.size.width < SHORT_HEADER_BELOW:  # the model's name without its details, the context as a/b
            self.sub_title = f"{short_model_label(self.model_label)} · {self._context_label(short=True)}{rest}"
            return
        # the context figure second: it changes with every reply, and a 100-column terminal shows it
        self.sub_title = f"model {self.model_label} · {self._context_label()}{rest}"

    def _context_label(self, short: bool = False) -> str:
        """'context 312 of 8192 tok · ': what the open conversation takes of the engine's
        context ('context 8192 tok · ' where that is not known); short: '312/8192 tok · '."""
        if not self.n_ctx:
            return ""
        used = self._context_used
        if short:
            return f"{self.n_ctx} tok context · " if used is None else f"{used}/{self.n_ctx} tok · "
        return f"context {self.n_ctx} tok · " if used is None else f"context {used} of {self.n_ctx} tok · "

    def on_mount(self) -> None:
        if self._quit_on_signals:
            self._install_quit_signals()

    def _install_quit_signals(self) -> None:
        """SIGHUP and SIGTERM quit as Ctrl+Q does: a reply in progress is stopped and what it had
        generated saved, the engine closed, the terminal restored; a second signal quits at once.
        Without this a closed terminal lost the message being answered and its reply."""
        loop = asyncio.get_running_loop()
        for name in QUIT_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is None:
                continue
            try:
                loop.add_signal_handler(sig, self._quit_on_signal)
            except (NotImplementedError, RuntimeError, ValueError):  # not on this platform or thread
                pass

    def _quit_on_signal(self) -> None:
        if self._quitting:
            self.exit()
            return
        self.call_later(self.action_quit)

    @on(ChatScreen.Ready)
    def start_engine_load(self) -> None:
        """Start the engine process (once), when the chat screen has mounted."""
        if not self._load_started:
            self._load_started = True
            self.engine.start()

    # ------------------------------------------------------------------ the engine
    # Messages from the engine process arrive here (posted by the io thread); after the app's
    # own part they go on to the chat screen. Every handler runs on the UI thread.
    def _to_chat(self, message: Message) -> bool:
        """Pass `message` on to the chat screen; False when it is not there (starting, closing)."""
        try:
            chat = self.chat_screen
        except LookupError:
            return False
        return chat.post_message(message)

    @on(EngineLoaded)
    def _engine_loaded(self, message: EngineLoaded) -> None:
        if message.model_name:
            self.model_label = message.model_name
        if message.drafter_name:
            self.drafter_label = message.drafter_name
        if message.n_ctx:
            self.n_ctx = message.n_ctx
        self.device_label = message.device
        self.opens_thinking = message.opens_thinking
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
        self._to_chat(message)

    @on(EngineLoadFailed)
    def _engine_failed(self, message: EngineLoadFailed) -> None:
        self.load_error = message.error
        self.switching_to = None  # a picked model that fails: said below; Ctrl+T picks another
        if self.exit_on_load_error and not message.restarted:
            self.exit(2, return_code=2, message=f"adaspark: error: {one_line(message.error)}")  # as the CLI says it
            return
        self.notify(message.error, title="The model failed to load", severity="error", timeout=30)
        self._to_chat(message)  # a reply that waited for this engine is given back

    @on(EngineDied)
    def _engine_died(self, message: EngineDied) -> None:
        """The engine process ended unasked: the chat screen keeps (or gives back) the reply it
        cut short, then `_after_death` says so and restarts the engine."""
        self.deaths_in_a_row += 1
        if not self._to_chat(message):
            self._after_death(message, "")

    @on(ChatScreen.EngineDeathHandled)
    def _death_handled(self, message: ChatScreen.EngineDeathHandled) -> None:
        self._after_death(message.died, message.kept)

    def _after_death(self, died: EngineDied, kept: str) -> None:
        """A restart, or too many deaths in a row: no more restarts. `kept`: what became of the
        reply in progress, for the notification."""
        how = f"exit code {died.exitcode}" if died.exitcode is not None else "no exit code"
        if died.exitcode is not None and died.exitcode < 0:
            how = f"signal {-died.exitcode}"
        if died.reason:
            how = f"{how}: {died.reason}"
        if self.deaths_in_a_row > MAX_RESTARTS:
            self.load_error = f"the engine process stopped {self.deaths_in_a_row} times in a row ({how})"
            self.notify(f"{self.load_error}; not restarting it. Your conversations are saved.",
                        title="Engine stopped", severity="error", timeout=30)
            self._to_chat(EngineStateChanged())
            return
        where = f" Its output is in {self.engine.log_path}." if self.engine.log_path else ""
        self.notify(f"The engine process stopped ({how}). {kept}Restarting it…{where}",
                    title="Engine stopped", severity="error", timeout=15)
        if not self._quitting:
            self.engine.start()

    @on(EngineDone)
    def _engine_done(self, message: EngineDone) -> None:
        self.deaths_in_a_row = 0
        self._to_chat(message)

    @on(EnginePrefill)
    @on(EngineReadingAhead)
    @on(EngineReadAhead)
    @on(EngineRounds)
    @on(EngineStopped)
    @on(EngineReplyFailed)
    def _engine_reply(self, message: Message) -> None:
        self._to_chat(message)

    async def action_quit(self) -> None:
        """Quit; a reply in progress is stopped first and its partial text saved, then we exit."""
        try:
            chat = self.chat_screen
        except LookupError:
            chat = None
        if chat is not None and chat.generating:
            await chat.run_action("stop_reply")
            self._quitting = True
            self.set_timer(QUIT_GRACE_S, self.exit)  # a reply that does not stop must not keep us open
            return
        self.exit()

    @on(ChatScreen.ReplyEnded)
    def _reply_ended(self) -> None:
        self.reply_ended()  # a method of its own, which a subclass may extend (benchmarks/ui/ui_cpu.py)

    def reply_ended(self) -> None:
        """A reply has been recorded or given back (`ChatScreen.ReplyEnded`): a quit that waited
        for it goes on."""
        if self._quitting:
            self.exit()

    async def on_unmount(self) -> None:
        """Close the engine process, waiting off the event loop (`close` stops a reply still
        running first; Ctrl+Q waits up to QUIT_GRACE_S for it to be recorded: `action_quit`)."""
        await asyncio.to_thread(self.engine.close, 10.0)

    # ------------------------------------------------------------------ help and palette
    @classmethod
    def key_bindings(cls) -> list[tuple[str, Binding]]:
        """Every binding with an id, with where it applies: the help screen and palette use it (and
        a test, that docs/usage.md lists every key)."""
        rows: list[tuple[str, Binding]] = [("message box", b) for b in PROMPT_KEYS]
        rows += [("chat", b) for b in ChatScreen.BINDINGS if isinstance(b, Binding)]
        rows += [("conversation list", b) for b in ConversationList.BINDINGS if isinstance(b, Binding)]
        rows += [("anywhere", b) for b in cls.BINDINGS if isinstance(b, Binding)]
        rows.append(("anywhere", Binding("ctrl+p", "command_palette", "Commands", id="command_palette",
                                         tooltip="Open the command palette (search every action)")))
        return rows

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(self.key_bindings()))

    # ------------------------------------------------------------------ models
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
            await chat.run_action("new_chat")  # its settings name the new model (default_settings)
        self._update_subtitle()
        self._to_chat(EngineStateChanged())
        return True

    async def follow_model(self, settings: ChatSettings) -> None:
        """A conversation reopened with the settings of another model than the running one: the
        engine switches to that model, as a chat app reopens a chat on its own model; its file
        gone, the running model answers and a notification says so (`ChatHost`)."""
        if same_model(settings.model_path, self.model_path):
            return
        held = settings.model or settings.model_path or "the bundled model"
        path = settings.model_path
        if path is not None and not os.path.isfile(path):
            self.notify(f"This conversation was held with {held}, whose file {path} is not there any more; "
                        f"replies now come from {self.model_label} (Ctrl+T picks a model).",
                        title="Model", severity="warning", timeout=10)
        elif not await self.switch_model(path, held, new_conversation=False):
            self.notify(f"This conversation was held with {held}; replies now come from "
                        f"{self.model_label} (Ctrl+T picks a model).", title="Model", severity="warning",
                        timeout=10)

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


def same_model(a: str | None, b: str | None) -> bool:
    """Whether two model paths (None: the bundled model) name the same file."""
    if a == b:
        return True
    try:
        from ..engine.backend import default_model_path

        a, b = (default_model_path() if x is None else x for x in (a, b))
    except AdaSparkError:  # no bundled model: None names nothing else
        return False
    return os.path.realpath(a) == os.path.realpath(b)


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


ENGINE_LOG_MAX_BYTES = 1 << 20  # past this the log starts afresh, the previous one kept as engine.log.1


def engine_log_path(directory: Path | None = None) -> str | None:
    """Where the engine process writes what it prints (llama.cpp, a crash's stack): the user
    log directory (or `directory`), or None (discarded) if it cannot be made. Every chat appends
    to it, so once it is over ENGINE_LOG_MAX_BYTES it moves to engine.log.1 (replacing the one
    before) and a new one starts."""
    try:
        if directory is None:
            from platformdirs import user_log_path

            directory = user_log_path("adaspark", appauthor=False)
        directory.mkdir(parents=True, exist_ok=True)
        log = directory / "engine.log"
        try:
            if log.stat().st_size > ENGINE_LOG_MAX_BYTES:
                os.replace(log, directory / "engine.log.1")
        except FileNotFoundError:
            pass
        return str(log)
    except Exception:
        return None


def short_model_label(label: str) -> str:
    """The model's name for a narrow header: without the details in brackets ('SmolLM2-135M-Instruct'
    for 'SmolLM2-135M-Instruct (bundled, Q4_1)'), a base model still said."""
    base = " · base model"
    return label.removesuffix(base).split(" (", 1)[0] + (base if label.endswith(base) else "")


def run_chat(model: str | None, drafter: str | None, store_path: str | None, max_tokens: int = MAX_TOKENS,
             sampling: Any = None, n_ctx: int | None = None, system: str | None = None,
             resume_id: str | None = None, sampling_given: dict[str, Any] | None = None,
             gpu_layers: int | None = None, saved_context_mb: int | None = None, read_ahead: bool = True) -> int:
    """Run `adaspark chat`; returns the exit code (2 with a one-line message on a user error).

    max_tokens, sampling and system: a new conversation's settings; resume_id: the stored
    conversation to open at start (`--continue`), which keeps its own; sampling_given: the
    sampling values set by the options and the config file (a model switch keeps them);
    saved_context_mb: the disk kept for conversations' saved contexts (None: the default);
    read_ahead: whether the chat reads an open conversation's history before its next message."""
    from ..engine.worker import EngineConfig
    from ..store import Store
    from ..store.saved_context import DEFAULT_LIMIT_MB, clear, folder_for

    try:
        store = Store.open(store_path)
    except AdaSparkError as err:
        print(f"adaspark: error: {one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # Textual would draw into a file or a pipe, and wait for keys that never come
        store.close()
        print("adaspark: error: `adaspark chat` needs a terminal for its input and output (ssh: "
              "add -t); for scripted conversations use `adaspark run SCRIPT.jsonl`", file=sys.stderr)
        return 2

    if saved_context_mb == 0:  # the config keeps none: none kept from before either
        clear(folder_for(store.path))
    # The engine process opens the same file for its learned state (WAL, busy timeout).
    config = EngineConfig(model_path=model, drafter_path=drafter, store_path=str(store.path), n_ctx=n_ctx,
                          gpu_layers=gpu_layers,
                          saved_context_mb=DEFAULT_LIMIT_MB if saved_context_mb is None else saved_context_mb)
    app = AdaSparkApp(
        config, store,
        model_label=Path(model).name if model else BUNDLED_NAME,
        drafter_label=Path(drafter).name if drafter else None,
        store_label=_store_label(store, store_path),
        max_tokens=max_tokens, engine_log=engine_log_path(), sampling=sampling,
        system=system, model_path=model, resume_id=resume_id,
        sampling_given=dict(sampling_given or {}), quit_on_signals=True, read_ahead=read_ahead,
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
        for text, why in app.unsaved_drafts:  # the terminal is the user's again: nothing typed is lost
            print(f"adaspark: the message box's text could not be saved ({printable(why)}); here it is:\n"
                  f"{printable(text)}", file=sys.stderr)
    return app.return_code or 0
