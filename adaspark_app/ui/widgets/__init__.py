"""Widgets of the chat screen."""

from .chat_view import ChatMessage, ChatView
from .key_footer import KeyFooter
from .prompt import PromptInput
from .sidebar import ConversationList, ConversationSidebar
from .spec_panel import SpecPanel, render_panel

__all__ = ["ChatMessage", "ChatView", "ConversationList", "ConversationSidebar", "KeyFooter", "PromptInput",
           "SpecPanel", "render_panel"]
