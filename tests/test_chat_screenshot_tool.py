"""tools/chat_screenshot.py's compact SVG: the same picture, smaller (the tree has a size budget)."""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console
from rich.text import Text

from tools.chat_screenshot import compact_svg

ROOT = Path(__file__).resolve().parent.parent


def rich_svg() -> str:
    console = Console(record=True, width=40, force_terminal=True, color_system="truecolor")
    console.print(Text("on blue", style="white on blue"), Text(" plain "), Text("bold red", style="bold red"))
    console.print(Text("second line on green", style="on green"))
    return console.export_svg(title="t")


def elements(svg: str) -> list[str]:
    return re.findall(r"<(rect|text|clipPath|g|circle)\b", svg)


def test_the_compact_svg_keeps_every_element_and_reference():
    svg = rich_svg()
    small = compact_svg(svg)
    assert len(small) < 0.9 * len(svg)
    assert elements(small) == elements(svg)
    assert "crispEdges\"" not in small and "g rect { shape-rendering: crispEdges; }" in small
    crisp = len(re.findall(r"<rect[^>]*crispEdges", svg))
    inside_g = sum(len(re.findall(r"<rect", g)) for g in re.findall(r"<g\b.*?</g>", svg, re.S))
    assert crisp == inside_g > 0  # the rule reaches exactly the rects that had the attribute
    def undefined(text: str) -> set[str]:  # Rich itself refers to one line's clip it does not define
        return set(re.findall(r"url\(#([^)]+)\)", text)) - set(re.findall(r'id="([^"]+)"', text))

    prefix = re.search(r"terminal-\d+-", svg).group(0)
    assert undefined(small) == {ref.replace(prefix, "t-") for ref in undefined(svg)}
    assert all(i.startswith("t-") for i in re.findall(r'id="([^"]+)"', small))


def test_the_readmes_picture_is_compact():
    svg = (ROOT / "docs" / "chat.svg").read_text(encoding="utf-8")
    assert compact_svg(svg) == svg
