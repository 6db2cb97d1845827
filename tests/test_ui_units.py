"""The UI's pure parts: panel figures, stream batching, the engine holder, Markdown export."""

from __future__ import annotations

import threading
import time

import pytest
from rich.console import Console

from adaspark_app.engine.events import RoundEvent
from adaspark_app.errors import ModelLoadError
from adaspark_app.ui.export import conversation_markdown, export_path, slug
from adaspark_app.ui.stats import RECENT_ROUNDS, EngineGauges, SpecStats, is_verify_round
from adaspark_app.ui.streaming import EngineHolder, StreamBatcher
from adaspark_app.ui.testing import ScriptedEngine
from adaspark_app.ui.widgets.spec_panel import hbar, render_panel


def ev(i: int, *, width: int = 4, committed: int = 2, tokens: int = 0, seconds: float = 0.0, text: str = "x",
       verify_ms: float = 20.0, priced_by: str = "fitted", rows=None, acc=None, offered=None, context: int = 100,
       measured: bool = False) -> RoundEvent:
    return RoundEvent(conversation="c", turn=0, round_index=i, context=context, width=width, measured=measured,
                      verify_ms_predicted=verify_ms, verify_ms=verify_ms, fixed_ms=1.0, expected_accepted=1.0,
                      accepted=committed - 1, committed=committed, priced_by=priced_by,
                      rows_by_source=rows or {}, accepted_by_source=acc or {}, offered=offered or {},
                      text=text, reply_tokens=tokens, reply_seconds=seconds)


def render_text(stats: SpecStats) -> str:
    console = Console(width=44, record=True, color_system=None)
    console.print(render_panel(stats))
    return console.export_text()


# ---------------------------------------------------------------------------- SpecStats
def test_prefill_token_is_not_a_round():
    """The engine reports the prefill's token with no verify time; it must not count as a round."""
    s = SpecStats()
    s.add(ev(0, width=1, committed=1, tokens=1, seconds=0.0, verify_ms=0.0, priced_by="none"))
    assert not is_verify_round(ev(0, verify_ms=0.0))
    assert s.rounds == 0 and s.width_histogram() == []
    s.add(ev(1, width=4, committed=3, tokens=4, seconds=0.05))
    assert s.rounds == 1 and s.width_histogram() == [(4, 1)]
    assert s.tokens_per_round == pytest.approx(3.0)


def test_rates_speedup_and_tokens_per_round():
    s = SpecStats()
    s.set_gauges(EngineGauges(plain_rate=50.0))
    tokens = 1
    for i in range(1, 11):
        tokens += 3
        s.add(ev(i, committed=3, tokens=tokens, seconds=0.05 * i))
    assert s.reply_rate == pytest.approx(31 / 0.5)
    assert s.speedup == pytest.approx((31 / 0.5) / 50.0)
    assert s.tokens_per_round == pytest.approx(3.0)
    assert s.width_now == 4


def test_now_rate_follows_the_last_second_not_the_whole_reply():
    """A reply that was slow and is now fast: 'now' shows the recent rate, 'reply' the average."""
    s = SpecStats()
    tokens, t = 0, 0.0
    for i in range(10):  # 10 tokens/s for 2 s
        tokens += 2
        t += 0.2
        s.add(ev(i + 1, committed=2, tokens=tokens, seconds=t))
    for i in range(40):  # then 100 tokens/s for 2 s
        tokens += 5
        t += 0.05
        s.add(ev(i + 11, committed=5, tokens=tokens, seconds=t))
    assert s.now_rate == pytest.approx(100.0, rel=0.05)
    assert s.reply_rate == pytest.approx(tokens / t)
    assert s.reply_rate < 70


def test_histogram_keeps_recent_rounds_across_replies_and_acceptance_is_per_reply():
    s = SpecStats()
    for i in range(RECENT_ROUNDS):
        s.add(ev(i + 1, width=8, rows={"drafter": 7}, acc={"drafter": 1}))
    s.start_reply()
    for i in range(10):
        s.add(ev(i + 1, width=2, rows={"ngram": 1, "agreed": 0}, acc={"ngram": 1}))
    assert dict(s.width_histogram()) == {8: RECENT_ROUNDS - 10, 2: 10}
    acc = s.acceptance()
    assert (acc["drafter"].accepted, acc["drafter"].rows) == (0, 0)
    assert (acc["ngram"].accepted, acc["ngram"].rows) == (10, 10)
    assert acc["ngram"].share == 1.0 and acc["drafter"].share is None


def test_prices_come_from_the_round_else_from_the_engine_table():
    s = SpecStats()
    s.set_gauges(EngineGauges(prices_ms={1: 10.0, 4: 30.0}, context=7))
    assert s.prices_ms() == {1: 10.0, 4: 30.0} and s.context == 7
    s.add(ev(1, offered={8: 50.0, 1: 11.0}, context=120))
    assert list(s.prices_ms().items()) == [(1, 11.0), (8, 50.0)]
    assert s.context == 120


def test_panel_shows_every_figure():
    s = SpecStats()
    s.set_gauges(EngineGauges(plain_rate=80.0, cold_start=(2, 7)))
    s.add(ev(0, width=1, committed=1, tokens=1, verify_ms=0.0, priced_by="none"))
    s.add(ev(1, width=4, committed=3, tokens=4, seconds=0.04, rows={"drafter": 2, "ngram": 1},
             acc={"drafter": 2}, offered={1: 9.5, 4: 28.0}, priced_by="head", context=321))
    text = render_text(s)
    for needle in ("tok/s now", "100.0", "speedup", "1.25×", "tok/round", "3.00", "width now",
                   "Widths, last", "drafter", "2/2", "n-gram", "0/1", "agreed", "0/0",
                   "Verify price at context 321", "9.5", "28.0", "◀", "head-based estimate",
                   "2/7 widths measured"):
        assert needle in text, needle


def test_hbar_scales_with_eighths():
    assert hbar(0, 10, 8) == " " * 8
    assert hbar(10, 10, 8) == "█" * 8
    assert hbar(5, 10, 8) == "████    "
    assert hbar(1, 16, 2) == "▏ "


# ---------------------------------------------------------------------------- StreamBatcher
def test_batcher_emits_first_event_at_once_then_every_interval():
    now = [0.0]
    batches: list[tuple[str, int]] = []
    b = StreamBatcher(lambda text, events: batches.append((text, len(events))), interval=0.04, clock=lambda: now[0],
                      use_timer=False)
    b.add(ev(0, text="a"))
    assert batches == [("a", 1)]
    for i, t in enumerate([0.01, 0.02, 0.03]):
        now[0] = t
        b.add(ev(i + 1, text="b"))
    assert len(batches) == 1
    now[0] = 0.041
    b.add(ev(9, text="c"))
    assert batches[-1] == ("bbbc", 4)
    now[0] = 0.05
    b.add(ev(10, text="d"))
    b.flush()
    assert batches[-1] == ("d", 1) and b.batches == 3
    b.flush()
    assert b.batches == 3  # nothing pending: no empty batch


def test_batcher_timer_flushes_text_when_no_round_follows():
    """A slow round must not hold back text already released by the previous one."""
    batches: list[str] = []
    b = StreamBatcher(lambda text, events: batches.append(text), interval=0.03)
    b.add(ev(0, text="first"))
    b.add(ev(1, text=" second"))  # within the interval: held for the timer
    assert batches == ["first"]
    deadline = time.monotonic() + 2.0
    while len(batches) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert batches == ["first", " second"]
    b.add(ev(2, text=" dropped"))
    b.discard()
    time.sleep(0.06)
    assert batches == ["first", " second"]


# ---------------------------------------------------------------------------- EngineHolder
def test_holder_hands_the_engine_to_a_waiting_thread():
    holder = EngineHolder(lambda: ScriptedEngine(load_seconds=0.05))
    got = []
    waiter = threading.Thread(target=lambda: got.append(holder.wait()))
    waiter.start()
    loader = threading.Thread(target=holder.load)
    loader.start()
    loader.join(2)
    waiter.join(2)
    assert isinstance(got[0], ScriptedEngine)
    assert holder.close() and got[0].closed


def test_holder_reraises_the_load_error_and_wait_can_be_cancelled():
    def fail():
        raise ModelLoadError("model file x.gguf is not a GGUF")

    holder = EngineHolder(fail)
    cancel = threading.Event()
    cancel.set()
    assert holder.wait(cancel, poll_s=0.01) is None
    with pytest.raises(ModelLoadError):
        holder.load()
    with pytest.raises(ModelLoadError, match="x.gguf"):
        holder.wait()


def test_holder_close_waits_for_a_running_reply():
    engine = ScriptedEngine()
    holder = EngineHolder(lambda: engine)
    holder.load()
    release = threading.Event()

    def reply():
        with holder.busy:
            release.wait(2)

    t = threading.Thread(target=reply)
    t.start()
    time.sleep(0.02)
    assert holder.close(timeout=0.05) is False and not engine.closed
    release.set()
    t.join(2)
    assert holder.close(timeout=1) is True and engine.closed


# ---------------------------------------------------------------------------- export
def test_markdown_export_has_every_message_and_reply_figures(tmp_path):
    md = conversation_markdown("Sum question", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "It is 4.", "meta": {"n_tokens": 5, "tokens_per_s": 99.0}},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "It is", "meta": {"n_tokens": 2, "stopped": True}},
    ], model="SmolLM2")
    assert md.startswith("# Sum question\n")
    assert md.index("What is 2+2?") < md.index("It is 4.") < md.index("And 3+3?")
    assert "## Assistant (5 tokens, 99.0 tok/s)" in md and "(2 tokens, stopped)" in md
    assert "*Model: SmolLM2*" in md
    p1 = export_path(tmp_path, "Sum question?", now=0)
    p1.write_text(md)
    p2 = export_path(tmp_path, "Sum question?", now=0)
    assert p1.name.startswith("adaspark-sum-question-") and p2 != p1
    assert slug("!!!") == "conversation"
