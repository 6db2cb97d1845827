"""How long does the chat take to show a long stored conversation? (`chat --continue` on a chat
kept for weeks, or opening it from the list.)

The real app (`AdaSparkApp` under Textual's run_test, 100x30) opens a stored conversation of N
messages (questions and replies of about 40 words with Markdown), timed from the call to
`ChatScreen.open_conversation` to the screen settled. The ways, interleaved per repeat (the order
turns each repeat): `windowed`, the chat's own (`ChatView.show_turns` lays out the last
`SHOWN_AT_OPEN` messages at once; the earlier ones wait until the reader scrolls up), `batched`,
the way before it (every message at once, one layout), and `one-by-one`, the way before that
(each message mounted, laid out and scrolled to on its own).

    python -m benchmarks.ui.open_conversation [--sizes 100,300,1000] [--repeats 3]
        [--ways windowed,batched[,one-by-one]] [--out FILE.md]

The engine is the bundled model's, in its own process as in the chat; opening a conversation
does not use it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from adaspark_app import native
from benchmarks.common import cpu_model, emit_report


def fill(store, n: int) -> str:
    cid = store.create_conversation("a long one", "bundled")
    for i in range(n // 2):
        store.add_message(cid, "user", f"Question number {i}: tell me something about the number {i}.")
        store.add_message(cid, "assistant", f"The number {i} is **interesting** because " + "it is a number. " * 30,
                          {"n_tokens": 200, "tokens_per_s": 150.0})
    return cid


async def one_by_one(view, turns) -> None:
    """ChatView.show_turns as it was: a mount, a layout and a scroll per message."""
    from adaspark_app.ui.conversation import reply_note
    from adaspark_app.ui.widgets.chat_view import context_marks

    await view.clear()
    for turn in turns:
        widget = await view.add_message(turn.role, turn.content,
                                        note=reply_note(turn.meta) if turn.role == "assistant" else "")
        marks = context_marks(turn.meta)
        if marks is not None:
            await view.mark_context(widget, *marks)


async def open_once(n: int, way: str) -> float:
    from adaspark_app.engine.worker import EngineConfig
    from adaspark_app.store import Store
    from adaspark_app.ui.app import AdaSparkApp
    from adaspark_app.ui.widgets import chat_view

    window = chat_view.SHOWN_AT_OPEN
    if way != "windowed":
        chat_view.SHOWN_AT_OPEN = 1 << 30  # every message laid out at once, as before the window

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "chat.db")
        cid = fill(store, n)
        app = AdaSparkApp(EngineConfig(store_path=str(Path(tmp) / "learned.db")), store, store_label="chat.db",
                          export_dir=Path(tmp), exit_on_load_error=False)
        async with app.run_test(size=(100, 30)) as pilot:
            chat = app.chat_screen
            if way == "one-by-one":
                chat.chat_view.show_turns = lambda turns: one_by_one(chat.chat_view, turns)
            started = time.perf_counter()
            await chat.open_conversation(cid)
            await pilot.pause()
            seconds = time.perf_counter() - started
            assert len(chat.chat_view.turns()) == (min(n, window) if way == "windowed" else n)
        store.close()
    chat_view.SHOWN_AT_OPEN = window
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,300,1000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ways", default="windowed,batched",
                    help="the first is the reference: windowed, batched, one-by-one")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    native.activate()
    sizes = [int(s) for s in args.sizes.split(",")]
    ways = args.ways.split(",")
    if len(ways) < 2 or not set(ways) <= {"windowed", "batched", "one-by-one"}:
        ap.error("--ways: two or more of windowed, batched, one-by-one")
    ref, others = ways[0], ways[1:]
    rows = []
    for n in sizes:
        times: dict[str, list[float]] = {w: [] for w in ways}
        for r in range(args.repeats):
            for way in (ways if r % 2 == 0 else ways[::-1]):
                times[way].append(asyncio.run(open_once(n, way)))
        cells = []
        for other in others:
            ratios = [o / b for o, b in zip(times[other], times[ref])]
            cells.append(f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]")
        rows.append((n, cells, statistics.median(times[ref]) * 1e3))
        print(f"{n} messages: " + ", ".join(f"{o} / {ref} {c}" for o, c in zip(others, cells)), flush=True)
    lines = [f"# Opening a stored conversation of N messages: {ref} against {', '.join(others)}", "",
             f"- command: `python -m benchmarks.ui.open_conversation --sizes {args.sizes} --repeats {args.repeats}"
             f" --ways {args.ways}`",
             f"- machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
             "", "| messages | " + " | ".join(f"{o} / {ref}, median [min, max] over repeats" for o in others)
             + f" | {ref}, ms to open (median) |",
             "|---|" + "---|" * len(others) + "---|"]
    lines += [f"| {n} | " + " | ".join(cells) + f" | {ms:.0f} |" for n, cells, ms in rows]
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
