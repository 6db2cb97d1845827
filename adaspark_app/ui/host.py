"""What the chat screen needs from the app that shows it, and the one thing the app tells it
beyond the engine's own messages.

The app imports the screens and hands the chat screen itself as a `ChatHost`; the screens import
this module and never the app, so the imports run one way (`ui/app.py -> ui/screens -> ...`).
Between the two, messages go up (the screen posts `ChatScreen.Ready`, `ReplyEnded` and
`EngineDeathHandled` to the app) and the app passes down the engine client's messages and
`EngineStateChanged`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from textual.message import Message

from .chat_settings import ChatSettings
from .conversation import ChatStore
from .engine_client import EngineClient


class ChatHost(Protocol):
    """The app as the chat screen sees it (`AdaSparkApp` is one). UI thread only."""

    store: ChatStore
    engine: EngineClient
    model_label: str  # the loaded model's name, as the engine reported it
    opens_thinking: bool  # its replies start inside their thinking (thinking.py)
    export_dir: Path  # where exports and saved replies go by default
    load_error: str | None  # why no engine will answer (its load failed, or it kept dying)
    resume_id: str | None  # the stored conversation to open at start (`chat --continue`)
    read_ahead: bool  # the engine reads the open conversation's history before its next message
    unsaved_drafts: list[tuple[str, str]]  # (text, why) the store refused, for the chat's last words

    @property
    def quitting(self) -> bool:
        """Whether the app quits once the reply in flight has ended."""
        ...

    def default_settings(self) -> ChatSettings:
        """The settings a new conversation starts with."""
        ...

    def show_settings(self, settings: ChatSettings, context_used: int | None) -> None:
        """The open conversation's settings and the context its last reply took, for the header.
        A call rather than a message, so the header changes in the same step as the settings."""
        ...

    async def follow_model(self, settings: ChatSettings) -> None:
        """A stored conversation was opened with `settings`: the engine switches to the model it
        was held with, if that is another (a notification says when it cannot)."""
        ...


class EngineStateChanged(Message):
    """The app switched models, or found that no engine will answer: the chat's status line
    follows (`AdaSparkApp.load_error`, `EngineClient.ready`)."""
