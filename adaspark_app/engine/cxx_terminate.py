"""A C++ exception that llama.cpp lets out of its C API ends the process in one line.

llama.cpp's C functions do not all catch what their C++ throws: `llama_tokenize` on a
SentencePiece vocabulary without byte tokens (a GPT-2 vocabulary relabeled `llama` in the bundled
model's header) threw std::out_of_range from `llama_vocab::byte_to_token` for the first character
no token covers, and the C++ runtime called std::terminate: ggml's terminate handler forked gdb
for a backtrace, libstdc++'s printed `terminate called after throwing an instance of ...`, and the
process died of SIGABRT (exit 134). ggml's abort callback does not see it (it is for GGML_ABORT).

``install`` puts a handler of ours in std::terminate's place (after ggml's, which it replaces):
it names the exception's type from the C++ runtime (``__cxa_current_exception_type``, demangled)
and ends the process with ``hard_exit(2, line(type_name))``. Through ctypes, so nothing is compiled;
where the runtime has no such symbols (another C++ library), llama.cpp's own behaviour stays.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable

from ..hard_exit import hard_exit

#: std::set_terminate(void (*)()) under the Itanium C++ ABI (libstdc++, libc++)
SET_TERMINATE = "_ZSt13set_terminatePFvvE"
_PROTO = ctypes.CFUNCTYPE(None)
_HANDLER = None  # kept: the C++ runtime holds the pointer


def _runtime() -> ctypes.CDLL | None:
    """The C++ runtime llama.cpp's libraries use (already loaded with them: the same copy)."""
    for name in ("stdc++", "c++abi", "c++"):
        found = ctypes.util.find_library(name)
        if not found:
            continue
        try:
            lib = ctypes.CDLL(found)
        except OSError:
            continue
        if hasattr(lib, SET_TERMINATE):
            return lib
    return None


def exception_type_name(lib: ctypes.CDLL) -> str:
    """The demangled type of the exception being handled ('' if none, or not readable): the
    std::type_info's name (the pointer after its vtable pointer) through ``__cxa_demangle``."""
    current = lib.__cxa_current_exception_type
    current.restype = ctypes.c_void_p
    info = current()
    if not info:
        return ""
    mangled = ctypes.c_char_p.from_address(info + ctypes.sizeof(ctypes.c_void_p)).value or b""
    mangled = mangled.lstrip(b"*")  # a leading '*' marks a type local to its library
    demangle = lib.__cxa_demangle
    demangle.restype = ctypes.c_void_p
    demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    status = ctypes.c_int(-1)
    text = demangle(mangled, None, None, ctypes.byref(status))
    if status.value == 0 and text:
        return ctypes.string_at(text).decode("utf-8", "replace")  # malloc'd: the process ends anyway
    return mangled.decode("utf-8", "replace")


def install(line: Callable[[str], str]) -> bool:
    """Make std::terminate end the process with ``line(the exception's type name)`` on stderr and
    exit code 2; False where the C++ runtime was not found."""
    global _HANDLER
    lib = _runtime()
    if lib is None:
        return False

    @_PROTO
    def _on_terminate():  # pragma: no cover - the process ends here (tests run it in a child)
        try:
            text = line(exception_type_name(lib))
        except BaseException:  # a line that cannot be made must not keep the process from ending
            text = "adaspark: error: llama.cpp stopped on an error of its own it does not handle\n"
        hard_exit(2, text)

    setter = getattr(lib, SET_TERMINATE)
    setter.argtypes = [_PROTO]
    setter.restype = ctypes.c_void_p
    setter(_on_terminate)
    _HANDLER = _on_terminate
    return True
