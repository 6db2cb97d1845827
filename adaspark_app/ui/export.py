"""A conversation as a Markdown document, and where to write it."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from ..thinking import split_thinking, thinking_title
from .conversation import reply_note

ROLE_HEADINGS = {"system": "System", "user": "You", "assistant": "Assistant"}


def conversation_markdown(title: str, messages: list[dict[str, Any]], model: str | None = None) -> str:
    """Render `messages` ([{role, content, meta?}]) as Markdown, one section per message."""
    lines = [f"# {title or 'Conversation'}", ""]
    if model:
        lines += [f"*Model: {model}*", ""]
    for m in messages:
        heading = ROLE_HEADINGS.get(m.get("role", ""), str(m.get("role", "")).title())
        note = reply_note(m.get("meta"), sep=", ") if m.get("role") == "assistant" else ""
        note = f" ({note})" if note else ""
        lines += [f"## {heading}{note}", "", *_body(m), ""]
    return "\n".join(lines).rstrip() + "\n"


def _body(message: dict[str, Any]) -> list[str]:
    """A message's text; a reply's thinking (thinking.py) folded in a <details> block above its
    answer, as Markdown viewers show it."""
    text = str(message.get("content", ""))
    split = split_thinking(text) if message.get("role") == "assistant" else None
    if split is None or split.thinking is None:
        return [text.rstrip()]
    summary = thinking_title(split.thinking, split.closed)
    return ["<details>", f"<summary>{summary}</summary>", "", split.thinking, "", "</details>", "",
            split.answer.rstrip()]


def slug(text: str, max_len: int = 40) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (s[:max_len].rstrip("-")) or "conversation"


def export_path(directory: Path, title: str, now: float | None = None) -> Path:
    """A fresh file name in `directory`: adaspark-<slug>-<YYYYmmdd-HHMMSS>[-n].md."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = f"adaspark-{slug(title)}-{stamp}"
    path = directory / f"{base}.md"
    n = 2
    while path.exists():
        path = directory / f"{base}-{n}.md"
        n += 1
    return path


def write_export(directory: Path, title: str, messages: list[dict[str, Any]], model: str | None = None) -> Path:
    """Write `messages` as Markdown (`conversation_markdown`) to a fresh file in `directory`
    (made if missing); returns its path. OSError when it cannot be written."""
    text = conversation_markdown(title, messages, model)
    directory.mkdir(parents=True, exist_ok=True)
    path = export_path(directory, title)
    path.write_text(text, encoding="utf-8")
    return path


def reply_file_name(title: str, now: float | None = None) -> Path:
    """The name a saved reply is offered: reply-<slug of its conversation's title>-<YYYYmmdd-HHMMSS>.md."""
    return Path(f"reply-{slug(title)}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}.md")
