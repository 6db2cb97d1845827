"""A second Ctrl+C ends a headless command at once.

The first Ctrl+C is Python's KeyboardInterrupt: `adaspark run` and `bench` stop after what they
are doing and keep what they finished. But Python raises it only between bytecodes of the main
thread, and llama.cpp's forward is one C call: a long one (a big model's prompt chunk on a slow
CPU) keeps the command waiting, and one that never returns (a damaged file no header rule knows:
Gemma-3-270M with `rope.dimension_count` 0 spun in ggml's rope loop) could not be stopped by any
number of Ctrl+C, only by kill -9. Python's C-level handler still runs on every SIGINT, and with
`signal.set_wakeup_fd` it writes the signal's number to a pipe; a thread reading that pipe counts
them and, at the second, writes one line and exits with 130, whatever the main thread is in.

Not for the chat: there Ctrl+C is a key, and the engine runs in a process of its own.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

EXIT_INTERRUPTED = 130
LINE = b"adaspark: interrupted (a second Ctrl+C: stopped at once)\n"


class _Watcher:
    """Counts the SIGINTs Python's handler writes to the wakeup pipe; exits at the `presses`-th."""

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
            self.seen += data.count(signal.SIGINT)
            if self.seen >= self.presses:
                os.write(2, LINE)
                os._exit(EXIT_INTERRUPTED)


@contextmanager
def second_interrupt_exits(presses: int = 2) -> Iterator[None]:
    """While in the block, and after it once a SIGINT came, the `presses`-th SIGINT ends the
    process at once (exit 130, one line on stderr); the ones before it are Python's as usual. After
    a first Ctrl+C the watch stays to the process's end: the command returns, but the interpreter
    waits at its exit for an engine thread still inside llama.cpp. Left without one, the previous
    wakeup fd is put back. Does nothing outside the main thread, where signal.set_wakeup_fd cannot
    be called."""
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
    threading.Thread(target=watcher.run, name="second-interrupt", daemon=True).start()
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if not interrupted and watcher.seen == 0:
            signal.set_wakeup_fd(previous)
            os.close(write_fd)  # the watcher reads the end and goes
