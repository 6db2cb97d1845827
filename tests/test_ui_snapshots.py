"""Snapshot tests (pytest-textual-snapshot) of the chat screen, the help screen and the panel.

The scripted engine (in its own process, as in `adaspark chat`) runs on a synthetic clock and
the store's clock is frozen, so every figure and timestamp on screen is the same on every
machine, except the display's own speed ("on screen", wall-clock by design), which the chat
snapshot pins. After an intended change of the look, review the new SVGs and accept them with
`pytest tests/test_ui_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from adaspark_app.engine.events import RoundEvent
from adaspark_app.store import Store
from adaspark_app.ui.app import AdaSparkApp
from adaspark_app.ui.stats import EngineGauges, SpecStats
from adaspark_app.ui.widgets import SpecPanel
from ui_fakes import scripted, wait_until

pytest.importorskip("pytest_textual_snapshot")

SIZE = (136, 34)  # the sidebar (from 130 columns) and the panel; small (the tree carries the GPU results)
HELP_SIZE = (100, 30)  # its intro and the first keys (the table scrolls); small: the tree carries the GPU results
REPLY = """Two plus two is **4**. In Python:

```python
def add(a: int, b: int) -> int:
    return a + b

print(add(2, 2))  # 4
```

- integers add exactly
- floats may round"""


@pytest.fixture
def frozen_store(tmp_path, monkeypatch):
    import adaspark_app.store.chats as chats
    import adaspark_app.store.db as db

    for module in (db, chats):
        monkeypatch.setattr(module, "now_iso", lambda: "2025-01-31T12:34:56+00:00")
    store = Store.open(tmp_path / "snap.db")
    yield store
    store.close()


def chat_app(store, factory) -> AdaSparkApp:
    return AdaSparkApp(factory, store, model_label="Scripted-135M (test)", store_label="~/adaspark/snap.db",
                       exit_on_load_error=False)


async def steady(pilot) -> None:
    """No blinking cursor: a snapshot must not depend on when in the blink it is taken."""
    app = pilot.app
    await wait_until(pilot, lambda: app.engine.ready)
    app.chat_screen.prompt.cursor_blink = False


async def send_and_finish(pilot, text: str) -> None:
    app = pilot.app
    await steady(pilot)
    app.chat_screen.prompt.text = text
    await pilot.press("enter")
    await wait_until(pilot, lambda: not app.chat_screen.generating, timeout=10)
    stats = app.chat_screen.stats
    stats._shown_first, stats._shown_last = (0.0, 1), (0.5, 41)  # pinned: 80.0 tok/s on screen
    stats._arrived = (0.0, 1)  # the display clock starts at the first text's arrival
    stats.lag_max = 0.04  # pinned: shown within 40 ms
    app.chat_screen.panel.show()
    await pilot.pause(0.1)
    app.clear_notifications()
    await pilot.pause()


def test_chat_screen_after_a_reply(snap_compare, frozen_store):
    """Sidebar with the titled conversation, the rendered reply with a highlighted code block,
    the reply's figures under it, and the panel: rates, widths, acceptance, prices, pricing."""
    seed = frozen_store.create_conversation("An older conversation about Rust", "SmolLM2")
    frozen_store.add_message(seed, "user", "Explain ownership")
    app = chat_app(frozen_store, scripted([REPLY]))
    assert snap_compare(app, terminal_size=SIZE, run_before=lambda pilot: send_and_finish(pilot, "What is 2+2?"))


def test_help_screen(snap_compare, frozen_store):
    app = chat_app(frozen_store, scripted())
    async def open_help(pilot) -> None:
        await steady(pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(app, terminal_size=HELP_SIZE, run_before=open_help)


class PanelHost(App):
    """One SpecPanel with fixed figures, mounted alone (widget-level snapshot)."""

    def compose(self) -> ComposeResult:
        stats = SpecStats()
        stats.set_gauges(EngineGauges(plain_rate=96.0, cold_start=(5, 5), context=400))
        tokens = 1
        widths = [1, 2, 4, 4, 8, 4, 4, 16, 4, 4, 8, 4]
        for i, w in enumerate(widths):
            tokens += min(w, 3)
            stats.add(RoundEvent(
                conversation="c", turn=0, round_index=i + 1, context=400 + tokens, width=w, measured=i == len(widths) - 1,
                verify_ms_predicted=10.0 * w ** 0.8, verify_ms=10.0 * w ** 0.8, fixed_ms=1.0, expected_accepted=2.0,
                accepted=min(w, 3) - 1, committed=min(w, 3), priced_by="fitted",
                rows_by_source={"drafter": w // 2, "ngram": (w - 1) - w // 2, "agreed": 0},
                accepted_by_source={"drafter": min(w, 3) - 1}, offered={1: 10.0, 2: 18.5, 4: 29.0, 8: 48.0, 16: 85.0},
                band_rate=118.0, text="x", reply_tokens=tokens, reply_seconds=0.012 * (i + 1)))
        yield SpecPanel(stats)


def test_speculation_panel(snap_compare):
    assert snap_compare(PanelHost(), terminal_size=(50, 32))  # the whole panel, no more (a small picture)
