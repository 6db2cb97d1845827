"""Where a growing Markdown reply can be cut so that the part before the cut is final.

While a reply streams, the chat shows its settled blocks as rendered Markdown and the rest (the
block still being written) as plain text, so a frame repaints one small plain-text widget
instead of re-parsing and re-laying-out the reply's last Markdown block (issue 17: every UI
cycle on a small machine is taken from the decode).

A cut is only made where parsing the two sides apart gives the same blocks as parsing them
together: at the start of a line that follows a blank line, outside a code fence, and where the
next block cannot continue the one before it (an indented line could continue a list item or be
indented code; a list item after a list could join a loose list). Cases the rules do not cover
(link reference definitions used before they are defined, raw HTML blocks) only change how the
text looks while it streams: the chat appends the same text to the same Markdown widget, and the
tests check the final render against a render of the whole text.

Pure: no Textual, so it is tested on its own.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_LIST_ITEM = re.compile(r" {0,3}(?:[-+*]|\d{1,9}[.)])(?:[ \t]|$)")
# A partial line's first characters that could still turn into a list item, a fence, a
# thematic break, a heading, a table or a quote: wait for its end before cutting before it.
_UNSURE_START = re.compile(r"[-+*\d`~#|>_=<\[!:]")


def is_list_item(line: str) -> bool:
    """True if `line` opens a list item ("- x", "* x", "+ x", "1. x", "1) x")."""
    return _LIST_ITEM.match(line) is not None


def settled_length(text: str) -> int:
    """The length of the longest prefix of `text` made of complete blocks (0 if none).

    `text` must start at a block boundary (the start of a reply, or a previous cut). The prefix
    ends with the blank line(s) after its last block; what follows it is the block in progress.
    """
    cut = 0
    fence: str | None = None  # the open fence's marker (``` or ~~~, with its length)
    blank_before = False  # the previous line was blank (and outside a fence)
    block_is_list = False  # the block before the last blank line holds a list item
    current_is_list = False  # the block being read holds a list item
    pos = 0
    n = len(text)
    while pos < n:
        end = text.find("\n", pos)
        complete = end >= 0
        line = text[pos:end] if complete else text[pos:]
        if fence is not None:
            m = _FENCE.match(line)
            if complete and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line[m.end():].strip():
                fence = None  # closed: the fenced block ends with this line
            blank_before = False
        elif not line.strip():
            if not complete:
                break  # spaces at the end: the line may go on
            if not blank_before:
                block_is_list = current_is_list
            blank_before = True
        else:
            if blank_before:
                if _can_start_here(line, complete, block_is_list):
                    cut = pos
                # A new block, unless indented: then it continues the one before (a list item's).
                current_is_list = block_is_list and line[0] in " \t"
                blank_before = False
            if is_list_item(line):
                current_is_list = True
            m = _FENCE.match(line)
            if m and (m.group(1)[0] == "~" or "`" not in line[m.end():]):
                fence = m.group(1)
        if not complete:
            break
        pos = end + 1
    return cut


def _can_start_here(line: str, complete: bool, after_list: bool) -> bool:
    """Can a new block start with `line` after a blank line, apart from what came before?"""
    if line[0] in " \t":
        return False  # indented: a list item's continuation, or indented code joining the last
    if not complete and _UNSURE_START.match(line):
        return False  # not yet known what this line opens
    if after_list and is_list_item(line):
        return False  # another item of a loose list
    return True
