"""Screens of the chat app."""

from .chat import ChatScreen
from .dialogs import ConfirmScreen, RenameScreen, SaveFileScreen
from .help import HelpScreen
from .settings import SettingsScreen

__all__ = ["ChatScreen", "ConfirmScreen", "HelpScreen", "RenameScreen", "SaveFileScreen", "SettingsScreen"]
