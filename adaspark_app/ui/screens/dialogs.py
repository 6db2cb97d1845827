"""Small modal dialogs: rename a conversation, confirm a deletion."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

DIALOG_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 64; height: auto; padding: 1 2;
    border: thick $primary; background: $surface;
}}
{name} Horizontal {{ height: auto; align-horizontal: right; margin-top: 1; }}
{name} Button {{ margin-left: 1; }}
"""


class RenameScreen(ModalScreen[str | None]):
    """Asks for a new title; dismisses with it, or None when cancelled."""

    DEFAULT_CSS = DIALOG_CSS.format(name="RenameScreen")
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog_cancel")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.current_title = title

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Rename conversation")
            yield Input(value=self.current_title, id="title")
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button("Rename", id="ok", variant="primary")

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def _ok(self) -> None:
        title = self.query_one("#title", Input).value.strip()
        self.dismiss(title or None)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; dismisses with True only on an explicit yes."""

    DEFAULT_CSS = DIALOG_CSS.format(name="ConfirmScreen")
    BINDINGS = [
        Binding("escape,n", "no", "No", id="dialog_no"),
        Binding("y", "yes", "Yes", id="dialog_yes"),
    ]

    def __init__(self, question: str, yes_label: str = "Delete") -> None:
        super().__init__()
        self.question = question
        self.yes_label = yes_label

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question)
            with Horizontal():
                yield Button("Cancel", id="no")
                yield Button(self.yes_label, id="yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @on(Button.Pressed, "#yes")
    def action_yes(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#no")
    def action_no(self) -> None:
        self.dismiss(False)
