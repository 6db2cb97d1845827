"""The conversation settings dialog: system prompt, max tokens and the sampling settings.

Values are checked by `ChatSettings.with_form`, i.e. by the same code as the command-line
options; an invalid one keeps the dialog open with the CLI's message under the fields and
nothing is saved.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

from ...errors import AdaSparkError
from ..chat_settings import ChatSettings

# (field, label, hint): the hints are the CLI's rules for the same option
FIELDS = (
    ("max_tokens", "Max tokens", ">= 1"),
    ("temperature", "Temperature", ">= 0, 0 greedy"),
    ("top_k", "Top-k", ">= 0, 0 off"),
    ("top_p", "Top-p", "(0, 1], 1 off"),
    ("min_p", "Min-p", "[0, 1], 0 off"),
    ("repeat_penalty", "Repeat penalty", "> 0, 1 off"),
    ("repeat_last_n", "Repeat last n", ">= 0, 0 off"),
    ("seed", "Seed", "blank: random"),
)


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Edits a conversation's settings; dismisses with the new ChatSettings, or None."""

    DEFAULT_CSS = """
    SettingsScreen { align: center middle; }
    SettingsScreen > VerticalScroll {
        width: 84; max-width: 95%; height: auto; max-height: 95%;
        padding: 0 2; border: thick $primary; background: $surface;
    }
    SettingsScreen .title { text-style: bold; margin-top: 1; }
    SettingsScreen .muted { color: $text-muted; }
    SettingsScreen #system { height: 6; margin-bottom: 1; }
    SettingsScreen Grid { grid-size: 4; grid-columns: 16 1fr 16 1fr; grid-rows: 3; height: auto; }
    SettingsScreen Grid > Label { padding: 0 1 0 0; height: 3; }
    SettingsScreen #error { color: $error; height: auto; }
    SettingsScreen Horizontal { height: auto; align-horizontal: right; margin: 1 0; }
    SettingsScreen Button { margin-left: 1; }
    """
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="settings_cancel"),
        Binding("ctrl+s", "save", "Save", id="settings_save", priority=True),
    ]

    def __init__(self, settings: ChatSettings, where: str = "this conversation") -> None:
        super().__init__()
        self.settings = settings
        self.where = where

    def compose(self) -> ComposeResult:
        values = self.settings.form_values()
        with VerticalScroll():
            yield Label(f"Settings of {self.where}", classes="title", markup=False)
            model = self.settings.model or "the loaded model"
            yield Static(f"Model: {model}", classes="muted", id="model", markup=False)
            yield Label("System prompt (sent first; blank: none; Enter: a new line, Ctrl+S saves)")
            yield TextArea(values["system"], id="system", soft_wrap=True, show_line_numbers=False,
                           tab_behavior="focus")
            with Grid():
                for name, label, hint in FIELDS:
                    # the name, and under it the CLI's rule for the value
                    yield Label(Text.assemble((label, "bold"), "\n", (hint, "dim")))
                    yield Input(values[name], id=name, tooltip=f"{label}: {hint}")
            yield Static("", id="error", markup=False)
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button("Save", id="save", variant="primary")

    def on_mount(self) -> None:
        area = self.query_one("#system", TextArea)
        area.focus()
        area.move_cursor(area.document.end)  # typing adds to the prompt there is, as in an editor

    def form(self) -> dict[str, str]:
        """The fields' text as typed."""
        values = {name: self.query_one(f"#{name}", Input).value for name, _, _ in FIELDS}
        values["system"] = self.query_one("#system", TextArea).text
        return values

    @property
    def error(self) -> str:
        """The message shown for an invalid value ('' when none)."""
        return str(self.query_one("#error", Static).render())

    @on(Input.Submitted)
    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        try:
            new = self.settings.with_form(self.form())
        except AdaSparkError as err:
            self.query_one("#error", Static).update(f"Not saved: {err}")
            return
        self.dismiss(new)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
