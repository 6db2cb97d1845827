"""A crash in llama.cpp ends the process in one line, exit 2, like its other failures.

llama.cpp's failed assertions (ggml's abort callback, ``engine/backend.py``) and the C++ exceptions
it lets out (``engine/cxx_terminate.py``) end an AdaSpark process in one line naming the file. A
crash did not: a read out of bounds, an overflowed stack, an instruction this CPU lacks (a build
of llama.cpp made for another CPU) ended it with the signal (the shell's ``Segmentation fault
(core dumped)``, exit 139), and the chat's notice said only "signal 11". ``install`` puts a
handler for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT in place (``fatal_signal.c``): it writes
the line ``set_line`` last gave (the backend gives it again at each model load, naming the files)
with the signal's words in it, and exits with code 2.

The handler is C and calls only async-signal-safe functions (``write``, ``_exit``; ``sigaction``
and ``raise`` to chain): after a crash the heap, the interpreter and their locks may be in any
state, so it runs no Python, and a temporary store it cannot remove is
removed by the next ``run`` or ``bench`` (``hard_exit.sweep``, as after a SIGKILL). On the thread
that installs it (the main one, where llama.cpp tokenizes and decodes) it runs on a stack of its
own, so a stack overflow is named too.

Where Python's faulthandler is on (``PYTHONFAULTHANDLER``, ``-X faulthandler``, pytest, the chat's
engine process, whose log keeps a crash's Python stack) the handler chains: the line, then
faulthandler's dump, and the process ends by the signal as before (the chat names the crash from
the line in the engine's log). ``ADASPARK_LLAMA_LOG`` keeps it out (llama.cpp's own ends, as for its
assertions). Built from C like the round's pricing (``c_compile.py``); where it cannot be built the
crash stays the signal's.

    python -m adaspark_app.native.fatal_signal   # build; print where and the status
"""

from __future__ import annotations

import ctypes
import faulthandler
import hashlib
import os
import sys
from pathlib import Path

from .build import LIB_DIR
from .c_compile import build_command, built_or_why, compile_into, compiler

SOURCE = Path(__file__).resolve().parent / "fatal_signal.c"
FLAGS = ("-O2", "-shared", "-fPIC", "-std=c11", "-Wall")
#: the signals whose handler becomes ours
SIGNALS = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
#: between a line's head and its tail, where the handler writes the signal's words (its first
#: occurrence: a file name the line names after it may hold the same text)
WORDS_MARK = "{signal}"
LINE_MAX_BYTES = 2047  # fatal_signal.c keeps each part in 2048 bytes with its NUL

_lib: ctypes.CDLL | None = None
_status = "not installed"


def target() -> Path:
    """Where this source's build lives (keyed by the source and the flags)."""
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join(FLAGS).encode())
    return LIB_DIR / "fatal_signal" / h.hexdigest()[:16] / "libfatal_signal.so"


def build(force: bool = False) -> Path:
    """Compile ``fatal_signal.c`` into ``target()``; BuildError with the first error line when it cannot."""
    out = target()
    if out.exists() and not force:
        return out
    return compile_into(compiler(), [*FLAGS, str(SOURCE)], out)


def chains() -> bool:
    """Whether the handler, once in, hands the crash on (Python's faulthandler is on)."""
    return faulthandler.is_enabled()


def _split(line: str) -> tuple[bytes, bytes]:
    head, _, tail = line.partition(WORDS_MARK)
    return (head.encode("utf-8", "replace")[:LINE_MAX_BYTES], tail.encode("utf-8", "replace")[:LINE_MAX_BYTES])


def install(line: str) -> bool:
    """Make a crash end the process with ``line`` on stderr, the signal's words in place of
    ``WORDS_MARK`` (e.g. ``a segmentation fault, SIGSEGV``), and exit code 2 (faulthandler's end
    after the line where it is on). False, with ``status()`` saying why, where it stays out or
    could not be built. Once per process; later calls only change the line."""
    global _lib, _status
    if _lib is not None:
        set_line(line)
        return True
    if os.environ.get("ADASPARK_LLAMA_LOG"):
        _status = "not installed (ADASPARK_LLAMA_LOG is set)"
        return False
    path, why = built_or_why(target(), build)
    if path is None:
        _status = f"not installed (not built: {why})"
        return False
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        _status = f"not installed (failed to load: {str(e).splitlines()[0]})"
        return False
    lib.adaspark_fatal_set_line.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.adaspark_fatal_set_line.restype = None
    lib.adaspark_fatal_install.argtypes = [ctypes.c_int]
    lib.adaspark_fatal_install.restype = ctypes.c_int
    lib.adaspark_fatal_installed.argtypes = [ctypes.c_int]
    lib.adaspark_fatal_installed.restype = ctypes.c_int
    lib.adaspark_fatal_set_line(*_split(line))
    chain = chains()
    if lib.adaspark_fatal_install(int(chain)) != 0:
        _status = "not installed (sigaction failed)"
        return False
    _lib = lib
    _status = "installed, then faulthandler's" if chain else "installed"
    return True


def set_line(line: str) -> None:
    """The line a crash ends the process with from now on (nothing where the handler is not in)."""
    if _lib is not None:
        _lib.adaspark_fatal_set_line(*_split(line))


def installed(signal_number: int) -> bool:
    """Whether the handler of that signal is ours now."""
    return _lib is not None and bool(_lib.adaspark_fatal_installed(int(signal_number)))


def status() -> str:
    """``installed`` (``, then faulthandler's`` where it chains), or ``not installed (why)``."""
    return _status


def main(argv: list[str] | None = None) -> int:
    return build_command(argv, "the one-line crash handler", build, lambda: "")


if __name__ == "__main__":
    sys.exit(main())
