"""Stopping a headless command: Ctrl+C, SIGTERM and SIGHUP, and a second one at once.

The first Ctrl+C is a KeyboardInterrupt: `adaspark run` and `bench` stop and keep what they
finished; inside ``stop_between_rounds`` (`run`'s replies) it first ends the reply in progress at
its next round, which `run` keeps. SIGTERM (`kill`, `timeout`, a job scheduler) and SIGHUP
(the terminal closed) stop them the same way: ``Stopped``, a KeyboardInterrupt naming its signal,
so `run` keeps every finished reply, `bench` writes its partial report and temporary stores are
removed; the exit code is 128 + the signal's number (143, 129), as a shell shows for a process the
signal killed. Before, either killed the process where it stood: `bench` wrote no report and the
temporary stores stayed behind. A signal the process was started ignoring (`nohup`) stays ignored.

But Python raises these only between bytecodes of the main thread, and llama.cpp's forward is
one C call: a long one (a big model's prompt chunk on a slow CPU) keeps the command waiting, and
one that never returns (a damaged file no header rule knows: Gemma-3-270M with
`rope.dimension_count` 0 spun in ggml's rope loop) could not be stopped by any number of Ctrl+C,
only by kill -9. Python's C-level handler still runs on every signal it handles, and with
`signal.set_wakeup_fd` it writes the signal's number to a pipe; a thread reading that pipe counts
the stop signals and, at the second, writes one line and ends the process (hard_exit.py: its
temporary stores removed) with 128 + that signal's number, whatever the main thread is in.

Not for the chat: there Ctrl+C is a key, SIGHUP and SIGTERM quit as Ctrl+Q does (ui/app.py), and
the engine runs in a process of its own.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

from .hard_exit import hard_exit

EXIT_INTERRUPTED = 128 + signal.SIGINT
#: what stops a headless command: Ctrl+C, then `kill` (or `timeout`), then a closed terminal
STOP_SIGNALS: tuple[int, ...] = tuple(int(getattr(signal, name)) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                                      if hasattr(signal, name))
LINE = "adaspark: interrupted (a second Ctrl+C: stopped at once)\n"


class Stopped(KeyboardInterrupt):
    """The first SIGTERM or SIGHUP, raised in the main thread as Ctrl+C's KeyboardInterrupt is,
    so every stop keeps what was finished the same way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(exc: BaseException) -> int:
    """128 + the stopping signal's number: 130 for Ctrl+C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + exc.signum if isinstance(exc, Stopped) else EXIT_INTERRUPTED


def stop_words(exc: BaseException) -> str:
    """What stopped the command, for its last line: 'interrupted' for Ctrl+C."""
    if not isinstance(exc, Stopped):
        return "interrupted"
    if exc.signum == getattr(signal, "SIGHUP", None):
        return "stopped: the terminal closed (SIGHUP)"
    return f"terminated ({signal.Signals(exc.signum).name})"


def second_stop_line(signum: int) -> str:
    """The line of a stop at once; Ctrl+C's is the one it always was."""
    if signum == signal.SIGINT:
        return LINE
    return f"adaspark: stopped at once (a second stop signal: {signal.Signals(signum).name})\n"


class _Watcher:
    """Counts the stop signals Python's handler writes to the wakeup pipe; ends the process at the
    `presses`-th."""

    def __init__(self, fd: int, presses: int) -> None:
        self.fd = fd
        self.presses = presses
        self.seen = 0

    def run(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 64)
            except OSError:
                return
            if not data:  # the write end closed: the command is over
                os.close(self.fd)
                return
            for signum in data:
                if signum in STOP_SIGNALS:
                    self.seen += 1
                    if self.seen >= self.presses:
                        hard_exit(128 + signum, second_stop_line(signum))


class _Stops:
    """The stop signals' handler in a ``stops_on_signals`` block. The first stop raises in the main
    thread (KeyboardInterrupt for Ctrl+C, ``Stopped`` for the others), or, inside
    ``stop_between_rounds``, sets its event so that the reply in progress ends at its next round;
    later ones only reach the wakeup pipe (the watcher's), so none raises inside the stop the first
    began."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.cancel: threading.Event | None = None

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        if self.cancel is not None:
            self.cancel.set()
            return
        raise stop_exception(signum)


def stop_exception(signum: int) -> KeyboardInterrupt:
    """What a first stop raises: KeyboardInterrupt for Ctrl+C, ``Stopped`` for SIGTERM and SIGHUP."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Stopped(signum)


_ACTIVE: list[_Stops] = []  # the handler of the stops_on_signals block the main thread is in


@contextmanager
def stop_between_rounds() -> Iterator[threading.Event]:
    """A first stop in the block sets the event it gives, for the engine to end the reply in progress
    at its next round (``ChatEngine.generate``'s `cancel`: a stopped reply, kept), and is raised as
    usual when the block ends. Outside a ``stops_on_signals`` block (a library's caller, another
    thread) the event is never set and signals are as they were."""
    cancel = threading.Event()
    stops = _ACTIVE[-1] if _ACTIVE and threading.current_thread() is threading.main_thread() else None
    if stops is None or stops.signum is not None:
        yield cancel
        return
    stops.cancel = cancel
    try:
        yield cancel
    finally:
        stops.cancel = None
    if cancel.is_set() and stops.signum is not None:
        raise stop_exception(stops.signum)


@contextmanager
def stops_on_signals(presses: int = 2) -> Iterator[None]:
    """While in the block, SIGTERM and SIGHUP stop the command as Ctrl+C does (``Stopped``), and,
    in the block and after it once a stop came, the `presses`-th stop signal ends the process at
    once (``hard_exit``; one line on stderr). After a first stop the watch stays to the process's
    end: the command returns, but the interpreter waits at its exit for an engine thread still
    inside llama.cpp. Left without one, the previous wakeup fd and handlers are put back. A signal
    ignored when the block starts (`nohup`'s SIGHUP, a background job's SIGINT) stays ignored. Does
    nothing outside the main thread, where signal.set_wakeup_fd cannot be called."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(read_fd)
        os.close(write_fd)
        yield
        return
    watcher = _Watcher(read_fd, presses)
    threading.Thread(target=watcher.run, name="stop-signals", daemon=True).start()
    stops = _Stops()
    replaced = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
            replaced[signum] = signal.signal(signum, stops.handler)
    _ACTIVE.append(stops)
    stopped = False
    try:
        yield
    except KeyboardInterrupt:
        stopped = True
        raise
    finally:
        _ACTIVE.remove(stops)
        if not stopped and watcher.seen == 0:
            for signum, old in replaced.items():
                signal.signal(signum, old)
            signal.set_wakeup_fd(previous)
            os.close(write_fd)  # the watcher reads the end and goes
