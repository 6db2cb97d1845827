"""Test support for the UI: a scripted engine with ChatEngine's interface, and a polling helper.

`ScriptedEngine` emits RoundEvents like the real engine (a prefill token first, then verify
rounds with widths, sources and offered prices) on a synthetic clock, so the panel's figures are
the same on every machine and snapshot tests are stable. It sleeps a little per round so the UI
sees a real stream.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Callable

from ..engine.events import ReplyResult, RoundEvent
from ..errors import AdaSparkError

TOKEN_RE = re.compile(r"\s*\S+|\s+")
PRICES_S = {1: 0.010, 2: 0.0185, 4: 0.029, 8: 0.048}  # verify seconds by width (DESIGN.md ratios)
ROUND_S = 0.02  # synthetic decode seconds per round


class ScriptedEngine:
    """Same interface as `ChatEngine`; replies come from `replies` in turn (the last one repeats)."""

    def __init__(self, replies: list[str] | None = None, *, round_sleep: float = 0.002,
                 committed: tuple[int, ...] = (2, 3, 1, 4), widths: tuple[int, ...] = (4, 8, 1, 4),
                 fail: AdaSparkError | None = None, fail_after_rounds: int = 0,
                 hold_after_rounds: int | None = None, model_name: str = "Scripted-135M (test)",
                 drafter_name: str | None = None, load_seconds: float = 0.0) -> None:
        if load_seconds:
            time.sleep(load_seconds)
        self.replies = list(replies or ["Hello! I am a **scripted** reply."])
        self.round_sleep = round_sleep
        self.committed = committed
        self.widths = widths
        self.fail = fail
        self.fail_after_rounds = fail_after_rounds
        self.hold_after_rounds = hold_after_rounds
        self.model_name = model_name
        self.drafter_name = drafter_name
        self.calls: list[tuple[str, list[dict[str, str]]]] = []
        self.threads: list[str] = []
        self.turns: list[int] = []
        self.rounds_total = 0
        self.held = threading.Event()  # set while a reply waits at hold_after_rounds
        self.gate = threading.Event()  # set by a test to let a held reply go on
        self.closed = False

    # ------------------------------------------------------------------ ChatEngine interface
    def generate(self, conversation_id: str, messages: list[dict[str, str]], max_tokens: int = 512,
                 on_round: Callable[[RoundEvent], None] | None = None,
                 cancel: threading.Event | None = None, turn: int = 0) -> ReplyResult:
        if self.closed:
            raise RuntimeError("engine is closed")
        self.calls.append((conversation_id, [dict(m) for m in messages]))
        self.turns.append(turn)
        self.threads.append(threading.current_thread().name)
        reply = self.replies[min(len(self.calls) - 1, len(self.replies) - 1)]
        pieces = TOKEN_RE.findall(reply)[:max_tokens]
        context = sum(len(m["content"]) for m in messages) // 4 + 8
        emitted: list[str] = []
        seconds = 0.0
        stopped = False
        widths: dict[int, int] = {}
        rows: dict[str, int] = {"drafter": 0, "ngram": 0, "agreed": 0}
        accepted_src: dict[str, int] = {"drafter": 0, "ngram": 0, "agreed": 0}
        i = 0
        r = 0
        while i < len(pieces):
            if cancel is not None and cancel.is_set():
                stopped = True
                break
            if self.fail is not None and r >= self.fail_after_rounds:
                raise self.fail
            if self.hold_after_rounds is not None and r == self.hold_after_rounds:
                # Wait, as a slow round would, until the test releases the gate or the UI cancels.
                self.held.set()
                deadline = time.monotonic() + 10.0
                while not self.gate.is_set() and not (cancel is not None and cancel.is_set()):
                    if time.monotonic() > deadline:
                        raise RuntimeError("scripted engine held for a release that never came")
                    time.sleep(0.002)
                self.held.clear()
                if cancel is not None and cancel.is_set():
                    stopped = True
                    break
            if r == 0:  # the prefill's token, reported like the real engine does
                n, width, verify_ms = 1, 1, 0.0
            else:
                n = self.committed[(r - 1) % len(self.committed)]
                width = self.widths[(r - 1) % len(self.widths)]
                n = max(1, min(n, width, len(pieces) - i))
                verify_ms = PRICES_S[width] * 1e3 if width in PRICES_S else width * 6.0
                seconds += ROUND_S
            chunk = pieces[i:i + n]
            i += n
            emitted.extend(chunk)
            ev_rows, ev_acc = self._sources(width, n - 1)
            if verify_ms > 0:
                widths[width] = widths.get(width, 0) + 1
                self.rounds_total += 1
                for s in rows:
                    rows[s] += ev_rows.get(s, 0)
                    accepted_src[s] += ev_acc.get(s, 0)
            if on_round is not None:
                on_round(RoundEvent(
                    conversation=conversation_id, turn=turn, round_index=r, context=context + i, width=width,
                    measured=verify_ms > 0 and self.rounds_total <= 2, verify_ms_predicted=verify_ms or None,
                    verify_ms=verify_ms, fixed_ms=1.0 if verify_ms else 0.0, expected_accepted=max(n - 1, 0) + 0.3,
                    accepted=max(n - 1, 0), committed=n,
                    priced_by=("head" if self.rounds_total <= 4 else "fitted") if verify_ms else "none",
                    rows_by_source=ev_rows, accepted_by_source=ev_acc,
                    offered={w: s * 1e3 for w, s in PRICES_S.items()} if verify_ms else {},
                    band_rate=90.0 if verify_ms else None, text="".join(chunk), reply_tokens=i,
                    reply_seconds=seconds))
            r += 1
            if self.round_sleep:
                time.sleep(self.round_sleep)
        return ReplyResult(
            conversation=conversation_id, turn=turn, text="".join(emitted), n_tokens=len(emitted),
            decode_s=seconds, prefill_s=0.001, prompt_tokens=context, context=context + len(emitted),
            rounds=sum(widths.values()), widths=widths, measure_rounds=min(self.rounds_total, 2),
            rows_by_source=rows, accepted_by_source=accepted_src, looped=len(pieces) >= max_tokens,
            stopped=stopped, arm="adaspark")

    @staticmethod
    def _sources(width: int, accepted: int) -> tuple[dict[str, int], dict[str, int]]:
        """Split a round's width-1 draft rows and its accepted tokens over the three sources."""
        if width <= 1:
            return {}, {}
        drafts = width - 1
        agreed = drafts // 3
        ngram = (drafts - agreed) // 2
        rows = {"agreed": agreed, "ngram": ngram, "drafter": drafts - agreed - ngram}
        acc: dict[str, int] = {}
        left = accepted
        for s in ("agreed", "drafter", "ngram"):
            take = min(left, rows[s])
            acc[s] = take
            left -= take
        return rows, acc

    def price_table(self, context: int) -> dict[int, float]:
        return dict(PRICES_S)

    def plain_rate(self, context: int) -> float | None:
        return 1.0 / PRICES_S[1] if self.rounds_total else None

    def cold_start_progress(self) -> tuple[int, int]:
        return (min(self.rounds_total, len(PRICES_S)), len(PRICES_S))

    def close(self) -> None:
        self.closed = True


async def wait_until(pilot: Any, predicate: Callable[[], Any], timeout: float = 5.0,
                     interval: float = 0.01, what: str | None = None) -> None:
    """Poll `predicate` between Pilot pauses until it is truthy; fail after `timeout` seconds.

    Polling instead of bare `pilot.pause()` keeps tests fast when things are quick and patient
    when the machine is slow.
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        await pilot.pause(interval)

