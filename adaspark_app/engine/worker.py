"""The chat engine in its own process, streaming its rounds to the TUI over a pipe.

Why a process: on a two-core machine llama.cpp runs two threads, and every cycle or GIL hold
of the UI in the same process stalls a verify (one thread preempted, the other waiting at its
barrier; the engine thread waiting for the GIL after each forward). Measured in issue 17: the
Textual main thread used 0.3 s of CPU per second of streaming, and the chat decoded at 45 tok/s
where `adaspark run` did 64-88. In its own process the engine holds its own GIL, runs at normal
priority while the UI lowers its own, and a llama.cpp crash cannot take the UI down.

The process is started with the "spawn" context (never fork a Textual process) by
`adaspark_app.ui.engine_client.EngineClient`; `serve` is its entry point. This module imports
neither textual nor llama_cpp at load: the UI process imports it for the protocol, and only the
engine process builds a `ChatEngine` (through `EngineConfig`).

Protocol (every message is a tuple whose first item names it; all items are picklable):

UI -> engine, on the command pipe:
    ("generate", request_id, conversation_id, messages, max_tokens, turn, sampling)
    ("read_ahead", conversation_id, messages, max_tokens, draft)  # the history shown, and the message typed
    ("close",)
engine -> UI, on the event pipe:
    ("loaded", {"model_name", "drafter_name", "notices", "gauges", "pid", "n_ctx", "device"})
    ("load_failed", message)                        # then the process exits
    ("prefill", request_id, tokens read, tokens to read)  # a long prompt being read, now and then
    ("rounds", request_id, [RoundEvent], [monotonic seconds of each], gauges or None)
    ("done", request_id, ReplyResult, gauges)
    ("stopped", request_id)                         # cancelled before the reply's first token
    ("failed", request_id, message)                 # the engine raised; the process goes on
    ("reading_ahead", conversation_id, tokens read, tokens to read)  # a long history, now and then
    ("read_ahead", ReadAhead or None)               # the history is in the cache (as far as read; None: failed)
    ("closed",)

The shared `CancelFlag` stops a reply between rounds (`run_reply` checks it before each one),
so Esc ends a reply within one round, and a prompt's reading between two of its chunks. A
history read ahead stops between two chunks as soon as the next command arrives: a message sent
while it is read goes on from where it stopped. Times
are `time.monotonic()`, one clock for every process on the machine, so the UI can tell which
rounds ran after it asked to stop.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import AdaSparkError
from .events import RoundEvent

# At most ~4 messages a second to the UI, which shows text 4 times a second at most
# (ui/widgets/reply_stream.TEXT_INTERVAL_S); each message wakes two UI threads and the flusher.
BATCH_INTERVAL_S = 0.25
GAUGE_INTERVAL_S = 0.5  # the panel's learned figures change slowly; reading them costs engine time
# A prompt this long takes a second or more to read on 2 CPU cores: the status line counts it
PROGRESS_MIN_TOKENS = 512
PROGRESS_S = 0.25


class CancelFlag:
    """A stop flag shared by the UI and engine processes, read without any lock.

    A multiprocessing.Event takes a semaphore in `is_set`; an engine killed while holding it
    would leave the UI blocked forever in `set`. One byte of shared memory cannot deadlock.
    """

    def __init__(self, ctx: Any) -> None:
        self._value = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def clear(self) -> None:
        self._value.value = 0

    def is_set(self) -> bool:
        return bool(self._value.value)


@dataclass(frozen=True)
class EngineConfig:
    """How the engine process builds its `ChatEngine` (picklable: it crosses the spawn).

    The learned state is kept in `store_path` (the engine process opens its own connection;
    the file is WAL with a busy timeout, so the UI keeps writing chats to it meanwhile).
    """

    model_path: str | None = None
    drafter_path: str | None = None
    store_path: str | None = None
    arm: str = "adaspark"
    n_ctx: int | None = 4096  # None: the model's default chat context (engine/context_size.py)
    n_threads: int | None = None
    gpu_layers: int | None = None  # None: every layer where the build can offload (engine/offload.py)
    saved_context_mb: int = 0  # conversations' KV caches kept beside the store (store/saved_context.py)

    def __call__(self) -> Any:
        from .. import native

        native.activate()  # before llama_cpp is imported: the Q4_1 kernels `adaspark run` uses
        from .chat_engine import ChatEngine  # in the engine process only: it loads llama.cpp

        store = None
        if self.store_path is not None:
            from ..store import Store

            store = Store.open(self.store_path)
        try:
            n_ctx = self.n_ctx
            if n_ctx is None:  # resolved here, so a model picked later gets its own default
                from .backend import default_model_path
                from .context_size import default_chat_n_ctx

                n_ctx = default_chat_n_ctx(self.model_path or default_model_path(), self.drafter_path).n_ctx
            engine = ChatEngine(model_path=self.model_path, drafter_path=self.drafter_path, store=store,
                                arm=self.arm, n_ctx=n_ctx, n_threads=self.n_threads, gpu_layers=self.gpu_layers,
                                saved_context_mb=self.saved_context_mb)
        except BaseException:
            if store is not None:
                store.close()
            raise
        engine._worker_store = store  # closed with the engine by serve()
        return engine


def read_gauges(engine: Any, context: int) -> dict[str, Any] | None:
    """The panel's learned figures at `context` (engine process only), or None if unavailable."""
    try:
        return {
            "plain_rate": engine.plain_rate(context),
            "cold_start": tuple(engine.cold_start_progress()),
            "prices_ms": {int(w): s * 1e3 for w, s in engine.price_table(context).items()},
            "context": context,
        }
    except Exception:  # a figure the engine cannot give yet must not end a reply
        return None


class EventBatcher:
    """Collects a reply's rounds in the engine process and sends one batch at a time.

    A batch leaves when a round ends `interval` or more after the last batch; the first round
    leaves at once so the first words appear without delay. A slow round must not hold back the
    text of the quick ones before it, so with `flusher` a thread sends what waits once
    `interval` has passed. That thread sleeps in between and wakes at most once a batch; the
    decode thread only appends under a lock (sending happens under it too, to keep order).
    """

    def __init__(self, send: Callable[[list[RoundEvent], list[float]], None], interval: float = BATCH_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, flusher: bool = True) -> None:
        self._send = send
        self._interval = interval
        self._clock = clock
        self._cond = threading.Condition()
        self._events: list[RoundEvent] = []
        self._times: list[float] = []
        self._last: float | None = None
        self._closed = False
        self.batches = 0
        self._thread: threading.Thread | None = None
        if flusher:
            self._thread = threading.Thread(target=self._flush_when_due, name="event-flusher", daemon=True)
            self._thread.start()

    def add(self, event: RoundEvent) -> None:
        with self._cond:
            now = self._clock()
            self._events.append(event)
            self._times.append(now)
            if self._last is None or now - self._last >= self._interval:
                self._flush_locked()
            elif len(self._events) == 1:
                self._cond.notify()  # a new batch has begun: the flusher times it

    def flush(self) -> None:
        """Send what is pending (also called at the end of a reply)."""
        with self._cond:
            self._flush_locked()

    def close(self) -> None:
        """Stop the flusher (pending rounds are not sent: call `flush` first to send them)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(5.0)

    def _flush_locked(self) -> None:
        if not self._events:
            return
        events, times = self._events, self._times
        self._events, self._times = [], []
        self._last = self._clock()
        self.batches += 1
        self._send(events, times)

    def _flush_when_due(self) -> None:
        """Thread boundary: the flusher thread. Sends a batch a slow round would hold back."""
        with self._cond:
            while not self._closed:
                if not self._events or self._last is None:
                    self._cond.wait()
                    continue
                wait = self._last + self._interval - self._clock()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                try:
                    self._flush_locked()
                except (OSError, EOFError):
                    return  # the UI has gone: the decode thread finds out on its next send


def _quiet_process(log_path: str | None) -> None:
    """The engine shares the UI's terminal: anything written to fds 1 and 2 (llama.cpp, a
    traceback) would draw over the TUI, so both go to a log file; a crash's Python stack too.
    Ctrl+C is the UI's to handle (it is a key in Textual's raw mode): the engine ignores SIGINT. A
    closed terminal sends SIGHUP to the UI and the engine together: the UI then stops the reply and
    saves it, which needs the engine to finish its round, so the engine ignores SIGHUP too (it exits
    when the UI's pipe closes)."""
    import faulthandler

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    target = log_path or os.devnull
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    faulthandler.enable(file=sys.stderr)


def serve(commands: Any, events: Any, cancel: CancelFlag, factory: Callable[[], Any],
          log_path: str | None = None) -> None:
    """Entry point of the engine process: build the engine, then answer commands until close.

    Thread boundary: everything here runs on the engine process's main thread, the only thread
    that calls llama.cpp. If the UI goes away (a pipe closes) the process exits.
    """
    _quiet_process(log_path)
    from .. import native

    native.activate()  # before the engine imports llama_cpp: the parent's kernels (inherited env) or ours
    try:
        engine = factory()
    except AdaSparkError as err:
        events.send(("load_failed", str(err)))
        return
    except Exception as err:
        events.send(("load_failed", f"{type(err).__name__}: {err}"))
        return
    try:
        events.send(("loaded", {
            "model_name": getattr(engine, "model_name", None),
            "drafter_name": getattr(engine, "drafter_name", None),
            "notices": list(getattr(engine, "notices", []) or []),
            "gauges": read_gauges(engine, 0),
            "n_ctx": getattr(getattr(engine, "backend", None), "n_ctx", None),  # the header shows it
            "device": getattr(engine, "device_label", None),  # and this
            "opens_thinking": bool(getattr(engine, "opens_thinking", False)),  # replies start thinking
            "pid": os.getpid(),
        }))
        while True:
            try:
                command = commands.recv()
            except (EOFError, OSError):
                return  # the UI has gone
            if command[0] == "close":
                events.send(("closed",))
                return
            if command[0] == "generate":
                _generate(engine, events, cancel, *command[1:])
            elif command[0] == "read_ahead":
                _read_ahead(engine, events, commands, *command[1:])
    except (BrokenPipeError, EOFError):
        return  # the UI has gone mid-reply
    finally:
        _close(engine)


def _generate(engine: Any, events: Any, cancel: CancelFlag, request_id: int, conversation_id: str,
              messages: list[dict[str, str]], max_tokens: int, turn: int, sampling: Any = None) -> None:
    if cancel.is_set():  # stopped while the request waited (the model was still loading)
        events.send(("stopped", request_id))
        return
    last_gauges = [time.monotonic()]

    decode_thread = threading.current_thread()

    def send(batch: list[RoundEvent], times: list[float]) -> None:
        gauges = None
        # Only the decode thread reads the learners (the flusher's batches carry no gauges).
        if threading.current_thread() is decode_thread and times[-1] - last_gauges[0] >= GAUGE_INTERVAL_S:
            gauges = read_gauges(engine, batch[-1].context)
            last_gauges[0] = times[-1]
        events.send(("rounds", request_id, batch, times, gauges))

    batcher = EventBatcher(send)
    prefill_progress = _reading_progress(events, "prefill", request_id)
    try:
        extra = {} if sampling is None else {"sampling": sampling}  # SamplingSettings (pickled)
        result = engine.generate(conversation_id, messages, max_tokens=max_tokens, on_round=batcher.add,
                                 cancel=cancel, turn=turn, on_prefill=prefill_progress, **extra)
        batcher.flush()
    except (BrokenPipeError, EOFError):
        raise
    except AdaSparkError as err:
        events.send(("failed", request_id, str(err)))
        return
    except Exception as err:  # an engine bug: the UI gives the prompt back and says what happened
        events.send(("failed", request_id, f"{type(err).__name__}: {err}"))
        return
    finally:
        batcher.close()
    if result.stopped and result.n_tokens == 0:  # stopped while the prompt was read: nothing to show
        events.send(("stopped", request_id))
        return
    events.send(("done", request_id, result, read_gauges(engine, result.context)))


def _reading_progress(events: Any, kind: str, about: Any) -> Callable[[int, int], None]:
    """on_progress(done, total) for a long reading (a prompt, a history read ahead), for the status
    line: sends (kind, about, done, total) at its start, then at most every PROGRESS_S, where it
    is PROGRESS_MIN_TOKENS or longer."""
    reported = [float("-inf")]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if total >= PROGRESS_MIN_TOKENS and (done == 0 or now - reported[0] >= PROGRESS_S):
            reported[0] = now
            events.send((kind, about, done, total))

    return progress


def _read_ahead(engine: Any, events: Any, commands: Any, conversation_id: str | None,
                messages: list[dict[str, str]], max_tokens: int, draft: str = "") -> None:
    """Read the history of the conversation the chat shows into the KV cache while the user types
    (`ChatEngine.read_ahead`), and the message as far as it is typed, until the next command
    arrives. Nothing depends on it: an engine without it (a test's) answers nothing, one that fails
    at it answers None (the status line's count ends), and the next reply reads what it needs."""
    read_ahead = getattr(engine, "read_ahead", None)
    if read_ahead is None:
        return
    try:
        result = read_ahead(conversation_id, messages, max_tokens=max_tokens, stop=commands.poll,
                            on_progress=_reading_progress(events, "reading_ahead", conversation_id), draft=draft)
    except (BrokenPipeError, EOFError):
        raise
    except Exception as err:  # said in the engine's log; the reply will prefill what it needs
        print(f"reading the history ahead failed: {type(err).__name__}: {err}", file=sys.stderr)
        result = None
    events.send(("read_ahead", result))


def _close(engine: Any) -> None:
    try:
        engine.close()
    except Exception:
        pass
    store = getattr(engine, "_worker_store", None)
    if store is not None:
        try:
            store.close()
        except Exception:
            pass
