"""Screens of the chat app."""

from .chat import ChatScreen
from .dialogs import ConfirmScreen, RenameScreen
from .help import HelpScreen

__all__ = ["ChatScreen", "ConfirmScreen", "HelpScreen", "RenameScreen"]
