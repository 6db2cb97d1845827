"""The README's picture of the chat: the real app, the bundled model, one question, saved as SVG.

    python tools/chat_screenshot.py [--out docs/chat.svg] [--question TEXT ...] [--max-tokens N]

Runs `adaspark chat` headless (Textual's run_test) on a fresh store, sends each message in turn,
waiting for each reply to end, and saves the screen (Textual's SVG screenshot). The default asks for
a poem and then for the poem again, a reply that repeats the conversation, where speculation pays. Greedy, so the reply is the same
on every machine that runs the same kernels; the panel's figures are this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from pathlib import Path

from adaspark_app import native

QUESTIONS = ("Write a short poem about the sea, in four lines.",
             "Now write the poem again exactly as it is, and then give it a title.")


def compact_svg(svg: str) -> str:
    """Rich's SVG, drawn the same and a quarter smaller (the tracked tree has a size budget):
    its per-export prefix (`terminal-186477809-`, 500 times) shortened to `t-`, the
    `shape-rendering="crispEdges"` of each cell's background rect said once in the style (every
    such rect sits in a `<g>`; the window's frame and the clip paths do not), and the indentation
    dropped."""
    prefix = re.search(r"terminal-\d+-", svg)
    if prefix:
        svg = svg.replace(prefix.group(0), "t-")
    if ' shape-rendering="crispEdges"' in svg:
        svg = svg.replace(' shape-rendering="crispEdges"', "")
        svg = svg.replace("</style>", "g rect { shape-rendering: crispEdges; }\n</style>", 1)
    return re.sub(r"\n[ \t]+", "\n", svg)


async def shoot(out: Path, questions: list[str], max_tokens: int, size: tuple[int, int], hide_sidebar: bool) -> None:
    from adaspark_app.engine.sampling import SamplingSettings
    from adaspark_app.engine.worker import EngineConfig
    from adaspark_app.store import Store
    from adaspark_app.ui.app import AdaSparkApp

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "chats.db")
        app = AdaSparkApp(EngineConfig(store_path=str(Path(tmp) / "learned.db")), store, store_label="chats.db",
                          export_dir=Path(tmp), max_tokens=max_tokens, exit_on_load_error=False,
                          sampling=SamplingSettings(temperature=0.0))
        async with app.run_test(size=size) as pilot:
            chat = app.chat_screen
            await pilot.pause()
            chat.sidebar.display = not hide_sidebar  # as asked, whatever the width's own fit chose
            for question in questions:
                chat.prompt.text = question
                chat.prompt.focus()
                await pilot.press("enter")
                deadline = time.monotonic() + 600
                await pilot.pause(1.0)
                while chat.generating and time.monotonic() < deadline:
                    await pilot.pause(0.5)
                await pilot.pause(1.0)
            out.write_text(compact_svg(app.export_screenshot()), encoding="utf-8")
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/chat.svg")
    ap.add_argument("--question", action="append", help="a message to send (repeat for more turns; "
                    "default: a poem, then the poem again)")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--width", type=int, default=104)
    ap.add_argument("--height", type=int, default=30)
    ap.add_argument("--sidebar", action="store_true", help="keep the conversations sidebar in the picture")
    args = ap.parse_args()
    native.activate()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(shoot(out, args.question or list(QUESTIONS), args.max_tokens, (args.width, args.height), not args.sidebar))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
