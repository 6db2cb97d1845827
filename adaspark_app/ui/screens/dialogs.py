"""Small modal dialogs: rename a conversation, confirm a deletion, save text to a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

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
            yield Label(self.question, markup=False)
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


class SaveFileScreen(ModalScreen[Path | None]):
    """Asks where to write a file, then writes it with `write(path)`; dismisses with the path
    written, or None when cancelled.

    A relative path is taken from `base` (the current directory in `adaspark chat`) and `~` is
    expanded. An existing file is never overwritten silently: the dialog says so, and only a
    second Save of the same path replaces it. A failed write (no such directory, no permission)
    is shown in the dialog, which stays open.
    """

    DEFAULT_CSS = DIALOG_CSS.format(name="SaveFileScreen") + """
    SaveFileScreen > Vertical { width: 84; max-width: 95%; }
    SaveFileScreen #problem { color: $warning; height: auto; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="save_cancel")]

    def __init__(self, title: str, default: Path, write: Callable[[Path], None], base: Path | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.default = default
        self.write = write
        self.base = base or Path.cwd()
        self._confirmed: Path | None = None  # the existing file the user was told about

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, markup=False)
            yield Input(value=str(self.default), id="path")
            yield Static("", id="problem", markup=False)
            with Horizontal():
                yield Button("Cancel", id="cancel")
                yield Button("Save", id="ok", variant="primary")

    @property
    def problem(self) -> str:
        """What the dialog says is wrong ('' when nothing)."""
        return str(self.query_one("#problem", Static).render())

    def _say(self, text: str) -> None:
        self.query_one("#problem", Static).update(text)

    def target(self) -> Path | None:
        text = self.query_one("#path", Input).value.strip()
        if not text:
            return None
        path = Path(os.path.expanduser(text))
        return path if path.is_absolute() else self.base / path

    @on(Input.Changed)
    def _changed(self) -> None:
        self._confirmed = None
        self._say("")

    @on(Input.Submitted)
    @on(Button.Pressed, "#ok")
    def _ok(self) -> None:
        path = self.target()
        if path is None:
            self._say("Type a file name.")
            return
        if path.is_dir():
            self._say(f"{path} is a directory: add a file name.")
            return
        if path.exists() and self._confirmed != path:
            self._confirmed = path
            self._say(f"{path.name} exists. Save again to overwrite it, or change the name.")
            return
        try:
            self.write(path)
        except OSError as err:
            self._say(f"Could not write {path}: {err.strerror or err}")
            return
        self.dismiss(path)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
