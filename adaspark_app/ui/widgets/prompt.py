"""The multi-line prompt: Enter sends, Ctrl+J (or Shift+Enter where the terminal reports it)
inserts a new line."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")


class PromptInput(TextArea):
    """A TextArea whose Enter submits the text instead of breaking the line."""

    DEFAULT_CSS = """
    PromptInput {
        height: auto;
        min-height: 3;
        max-height: 10;
        border: round $accent;
    }
    PromptInput:focus { border: round $accent-lighten-2; }
    """

    class Submitted(Message):
        """The user pressed Enter; `text` is what they wrote (not yet cleared)."""

        def __init__(self, prompt: "PromptInput", text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

        @property
        def control(self) -> "PromptInput":
            return self.prompt

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("soft_wrap", True)
        kwargs.setdefault("show_line_numbers", False)
        kwargs.setdefault("tab_behavior", "focus")
        super().__init__(**kwargs)
        self.border_title = "Message"
        self.border_subtitle = "Enter send · Ctrl+J new line · Esc stop"
        self._titles: tuple[str, str] | None = None  # the box's own titles while a message is edited

    async def _on_key(self, event: events.Key) -> None:
        # Runs before TextArea._on_key (handlers are dispatched down the MRO); prevent_default
        # keeps TextArea from also inserting a line break for Enter.
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
        elif event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self.replace("\n", start, end, maintain_selection_offset=False)

    def restore(self, text: str) -> None:
        """Put a prompt back (after a failed reply), keeping anything typed since."""
        current = self.text
        self.text = text if not current.strip() else f"{text}\n{current}"
        self.move_cursor(self.document.end)

    def show_editing(self, text: str, title: str, subtitle: str) -> None:
        """Hold `text`, a message being edited, under editing titles (the box's own come back
        with `end_editing`)."""
        if self._titles is None:
            self._titles = (str(self.border_title or ""), str(self.border_subtitle or ""))
        self.text = text
        self.move_cursor(self.document.end)
        self.border_title, self.border_subtitle = title, subtitle

    def end_editing(self, text: str | None) -> None:
        """Back to the box's own titles; `text` (unless None) replaces what it holds."""
        if text is not None:
            self.text = text
            self.move_cursor(self.document.end)
        if self._titles is not None:
            self.border_title, self.border_subtitle = self._titles
            self._titles = None
