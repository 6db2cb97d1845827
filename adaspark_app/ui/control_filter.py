"""What reaches the terminal is text, never a terminal command hidden in it.

A reply is the model's output, and a model may write any byte: ESC, BEL, the C1 controls. Model
names and file names come from GGUF files, conversation titles from pasted text. Textual writes a
widget's text to the terminal as it is, so `ESC ]52;c;...BEL` in a reply would set the user's
clipboard, and other sequences move the cursor or retitle the window. `DropControls` is a line
filter the app applies to every line it draws (`AdaSparkApp.get_line_filters`): it takes those
characters out. They take no cell (Rich counts them as 0 wide), so every line keeps its layout.
What is stored, copied and exported stays exactly what the model wrote.
"""

from __future__ import annotations

import re

from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter

# C0 controls (tab and line breaks included: a drawn line holds none), DEL and the C1 controls.
CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")


class DropControls(LineFilter):
    """Removes control characters from the text of every segment of a line (not the segments
    Textual marks as control codes of its own)."""

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        search = CONTROLS.search
        if not any(search(s.text) for s in segments if not s.control):
            return segments
        out: list[Segment] = []
        for s in segments:
            if s.control or not search(s.text):
                out.append(s)
            else:
                text = CONTROLS.sub("", s.text)
                if text:
                    out.append(Segment(text, s.style))
        return out
