"""The model picker: the models `adaspark models` lists, in the same columns; choosing one starts
a new conversation on it (the app restarts the engine process with that model, and the learned
state, keyed by model in the store, follows). Broken entries are shown with their reason and
cannot be chosen.

Discovery reads file headers (a few ms each, more on a slow disk), so it runs in a thread
(`asyncio.to_thread`); the table is filled on the UI thread when it is done.
"""

from __future__ import annotations

import asyncio
import os
from typing import Callable, Sequence

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, Static

from ...models.command import COLUMNS, row_cells
from ...models.entry import ModelEntry
from ...wording import printable

CURRENT_MARK = "● "  # in front of the model the engine runs now


def _discover(folders: Sequence[str]) -> list[ModelEntry]:
    from ...models import discover_models

    # learned=False: the learned column is filled on the UI thread from the app's open store (a
    # second connection opened and closed here would drop the locks SQLite holds for the app's)
    return discover_models(list(folders), learned=False)


def _picker_order(cells: list) -> list:
    """`adaspark models`' columns with STATUS second: beside the name, in view however narrow
    the terminal (the other columns may run past the dialog's edge and scroll)."""
    return [cells[0], cells[-1], *cells[1:-1]]


class ModelPickerScreen(ModalScreen[ModelEntry | None]):
    """Lists the models found; dismisses with the chosen entry, or None (Esc)."""

    DEFAULT_CSS = """
    ModelPickerScreen { align: center middle; }
    ModelPickerScreen > Vertical {
        width: 95%; height: 80%; padding: 1 2;
        border: thick $primary; background: $surface;
    }
    ModelPickerScreen DataTable { height: 1fr; }
    ModelPickerScreen #picker-count { color: $text-muted; }
    ModelPickerScreen #picker-status { height: auto; min-height: 2; max-height: 5; color: $text-muted;
                                       margin-bottom: 1; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="picker_cancel", tooltip="Close the model list")]

    def __init__(self, current_path: str | None = None, folders: Sequence[str] = (),
                 learned_rows: Callable[[], list[dict]] | None = None,
                 discover: Callable[[Sequence[str]], list[ModelEntry]] = _discover) -> None:
        """learned_rows: the app's store's `list_learned` (UI thread), for the learned column."""
        super().__init__()
        self.current_path = current_path
        self.folders = list(folders)
        self._learned_rows = learned_rows
        self._discover = discover
        self.entries: list[ModelEntry] = []
        self.loaded = False

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Choose a model: a new conversation starts on it (Enter), Esc closes")
            yield Label("Looking for models…", id="picker-count", markup=False)
            yield Static("", id="picker-status")
            yield DataTable(id="models", cursor_type="row", zebra_stripes=True)

    @property
    def table(self) -> DataTable:
        return self.query_one("#models", DataTable)

    def on_mount(self) -> None:
        self.table.add_columns(*_picker_order(list(COLUMNS)))
        self.table.focus()
        self.run_worker(self._load(), exclusive=True, group="model-discovery")

    async def _load(self) -> None:
        entries = await asyncio.to_thread(self._discover, self.folders)
        if self._learned_rows is not None:
            from ...errors import AdaSparkError
            from ...models.discovery import mark_learned

            try:
                rows = self._learned_rows()
            except AdaSparkError as err:
                self.notify(f"the learned column is unknown: {err}", title="Store", severity="warning")
                rows = []
            mark_learned(entries, rows=rows)
        self.show(entries)

    def show(self, entries: list[ModelEntry]) -> None:
        """Fill the table (UI thread): usable models first in the list's order, broken after."""
        self.entries = sorted(entries, key=lambda e: e.broken)  # stable: the list's order within
        table = self.table
        table.clear()
        current_row = 0
        for i, e in enumerate(self.entries):
            cells = row_cells(e)
            if e.broken:
                cells[-1] = "broken"  # the reason, often long, is shown above when the row is highlighted
            if self._is_current(e):
                cells[0] = CURRENT_MARK + cells[0]
                current_row = i
            style = "dim" if e.broken else ""
            table.add_row(*(Text(printable(c), style=style) for c in _picker_order(cells)), key=str(i))  # names from files
        usable = sum(not e.broken for e in self.entries)
        broken = len(self.entries) - usable
        status = f"{usable} usable, {broken} broken" + (" (highlight one to see why)." if broken else ".")
        if not self.entries:
            status = "No GGUF files found (see `adaspark models` for where they are looked for)."
        self.query_one("#picker-count", Label).update(status)
        if self.entries:
            table.move_cursor(row=current_row)
        self.loaded = True

    def _is_current(self, e: ModelEntry) -> bool:
        if self.current_path is None:
            return e.source == "bundled"
        try:
            return os.path.samefile(e.path, self.current_path)
        except OSError:
            return False

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        """The highlighted model's file, and why it cannot be used if it is broken."""
        if event.row_key is None or event.row_key.value is None or not self.entries:
            return
        e = self.entries[int(event.row_key.value)]
        text = printable(f"{e.path}") + (f"\ncannot be used: {printable(str(e.problem))}" if e.broken else "")
        self.query_one("#picker-status", Static).update(Text(text))

    @on(DataTable.RowSelected)
    def _chosen(self, event: DataTable.RowSelected) -> None:
        self.choose(int(event.row_key.value))

    def choose(self, index: int) -> bool:
        """Choose entry `index`: dismisses with it, or says why a broken one cannot be used."""
        e = self.entries[index]
        if e.broken:
            self.notify(f"{e.name} cannot be used: {e.problem}", title="Model", severity="warning")
            return False
        self.dismiss(e)
        return True

    def action_cancel(self) -> None:
        self.dismiss(None)
