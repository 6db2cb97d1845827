"""The live speculation panel's figures, computed from the engine's RoundEvents.

Pure: `SpecStats` takes events and engine gauges and returns numbers; it imports neither
textual nor llama_cpp, so it is tested on synthetic events. It lives on the UI thread: the
engine process ships events to it over a pipe (see `engine_client.py` and `screens/chat.py`).

Two speeds are kept apart. The engine's: tokens over decode seconds as the engine measures them
in its own process, exactly as `adaspark run` does (the reply's final figure is the engine's
ReplyResult.tokens_per_s). The display's: tokens shown over the wall time between the first and
the last text shown, so a user can see any gap between what was decoded and what reached them.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..engine.events import SOURCES, RoundEvent

RECENT_ROUNDS = 64  # rounds kept for the width histogram: a few replies' worth, so it shows drift
NOW_WINDOW_S = 1.0  # decode seconds behind the latest round that "tok/s now" averages over
PLAIN_SEEN_ROUNDS = 64  # recent plain rounds (one row, no tree) whose own time is the panel's plain rate
PLAIN_SEEN_MIN = 8  # with fewer, the cost model's predicted plain rate stands in


def is_verify_round(event: RoundEvent) -> bool:
    """True for a real verify round; False for the first token, which comes from the prefill.

    The engine reports the prefill's token as an event with ``prefill`` set; counting it would
    put a phantom width-1 round in the histogram of every reply. The flag says so, where width
    and verify time only suggested it (a timer too coarse for a fast verify reads 0 ms).
    """
    return not event.prefill


@dataclass
class EngineGauges:
    """What the panel needs from the engine beyond the events, read in the engine process.

    The UI never calls the engine (it lives in another process); the engine process reads these
    every GAUGE_INTERVAL_S and at the end of a reply and ships them with a batch of rounds.
    """

    plain_rate: float | None = None  # tokens/s the cost model predicts for width 1 at this context
    cold_start: tuple[int, int] = (0, 0)  # (widths measured enough to be priced, widths offered)
    prices_ms: dict[int, float] = field(default_factory=dict)  # width -> priced verify ms now
    context: int = 0


def gauges_from(d: Mapping[str, Any] | None) -> EngineGauges | None:
    """EngineGauges from the plain dict the engine process sends (see engine/worker.read_gauges)."""
    if d is None:
        return None
    return EngineGauges(plain_rate=d.get("plain_rate"), cold_start=tuple(d.get("cold_start", (0, 0))),  # type: ignore[arg-type]
                        prices_ms={int(w): float(ms) for w, ms in (d.get("prices_ms") or {}).items()},
                        context=int(d.get("context", 0)))


@dataclass
class SourceRate:
    accepted: int
    rows: int

    @property
    def share(self) -> float | None:
        return self.accepted / self.rows if self.rows else None


class SpecStats:
    """Accumulates the figures shown by the speculation panel.

    Per reply: tokens, decode seconds, rounds, rows and acceptances by source, and a window of
    (seconds, tokens) points for the current rate. Across replies: the widths of recent rounds.
    """

    def __init__(self) -> None:
        self.recent_widths: deque[int] = deque(maxlen=RECENT_ROUNDS)
        self._plain_seen: deque[tuple[float, int]] = deque(maxlen=PLAIN_SEEN_ROUNDS)  # (seconds, tokens)
        self.gauges = EngineGauges()
        self.device: str | None = None  # where the engine runs the model (EngineLoaded tells it)
        self.generating = False
        self.start_reply()

    # ------------------------------------------------------------------ updates
    def start_reply(self) -> None:
        """Forget the per-reply figures (the histogram of recent widths is kept)."""
        self.reply_tokens = 0
        self.reply_seconds = 0.0
        self.rounds = 0
        self.round_tokens = 0  # tokens committed by verify rounds (the prefill's token excluded)
        self.rows_by_source: Counter[str] = Counter()
        self.accepted_by_source: Counter[str] = Counter()
        self.last: RoundEvent | None = None
        self._points: deque[tuple[float, int]] = deque()
        self.final_rate: float | None = None  # the engine's ReplyResult.tokens_per_s, once known
        self._shown_first: tuple[float, int] | None = None  # (wall seconds, tokens) when text first showed
        self._shown_last: tuple[float, int] | None = None
        self._arrived: tuple[float, int] | None = None  # (wall seconds, tokens) when text first arrived
        self._waiting_since: float | None = None  # when the oldest text not yet shown was produced
        self.lag_max: float | None = None  # the longest any text waited to be shown, seconds

    def add(self, event: RoundEvent) -> None:
        """Take one round (events arrive in round order)."""
        self.reply_tokens = max(self.reply_tokens, event.reply_tokens)
        if event.reply_seconds > 0.0:
            self.reply_seconds = event.reply_seconds
            self._points.append((event.reply_seconds, event.reply_tokens))
            while len(self._points) > 2 and self._points[1][0] < event.reply_seconds - NOW_WINDOW_S:
                self._points.popleft()
        if not is_verify_round(event):
            return
        self.rounds += 1
        self.round_tokens += event.committed
        self.recent_widths.append(event.width)
        self.rows_by_source.update(event.rows_by_source)
        self.accepted_by_source.update(event.accepted_by_source)
        self.last = event
        if event.width == 1 and event.priced_by == "none" and event.committed > 0:  # a plain step
            self._plain_seen.append(((event.verify_ms + event.fixed_ms) / 1e3, event.committed))

    def set_gauges(self, gauges: EngineGauges) -> None:
        self.gauges = gauges

    def finish(self, tokens_per_s: float, n_tokens: int) -> None:
        """The reply ended: its rate is now the engine's own figure (n_tokens / decode_s)."""
        self.final_rate = tokens_per_s if tokens_per_s > 0 else None
        self.reply_tokens = max(self.reply_tokens, n_tokens)

    def arrived(self, wall_s: float, tokens: int) -> None:
        """Text up to `tokens` reply tokens was produced at `wall_s` (the engine's monotonic clock);
        the first call of a reply starts the display's clock, so text held back on its way (a
        UI starved of CPU, frame pacing) counts as late."""
        if self._arrived is None:
            self._arrived = (wall_s, tokens)
        if self._waiting_since is None:
            self._waiting_since = wall_s

    def shown(self, wall_s: float, tokens: int) -> None:
        """Text up to `tokens` reply tokens reached the screen at wall time `wall_s`."""
        if self._shown_first is None:
            self._shown_first = (wall_s, tokens)
        self._shown_last = (wall_s, tokens)
        if self._waiting_since is not None:
            # the display's lag: from when the oldest text now drawn was produced to its showing
            # (a UI short of CPU shows here, while its tok/s can still match the engine's)
            lag = max(0.0, wall_s - self._waiting_since)
            self.lag_max = lag if self.lag_max is None else max(self.lag_max, lag)
            self._waiting_since = None

    # ------------------------------------------------------------------ figures
    @property
    def reply_rate(self) -> float | None:
        """Tokens per decode second over the whole reply so far, measured in the engine process;
        at the end of the reply, the engine's own n_tokens / decode_s (as `adaspark run`)."""
        if self.final_rate is not None:
            return self.final_rate
        if self.reply_seconds <= 0.0 or self.reply_tokens <= 0:
            return None
        return self.reply_tokens / self.reply_seconds

    @property
    def shown_rate(self) -> float | None:
        """Tokens per wall second from the first text's arrival (else its first showing) to the
        last text shown: the display's speed. Timed from the showing alone, a reply held back
        and drawn in two late frames would read as thousands of tokens a second."""
        if self._shown_first is None or self._shown_last is None:
            return None
        (t0, n0), (t1, n1) = self._arrived or self._shown_first, self._shown_last
        if t1 <= t0 or n1 <= n0:
            return None
        return (n1 - n0) / (t1 - t0)

    @property
    def now_rate(self) -> float | None:
        """Tokens per second over about the last NOW_WINDOW_S decode seconds."""
        if len(self._points) < 2:
            return self.reply_rate
        (s0, t0), (s1, t1) = self._points[0], self._points[-1]
        return (t1 - t0) / (s1 - s0) if s1 > s0 else self.reply_rate

    @property
    def plain_rate(self) -> float | None:
        """Tokens per second of plain decoding here: the recent plain rounds' own (a one-row step
        without a tree, its forward and its host time), else the rate the cost model predicts. The
        cost model prices a width near its best measured time (Eq. (5)'s level is a minimum over
        recent verifies), which a typical step does not reach: against it, a first reply of plain
        steps on the bundled model (AMD EPYC, Zen 3) read a speedup of 0.74x."""
        if len(self._plain_seen) >= PLAIN_SEEN_MIN:
            seconds = sum(t for t, _ in self._plain_seen)
            tokens = sum(n for _, n in self._plain_seen)
            if seconds > 0.0:
                return tokens / seconds
        return self.gauges.plain_rate

    @property
    def speedup(self) -> float | None:
        """Reply rate over the plain-decode rate (``plain_rate``)."""
        rate, plain = self.reply_rate, self.plain_rate
        if rate is None or not plain:
            return None
        return rate / plain

    @property
    def tokens_per_round(self) -> float | None:
        if self.rounds == 0:
            return None
        return self.round_tokens / self.rounds

    @property
    def width_now(self) -> int | None:
        return self.last.width if self.last else None

    def width_histogram(self) -> list[tuple[int, int]]:
        """(width, rounds) over the recent rounds, by width."""
        return sorted(Counter(self.recent_widths).items())

    def acceptance(self) -> dict[str, SourceRate]:
        """Accepted over verified draft rows for each source, this reply."""
        return {s: SourceRate(self.accepted_by_source.get(s, 0), self.rows_by_source.get(s, 0)) for s in SOURCES}

    def prices_ms(self) -> dict[int, float]:
        """Priced verify ms of each offered width at the current context.

        The latest round's offer is the freshest; before any round (or when the round was not
        priced) the engine's price table read with the gauges stands in.
        """
        if self.last is not None and self.last.offered:
            return dict(sorted(self.last.offered.items()))
        return dict(sorted(self.gauges.prices_ms.items()))

    @property
    def context(self) -> int:
        return self.last.context if self.last is not None else self.gauges.context

    @property
    def priced_by(self) -> str:
        return self.last.priced_by if self.last is not None else "none"
