"""What the chat screen's parts need from the app that shows them.

The app imports the screens; the screens import this module (a Protocol the app satisfies)
rather than the app.
"""

from __future__ import annotations

from typing import Protocol

from .conversation import ChatStore
from .engine_client import EngineClient


class ChatHost(Protocol):
    """The app as the chat screen sees it (`AdaSparkApp` is one). UI thread only."""

    store: ChatStore
    engine: EngineClient
    model_label: str  # the loaded model's name, as the engine reported it
    load_error: str | None  # why no engine will answer (its load failed, or it kept dying)
