"""A crash in llama.cpp ends the process in one line, exit 2 (adaspark_app/native/fatal_signal.py).

Real crashes in real child processes: llama.cpp's own code reading address 8 (a context pointer
that points nowhere), a stack overflowed by a C recursion, each fatal signal raised; and `adaspark
run` on the bundled model crashing in its first reply."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from adaspark_app.native import fatal_signal
from failing_compiler import failing_compiler

LINE_START = "adaspark: error: llama.cpp crashed ("
LINE_END = ": a file it cannot run (damaged, or of a layout this build of llama.cpp does not handle)"

#: a child that loads llama.cpp as every command does (the backend), then crashes in it
CRASH_IN_LLAMA_CPP = textwrap.dedent("""
    import ctypes
    from adaspark_app.engine import backend
    llama = backend._llama()
    llama.llama_get_logits(ctypes.c_void_p(8))  # llama.cpp reads the context at address 8
    print("went on")
""")


def _child(code: str, *args: str, argv: tuple[str, ...] = (), env: dict | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    """`python ARGS -c CODE ARGV` with faulthandler and ADASPARK_LLAMA_LOG off unless `env` sets them."""
    full = dict(os.environ)
    full.pop("PYTHONFAULTHANDLER", None)
    full.pop("ADASPARK_LLAMA_LOG", None)
    full.update(env or {})
    return subprocess.run([sys.executable, *args, "-c", code, *argv], capture_output=True, text=True,
                          timeout=timeout, env=full)


def test_a_crash_inside_llama_cpp_is_one_line_and_exit_2():
    proc = _child(CRASH_IN_LLAMA_CPP)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr == f"{LINE_START}a segmentation fault, SIGSEGV) with no model loaded yet{LINE_END}\n"
    assert "went on" not in proc.stdout


def test_a_stack_overflow_is_named_too(tmp_path):
    """A C recursion that overflows the main thread's stack: the handler runs on a stack of its own
    (without one the kernel finds no stack for it and the process dies by SIGSEGV, silent)."""
    cc = fatal_signal.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "deep.c"
    src.write_text("int deep(int n) { volatile char buf[4096]; buf[0] = (char)n;"
                   " return n < 0 ? 0 : deep(n + 1) + buf[0]; }\n")
    lib = tmp_path / "deep.so"
    subprocess.run([cc, "-O0", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    code = CRASH_IN_LLAMA_CPP.replace("llama.llama_get_logits(ctypes.c_void_p(8))",
                                      f"ctypes.CDLL({str(lib)!r}).deep(1)")
    proc = _child(code)
    assert (proc.returncode, proc.stderr.startswith(f"{LINE_START}a segmentation fault, SIGSEGV)")) == (2, True), \
        (proc.returncode, proc.stderr)


@pytest.mark.parametrize("name,words", [
    ("SIGSEGV", "a segmentation fault, SIGSEGV"),
    ("SIGBUS", "a bus error, SIGBUS"),
    ("SIGFPE", "an arithmetic fault, SIGFPE"),
    ("SIGILL", "an instruction this CPU does not have, SIGILL"),
    ("SIGABRT", "an abort, SIGABRT"),
])
def test_each_fatal_signal_is_named(name, words):
    assert name in fatal_signal.SIGNALS
    code = CRASH_IN_LLAMA_CPP.replace("llama.llama_get_logits(ctypes.c_void_p(8))",
                                      f"import signal; signal.raise_signal(signal.{name})")
    proc = _child(code)
    assert (proc.returncode, proc.stderr) == (2, f"{LINE_START}{words}) with no model loaded yet{LINE_END}\n")


def test_with_faulthandler_on_the_line_comes_first_then_its_python_stack():
    """`-X faulthandler` (a developer's, pytest's, the chat engine's log): the line, then Python's
    own dump of the crash, and the process ends by the signal as it did."""
    proc = _child(CRASH_IN_LLAMA_CPP, "-X", "faulthandler")
    assert proc.returncode == -signal.SIGSEGV, proc.stderr
    first, _, rest = proc.stderr.partition("\n")
    assert first.startswith(f"{LINE_START}a segmentation fault, SIGSEGV)")
    assert "Fatal Python error: Segmentation fault" in rest and 'File "<string>", line 5' in rest


def test_adaspark_llama_log_keeps_the_crash_as_it_was():
    proc = _child(CRASH_IN_LLAMA_CPP, env={"ADASPARK_LLAMA_LOG": "1"})
    assert proc.returncode == -signal.SIGSEGV and "adaspark" not in proc.stderr


RUN_CRASHING_IN_THE_SECOND_REPLY = textwrap.dedent("""
    import ctypes, sys
    import llama_cpp
    from adaspark_app.engine import chat_engine
    generate = chat_engine.ChatEngine.generate
    replies = []
    def crashing(self, *args, **kwargs):
        replies.append(1)
        if len(replies) == 2:
            llama_cpp.llama_get_logits(ctypes.c_void_p(8))
        return generate(self, *args, **kwargs)
    chat_engine.ChatEngine.generate = crashing
    from adaspark_app.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.model
def test_adaspark_run_crashing_in_llama_cpp_keeps_the_first_reply_and_names_the_file(tmp_path):
    """`adaspark run` on the bundled model whose second reply crashes in llama.cpp: the first is
    in OUT.jsonl, stderr's last line names the crash and the model file, exit 2; the temporary
    store the handler cannot remove goes at the next run (hard_exit.sweep)."""
    from adaspark_app.engine.backend import default_model_path

    script = tmp_path / "s.jsonl"
    script.write_text('{"id": "a", "turns": ["Say hello."]}\n{"id": "b", "turns": ["Say bye."]}\n')
    out = tmp_path / "out.jsonl"
    (tmp_path / "tmp").mkdir()
    env = {"TMPDIR": str(tmp_path / "tmp")}
    proc = _child(RUN_CRASHING_IN_THE_SECOND_REPLY, argv=("run", str(script), "--out", str(out), "--fresh-store",
                                                          "--max-tokens", "4"), env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.rstrip("\n").splitlines()[-1]
    assert last == f"{LINE_START}a segmentation fault, SIGSEGV) with {default_model_path()}{LINE_END}"
    assert [json.loads(line)["conversation"] for line in out.read_text().splitlines()] == ["a"]
    left = list((tmp_path / "tmp").iterdir())
    assert len(left) == 1  # the handler runs no Python: the store's folder stays, its lock dropped
    again = _child("import sys\nfrom adaspark_app.cli import main\nsys.exit(main(sys.argv[1:]))",
                   argv=("run", str(script), "--out", str(tmp_path / "again.jsonl"), "--fresh-store", "--max-tokens", "2"),
                   env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_handler_that_cannot_be_built_leaves_the_signal_and_says_why(monkeypatch, tmp_path):
    cc, calls = failing_compiler(tmp_path, "fatal_signal.c:1: error: no compiler here")
    monkeypatch.setattr(fatal_signal, "compiler", lambda: str(cc))
    monkeypatch.setattr(fatal_signal, "LIB_DIR", tmp_path / "lib")
    monkeypatch.setattr(fatal_signal, "_lib", None)
    monkeypatch.delenv("ADASPARK_LLAMA_LOG", raising=False)
    for _ in range(2):  # the second (a next process) reads the failure, and does not compile again
        monkeypatch.setattr(fatal_signal, "_status", "not installed")
        assert fatal_signal.install("x") is False
        assert fatal_signal.status() == "not installed (not built: failing-cc failed: " \
                                        "fatal_signal.c:1: error: no compiler here)".replace("failing-cc", str(cc))
    assert calls() == 1
    assert not fatal_signal.installed(signal.SIGSEGV)
