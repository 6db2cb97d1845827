"""Thread hand-off between the engine's worker thread and the UI.

`StreamBatcher` collects released text and round events in the worker thread and emits one
batch at most every `interval` seconds (one Textual message per batch, not one per token).
`EngineHolder` owns the lazily created engine: a loader thread builds it, reply workers wait for
it, and shutdown closes it once no reply is running. Neither touches a widget.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..engine.events import RoundEvent

BATCH_INTERVAL_S = 0.04  # ~25 UI updates a second: smooth to the eye, cheap for the event loop


class StreamBatcher:
    """Batches streamed text and round events; `emit(text, events)` gets one batch at a time.

    Runs in the worker thread. The first event is emitted at once so the first words appear
    without delay; later ones are held until `interval` has passed since the last emit. A timer
    flushes what is pending if no round comes in time (a slow cold-start round must not hold
    back text already released), so no text waits longer than about `interval`.
    """

    def __init__(self, emit: Callable[[str, list[RoundEvent]], None], interval: float = BATCH_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, use_timer: bool = True) -> None:
        self._emit = emit
        self._interval = interval
        self._clock = clock
        self._use_timer = use_timer
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._last_emit: float | None = None
        self._text: list[str] = []
        self._events: list[RoundEvent] = []
        self.batches = 0

    def add(self, event: RoundEvent) -> None:
        with self._lock:
            self._events.append(event)
            if event.text:
                self._text.append(event.text)
            now = self._clock()
            due = self._last_emit is None or now - self._last_emit >= self._interval
            if not due and self._use_timer and self._timer is None:
                self._timer = threading.Timer(self._interval - (now - self._last_emit), self.flush)
                self._timer.daemon = True
                self._timer.start()
        if due:
            self.flush()

    def flush(self) -> None:
        """Emit whatever is pending (also called at the end of a reply, and by the timer)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not self._events and not self._text:
                return
            text, events = "".join(self._text), self._events
            self._text, self._events = [], []
            self._last_emit = self._clock()
            self.batches += 1
            # Emit under the lock so batches leave in order even when the timer races a round.
            self._emit(text, events)

    def discard(self) -> None:
        """Drop what is pending and stop the timer (the reply failed: its text is not shown)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._text, self._events = [], []


class EngineHolder:
    """The engine, created once in a loader thread and shared with reply workers.

    Thread boundary: `load` runs in a worker thread; `wait` blocks a reply worker until the
    engine exists (or its load failed); `use` serialises replies with `close`.
    """

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._ready = threading.Event()
        self._busy = threading.Lock()
        self.engine: Any = None
        self.error: BaseException | None = None
        self.closed = False

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def load(self) -> Any:
        """Create the engine (blocking; call from a worker thread). Re-raises the load error."""
        try:
            self.engine = self._factory()
            return self.engine
        except BaseException as err:
            self.error = err
            raise
        finally:
            self._ready.set()

    def wait(self, cancel: threading.Event | None = None, poll_s: float = 0.05) -> Any | None:
        """Block until the engine is loaded; None if `cancel` was set first. Raises the load error."""
        while not self._ready.wait(poll_s):
            if cancel is not None and cancel.is_set():
                return None
        if self.error is not None:
            raise self.error
        return self.engine

    @property
    def busy(self) -> threading.Lock:
        """Held by a reply worker while it runs the engine, so `close` waits for it."""
        return self._busy

    def close(self, timeout: float = 10.0) -> bool:
        """Close the engine once no reply holds it. Returns False if it stayed busy past `timeout`."""
        if self.closed:
            return True
        if not self._ready.wait(timeout):
            return False
        if not self._busy.acquire(timeout=timeout):
            return False
        try:
            if self.engine is not None:
                self.engine.close()
            self.closed = True
            return True
        finally:
            self._busy.release()
