"""`adaspark chat`: the Textual app and its entry point.

The engine is created lazily in a thread worker (loading a model takes about a second), so the
window appears at once; a prompt typed meanwhile waits for the load in its own worker.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from ..errors import AdaSparkError
from .screens import ChatScreen, HelpScreen
from .screens.chat import MAX_TOKENS, read_gauges
from .stats import EngineGauges
from .streaming import EngineHolder
from .widgets.sidebar import ConversationList

BUNDLED_MODEL_LABEL = "SmolLM2-135M-Instruct (bundled)"
QUIT_GRACE_S = 5.0  # how long Ctrl+Q waits for a running reply to stop and be saved

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
    ]

    class EngineLoaded(Message):
        def __init__(self, model_name: str | None, drafter_name: str | None, gauges: EngineGauges | None) -> None:
            super().__init__()
            self.model_name = model_name
            self.drafter_name = drafter_name
            self.gauges = gauges

    class EngineFailed(Message):
        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    def __init__(self, engine_factory: Callable[[], Any], store: Any, model_label: str = BUNDLED_MODEL_LABEL,
                 drafter_label: str | None = None, store_label: str = "", *, export_dir: Path | None = None,
                 max_tokens: int = MAX_TOKENS, exit_on_load_error: bool = True) -> None:
        super().__init__()
        self.holder = EngineHolder(engine_factory)
        self.store = store
        self.model_label = model_label
        self.drafter_label = drafter_label
        self.store_label = store_label
        self.export_dir = export_dir or Path.cwd()
        self.max_tokens = max_tokens
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

    def _update_subtitle(self) -> None:
        drafter = self.drafter_label or "none (n-gram drafts)"
        self.sub_title = f"model {self.model_label} · drafter {drafter} · store {self.store_label}"

    def start_engine_load(self) -> None:
        """Start building the engine (once); the chat screen calls it when it has mounted."""
        if not self._load_started:
            self._load_started = True
            self._load_engine()

    # ------------------------------------------------------------------ the engine
    @work(thread=True, exclusive=True, group="engine", name="load-engine", exit_on_error=False)
    def _load_engine(self) -> None:
        """Thread boundary: builds the engine (blocking llama.cpp work); posts the outcome."""
        try:
            engine = self.holder.load()
        except AdaSparkError as err:
            self.post_message(self.EngineFailed(str(err)))
            return
        except Exception as err:
            self.post_message(self.EngineFailed(f"{type(err).__name__}: {err}"))
            return
        gauges = None
        with self.holder.busy:
            try:
                gauges = read_gauges(engine, 0)
            except Exception:
                gauges = None
        self.post_message(self.EngineLoaded(getattr(engine, "model_name", None),
                                            getattr(engine, "drafter_name", None), gauges))

    @on(EngineLoaded)
    def _engine_loaded(self, message: EngineLoaded) -> None:
        if message.model_name:
            self.model_label = message.model_name
        if message.drafter_name:
            self.drafter_label = message.drafter_name
        self._update_subtitle()
        try:
            self.chat_screen.engine_ready(message.gauges)
        except LookupError:
            pass

    @on(EngineFailed)
    def _engine_failed(self, message: EngineFailed) -> None:
        self.load_error = message.error
        if self.exit_on_load_error:
            self.exit(2, return_code=2, message=f"error: {message.error}")
            return
        self.notify(message.error, title="The model failed to load", severity="error", timeout=30)
        try:
            self.chat_screen.set_status()
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
        """Stop a running reply and close the engine once it has returned (off the event loop)."""
        try:
            self.chat_screen.stop_reply()
        except LookupError:
            pass
        await asyncio.to_thread(self.holder.close, 10.0)

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

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
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


def _store_label(store: Any, store_path: str | None) -> str:
    path = getattr(store, "path", None) or store_path or ""
    text = str(path)
    home = str(Path.home())
    return "~" + text[len(home):] if text.startswith(home + "/") else text


def run_chat(model: str | None, drafter: str | None, store_path: str | None) -> int:
    """Run `adaspark chat`; returns the exit code (2 with a one-line message on a user error)."""
    from ..store import Store

    try:
        store = Store.open(store_path)
    except AdaSparkError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code

    def make_engine() -> Any:
        from ..engine.chat_engine import ChatEngine

        return ChatEngine(model_path=model, drafter_path=drafter, store=store)

    app = AdaSparkApp(
        make_engine, store,
        model_label=Path(model).name if model else BUNDLED_MODEL_LABEL,
        drafter_label=Path(drafter).name if drafter else None,
        store_label=_store_label(store, store_path),
    )
    try:
        app.run()
    finally:
        app.holder.close(timeout=10.0)
        store.close()
    return app.return_code or 0
