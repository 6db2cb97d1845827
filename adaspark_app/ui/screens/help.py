"""The help screen: every key and action, read from the live bindings so it cannot drift."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

INTRO = """\
# AdaSpark chat

Talk to a local model. Replies are decoded with **lossless speculative decoding** (greedy, or
sampled with the conversation's settings: **F3**): each round the AdaSpark scheduler picks how
many candidate rows to verify (the *width*) from what it has learned about this machine's verify
cost and the drafts' acceptance. The *Speculation* panel shows it live; learned state is saved to
the store after every reply. Each conversation keeps its own system prompt and settings; **F5**
regenerates the last reply, **F4** edits an earlier message.

All actions are also in the command palette (**Ctrl+P**).
"""

PANEL_HELP = """\
## The speculation panel

| Figure | Meaning |
|---|---|
| reply tok/s / tok/s now | decode rate over the whole reply / over the last second, measured in the engine process as `adaspark run` measures it |
| on screen | what the display delivered: tokens shown over the time from the first to the last text shown |
| plain, speedup | plain one-token decode rate the cost model predicts here, and the reply's rate over it |
| tok/round | tokens committed per verify round (accepted drafts + the bonus token) |
| width now, widths | rows verified this round, and a histogram of recent rounds |
| accepted / drafted | draft rows accepted over verified, by source: DSpark drafter, n-gram, both agreed |
| verify price | priced verify time of each offered width at the current context; ◀ marks the choice |
| tree priced by | the fitted acceptance model, or the drafter-head estimate while the guard prefers it |
| cold start | widths measured often enough to be priced, out of the widths offered |
"""


def key_label(key: str) -> str:
    """'ctrl+n' -> 'Ctrl+N', 'question_mark' -> '?', 'f1' -> 'F1'."""
    special = {"question_mark": "?", "escape": "Esc", "enter": "Enter", "delete": "Delete"}
    parts = []
    for part in key.split("+"):
        if part in special:
            parts.append(special[part])
        elif len(part) == 1:
            parts.append(part.upper())
        else:
            parts.append(part[:1].upper() + part[1:])
    return "+".join(parts)


def keys_table(rows: list[tuple[str, Binding]]) -> str:
    """A Markdown table of (where, binding) rows, one line per binding id."""
    lines = ["| Keys | Action | Where |", "|---|---|---|"]
    for where, b in rows:
        keys = " / ".join(key_label(k.strip()) for k in b.key.split(","))
        text = b.tooltip or b.description
        lines.append(f"| {keys} | {text} | {where} |")
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    """Lists the keys; Esc, F1 or Q closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 100; max-width: 95%; height: 90%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    """
    BINDINGS = [Binding("escape,f1,q,question_mark", "close", "Close", id="help_close")]

    def __init__(self, rows: list[tuple[str, Binding]]) -> None:
        super().__init__()
        self.rows = rows

    @property
    def markdown(self) -> str:
        return "\n".join([INTRO, "## Keys", "", keys_table(self.rows), "", PANEL_HELP])

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(self.markdown, id="help-text")

    def action_close(self) -> None:
        self.dismiss(None)
