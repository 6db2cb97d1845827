"""The UI's pure parts: panel figures, the engine process's batching and cancel flag, export."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaspark_app.engine.events import ReplyResult, RoundEvent
from adaspark_app.engine.worker import CancelFlag, EngineConfig, EventBatcher, read_gauges
from adaspark_app.ui.export import conversation_markdown, export_path, slug
from adaspark_app.ui.stats import PLAIN_SEEN_MIN, RECENT_ROUNDS, EngineGauges, SpecStats, gauges_from, is_verify_round
from adaspark_app.ui.widgets.spec_panel import hbar
from ui_fakes import ScriptedEngine, panel_text


def ev(i: int, *, width: int = 4, committed: int = 2, tokens: int = 0, seconds: float = 0.0, text: str = "x",
       verify_ms: float = 20.0, priced_by: str = "fitted", rows=None, acc=None, offered=None, context: int = 100,
       measured: bool = False, prefill: bool = False) -> RoundEvent:
    return RoundEvent(conversation="c", turn=0, round_index=i, context=context, width=width, measured=measured,
                      verify_ms_predicted=verify_ms, verify_ms=verify_ms, fixed_ms=1.0, expected_accepted=1.0,
                      accepted=committed - 1, committed=committed, priced_by=priced_by,
                      rows_by_source=rows or {}, accepted_by_source=acc or {}, offered=offered or {},
                      text=text, reply_tokens=tokens, reply_seconds=seconds, prefill=prefill)


def render_text(stats: SpecStats) -> str:
    return panel_text(stats)


# ---------------------------------------------------------------------------- SpecStats
def test_prefill_token_is_not_a_round():
    """The engine flags the prefill's token (RoundEvent.prefill); it must not count as a round,
    while a real width-1 round whose verify timed at 0 ms still does."""
    s = SpecStats()
    s.add(ev(0, width=1, committed=1, tokens=1, seconds=0.0, verify_ms=0.0, priced_by="none", prefill=True))
    assert not is_verify_round(ev(0, verify_ms=0.0, prefill=True))
    assert is_verify_round(ev(1, width=1, verify_ms=0.0))
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


def test_speedup_is_over_the_plain_steps_seen_once_there_are_enough_of_them():
    """The cost model prices a plain step near its best time; the panel's plain rate is the recent
    plain rounds' own (forward and host time) once PLAIN_SEEN_MIN of them ran, so a reply of plain
    steps reads 1.00x, not the 0.74x it read against the price."""
    s = SpecStats()
    s.set_gauges(EngineGauges(plain_rate=88.0))  # 11.4 ms priced; the steps take 14 + 1 ms
    tokens, t = 1, 0.0
    for i in range(1, PLAIN_SEEN_MIN):
        tokens, t = tokens + 1, t + 0.015
        s.add(ev(i, width=1, committed=1, tokens=tokens, seconds=t, verify_ms=14.0, priced_by="none"))
    assert s.plain_rate == 88.0 and s.speedup == pytest.approx((tokens / t) / 88.0)  # too few: the price
    s.add(ev(PLAIN_SEEN_MIN, width=4, committed=3, tokens=tokens + 3, seconds=t + 0.020))  # a tree round
    s.add(ev(PLAIN_SEEN_MIN + 1, width=1, committed=1, tokens=tokens + 4, seconds=t + 0.020, verify_ms=14.0,
             priced_by="fitted"))  # a tree priced and verified at one row: not a plain step
    assert s.plain_rate == 88.0
    tokens, t = tokens + 4, t + 0.020
    s.add(ev(PLAIN_SEEN_MIN + 2, width=1, committed=1, tokens=tokens + 1, seconds=t + 0.015, verify_ms=14.0,
             priced_by="none"))
    assert s.plain_rate == pytest.approx(1 / 0.015)
    s.start_reply()  # a new reply keeps what plain steps cost here
    s.add(ev(1, width=1, committed=1, tokens=1, seconds=0.015, verify_ms=14.0, priced_by="none"))
    assert s.plain_rate == pytest.approx(1 / 0.015) and s.speedup == pytest.approx(1.0)
    assert "1.00×" in render_text(s) and "66.7" in render_text(s)


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
    s.add(ev(0, width=1, committed=1, tokens=1, verify_ms=0.0, priced_by="none", prefill=True))
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


# ---------------------------------------------------------------------------- the two speeds
def test_reply_rate_becomes_the_engines_figure_and_shown_rate_is_wall_clock():
    """Live: tokens over the engine's decode seconds; at the end the engine's own ReplyResult
    figure (what `adaspark run` reports); 'on screen' from the display's own clock."""
    s = SpecStats()
    s.add(ev(1, committed=3, tokens=30, seconds=0.5))
    assert s.reply_rate == pytest.approx(60.0)
    assert s.shown_rate is None
    s.shown(100.0, 4)
    assert s.shown_rate is None  # one point is no interval
    s.shown(100.5, 29)
    assert s.shown_rate == pytest.approx(50.0)
    s.finish(tokens_per_s=61.5, n_tokens=31)
    assert s.reply_rate == 61.5 and s.reply_tokens == 31
    text = render_text(s)
    assert "61.5" in text and "50.0" in text and "on screen" in text
    s.start_reply()
    assert s.reply_rate is None and s.shown_rate is None


def test_display_lag_is_the_longest_any_text_waited_between_its_production_and_its_showing():
    s = SpecStats()
    assert s.lag_max is None
    s.arrived(10.0, 5)  # produced at 10.0 and 10.1, both drawn at 10.3: waited 0.3 s at most
    s.arrived(10.1, 9)
    s.shown(10.3, 9)
    assert s.lag_max == pytest.approx(0.3)
    s.arrived(10.5, 14)  # a quick one does not lower it
    s.shown(10.55, 14)
    assert s.lag_max == pytest.approx(0.3)
    s.arrived(11.0, 20)  # a starved display: produced at 11.0, drawn at 12.6
    s.shown(12.6, 20)
    assert s.lag_max == pytest.approx(1.6)
    assert "shown within" in render_text(s) and "1600 ms" in render_text(s)
    s.shown(12.7, 20)  # a frame with no new text changes nothing
    assert s.lag_max == pytest.approx(1.6)
    s.start_reply()
    assert s.lag_max is None


# ---------------------------------------------------------------------------- engine process parts
def test_event_batcher_sends_the_first_round_at_once_then_every_interval():
    now = [0.0]
    batches: list[tuple[str, list[float]]] = []
    b = EventBatcher(lambda events, times: batches.append(("".join(e.text for e in events), times)),
                     interval=0.05, clock=lambda: now[0], flusher=False)
    b.add(ev(0, text="a"))
    assert batches == [("a", [0.0])]
    for i, t in enumerate([0.01, 0.02, 0.03]):
        now[0] = t
        b.add(ev(i + 1, text="b"))
    assert len(batches) == 1
    now[0] = 0.051
    b.add(ev(9, text="c"))
    assert batches[-1] == ("bbbc", [0.01, 0.02, 0.03, 0.051])
    now[0] = 0.06
    b.add(ev(10, text="d"))
    assert len(batches) == 2
    b.flush()
    assert batches[-1] == ("d", [0.06]) and b.batches == 3
    b.flush()
    assert b.batches == 3  # nothing pending: no empty batch


def test_event_batcher_does_not_hold_text_behind_a_slow_round():
    """Rounds that ended within the interval go out once it has passed, round or no round."""
    batches: list[str] = []
    b = EventBatcher(lambda events, times: batches.append("".join(e.text for e in events)), interval=0.03)
    try:
        b.add(ev(0, text="first"))
        b.add(ev(1, text=" second"))  # within the interval: waits for the flusher
        assert batches == ["first"]
        deadline = time.monotonic() + 5.0
        while len(batches) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert batches == ["first", " second"]
    finally:
        b.close()
    b.add(ev(2, text=" late"))  # closed: the flusher is gone, an explicit flush still sends
    time.sleep(0.06)
    assert batches == ["first", " second"]
    b.flush()
    assert batches[-1] == " late"


def test_cancel_flag_is_shared_with_a_spawned_process():
    ctx = multiprocessing.get_context("spawn")
    flag = CancelFlag(ctx)
    assert not flag.is_set()
    flag.set()
    p = ctx.Process(target=_exit_with_flag, args=(flag,))
    p.start()
    p.join(30)
    assert p.exitcode == 1
    flag.clear()
    p = ctx.Process(target=_exit_with_flag, args=(flag,))
    p.start()
    p.join(30)
    assert p.exitcode == 0


def _exit_with_flag(flag: CancelFlag) -> None:
    raise SystemExit(1 if flag.is_set() else 0)


def test_events_results_and_the_engine_config_cross_a_pipe():
    """Everything the protocol sends is picklable (the engine process is spawned)."""
    e = ev(3, rows={"drafter": 2}, acc={"drafter": 1}, offered={1: 9.0, 4: 20.0})
    r = ReplyResult("c", 0, "text", 4, 0.1, 0.01, 10, 14, 2, {4: 2}, 1, {"drafter": 2}, {"drafter": 1},
                    False, False, "adaspark")
    cfg = EngineConfig(model_path="/m.gguf", store_path="/s.db", n_ctx=256)
    assert pickle.loads(pickle.dumps(e)) == e
    assert pickle.loads(pickle.dumps(r)) == r
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_gauges_read_in_the_engine_process_arrive_as_panel_gauges():
    engine = ScriptedEngine()
    d = read_gauges(engine, 42)
    g = gauges_from(pickle.loads(pickle.dumps(d)))
    assert g == EngineGauges(plain_rate=None, cold_start=(0, 4),
                             prices_ms={1: 10.0, 2: 18.5, 4: 29.0, 8: 48.0}, context=42)
    assert gauges_from(None) is None

    class Broken:
        def plain_rate(self, context):
            raise RuntimeError("not yet")

    assert read_gauges(Broken(), 0) is None


# ---------------------------------------------------------------------------- export
def test_markdown_export_has_every_message_and_reply_figures(tmp_path):
    md = conversation_markdown("Sum question", [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "It is 4.", "meta": {"n_tokens": 5, "tokens_per_s": 99.0}},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "It is", "meta": {"n_tokens": 2, "stopped": True}},
        {"role": "user", "content": "And 4+4?"},
        {"role": "assistant", "content": "8", "meta": {"n_tokens": 1, "tokens_per_s": "fast", "rounds": 1}},
        {"role": "assistant", "content": "From elsewhere", "meta": [1, 2]},
    ], model="SmolLM2")
    assert md.startswith("# Sum question\n")
    assert md.index("What is 2+2?") < md.index("It is 4.") < md.index("And 3+3?")
    assert "## Assistant (5 tokens, 99.0 tok/s)" in md and "(2 tokens, stopped)" in md
    assert "## Assistant (1 token, 1 round)\n" in md  # a value of another type is left out
    assert "## Assistant\n\nFrom elsewhere" in md
    assert "*Model: SmolLM2*" in md
    p1 = export_path(tmp_path, "Sum question?", now=0)
    p1.write_text(md)
    p2 = export_path(tmp_path, "Sum question?", now=0)
    assert p1.name.startswith("adaspark-sum-question-") and p2 != p1
    assert slug("!!!") == "conversation"


PRIORITY_SCRIPT = """
import json, multiprocessing, os, sys, threading
from adaspark_app.ui.engine_client import lower_ui_priority

def child(q):
    q.put((os.nice(0), os.sched_getscheduler(0)))

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    go, done = threading.Event(), {}

    def early():  # made before the priority drops, like the engine-io thread
        go.wait()
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        done["early_child"] = q.get(timeout=60)
        p.join()
        done["early"] = (os.nice(0), os.sched_getscheduler(0))

    t = threading.Thread(target=early)
    t.start()
    applied = lower_ui_priority(sys.argv[1])
    later = {}
    u = threading.Thread(target=lambda: later.update(v=(os.nice(0), os.sched_getscheduler(0))))
    u.start(); u.join()
    go.set(); t.join()
    print(json.dumps({"applied": applied, "main": [os.nice(0), os.sched_getscheduler(0)],
                      "later": later["v"], "early": done["early"], "early_child": done["early_child"],
                      "idle": getattr(os, "SCHED_IDLE", None), "other": os.SCHED_OTHER}))
"""


@pytest.mark.parametrize("env", [None, "", "bogus", "NORMAL"])
def test_the_ui_keeps_normal_priority_by_default_and_for_unknown_values(tmp_path, env):
    """No ADASPARK_UI_PRIORITY (or an empty or unknown one) leaves the UI's niceness alone."""
    code = ("import json, os; from adaspark_app.ui.engine_client import lower_ui_priority; "
            "before = os.nice(0); print(json.dumps([lower_ui_priority(), before, os.nice(0)]))")
    environ = {k: v for k, v in os.environ.items() if k != "ADASPARK_UI_PRIORITY"}
    if env is not None:
        environ["ADASPARK_UI_PRIORITY"] = env
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    applied, before, after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert applied == "normal" and after == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
@pytest.mark.parametrize("priority", ["low", "idle"])
def test_the_ui_lowers_only_its_own_threads_and_the_engine_keeps_normal_priority(tmp_path, priority):
    """What the chat relies on: lowering the UI thread's priority reaches threads it makes later,
    not the io thread made before, nor the engine processes that thread spawns."""
    script = tmp_path / "prio.py"
    script.write_text(PRIORITY_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), priority], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    base = os.nice(0)
    policy = out["idle"] if priority == "idle" else out["other"]
    assert out["applied"] == priority
    assert out["main"] == [min(base + 19, 19), policy] and out["later"] == out["main"]
    assert out["early"] == [base, out["other"]]
    assert out["early_child"] == [base, out["other"]]


def test_the_display_speed_counts_from_the_texts_arrival_not_its_first_showing():
    """A reply whose frames were held back and drawn late, in two frames 10 ms apart, delivered
    its text over 2 s from the first batch's arrival: that is the speed the user saw, not the
    thousands of tokens a second that timing the two frames alone would give."""
    s = SpecStats()
    s.start_reply()
    s.arrived(100.0, 5)
    s.arrived(101.0, 120)  # later batches do not move the start
    s.shown(101.99, 150)
    s.shown(102.0, 205)
    assert s.shown_rate == pytest.approx((205 - 5) / 2.0)
    s.start_reply()  # a new reply forgets the old start
    s.shown(200.0, 10)
    s.shown(201.0, 60)
    assert s.shown_rate == pytest.approx(50.0)


def test_the_engine_log_starts_afresh_once_it_is_large(tmp_path):
    """Every chat appends to the engine's log: past ENGINE_LOG_MAX_BYTES it moves aside (one old
    log kept) instead of growing for ever."""
    from adaspark_app.ui.app import ENGINE_LOG_MAX_BYTES, engine_log_path

    log = tmp_path / "engine.log"
    log.write_bytes(b"small\n")
    assert engine_log_path(tmp_path) == str(log) and log.read_bytes() == b"small\n"
    (tmp_path / "engine.log.1").write_bytes(b"oldest\n")
    log.write_bytes(b"x" * (ENGINE_LOG_MAX_BYTES + 1))
    assert engine_log_path(tmp_path) == str(log)
    assert not log.exists() and (tmp_path / "engine.log.1").stat().st_size == ENGINE_LOG_MAX_BYTES + 1
    (tmp_path / "file").write_text("")
    assert engine_log_path(tmp_path / "file" / "logs") is None  # cannot be made: the output is dropped
