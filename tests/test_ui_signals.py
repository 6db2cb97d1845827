"""`adaspark chat` as a user runs it, in a terminal (a pseudo-terminal here), on the bundled model:
a closed terminal (SIGHUP, also sent to the engine process) or SIGTERM in the middle of a reply
quits as Ctrl+Q does. The reply stops, the message and the text generated so far are saved as a
stopped reply, and the app exits 0. Before, both ended the process at once: the message being
answered and its reply were lost, and an empty conversation was left in the store."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import sys
import time

import pytest

from benchmarks.ui.ui_cpu import spawn_in_pty

pytestmark = [pytest.mark.model, pytest.mark.long]

# At this seed and temperature the bundled model writes all 3000 tokens (about 14 s on 2 cores).
PROMPT = "Write a very long story about a dragon who bakes bread, in many paragraphs."
DRAFT = "and what about rye"
LOAD_TIMEOUT_S = 120.0
EXIT_TIMEOUT_S = 60.0


class Terminal:
    """A process on the slave side of a pseudo-terminal of 100x30; its screen output read here."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc, self.master = spawn_in_pty(argv, env, size=(100, 30), cwd=None)
        self.output = b""

    def read_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    self.output += os.read(self.master, 65536)
                except OSError:  # the process closed the terminal
                    return

    def wait_for(self, text: bytes, timeout: float) -> None:
        end = time.monotonic() + timeout
        while text not in self.output and time.monotonic() < end and self.proc.poll() is None:
            self.read_for(0.2)
        assert text in self.output, f"no {text!r} on the screen after {timeout} s"

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> int | None:
        """Wait for the process to end (reading what it writes meanwhile); its exit code."""
        end = time.monotonic() + EXIT_TIMEOUT_S
        while self.proc.poll() is None and time.monotonic() < end:
            self.read_for(0.2)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            code = None
        else:
            code = self.proc.returncode
        os.close(self.master)
        return code


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_closed_terminal_or_sigterm_mid_reply_saves_the_message_and_its_reply_so_far(tmp_path, sig):
    store = tmp_path / "chat.db"
    env = {**os.environ, "ADASPARK_STORE": str(store), "ADASPARK_CONFIG": str(tmp_path / "no-config.toml"),
           "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state"), "TERM": "xterm-256color",
           "COLUMNS": "100", "LINES": "30"}  # the terminal's size (pytest-xdist's workers export 80x24)
    term = Terminal([sys.executable, "-m", "adaspark_app.cli", "chat", "--max-tokens", "3000", "--temperature", "0.8",
                     "--seed", "1"], env)
    try:
        term.wait_for(b"Ready.", LOAD_TIMEOUT_S)  # the model has loaded
        term.type(PROMPT.encode() + b"\r")
        term.wait_for(b"Generating", 10.0)
        term.read_for(1.0)  # the reply is under way, far from its 3000 tokens
        assert term.proc.poll() is None
        # a closed terminal signals its whole process group: the engine process gets it too
        os.killpg(term.proc.pid, sig) if sig == signal.SIGHUP else term.proc.send_signal(sig)
    finally:
        code = term.close()
    assert code == 0
    with sqlite3.connect(store) as db:
        (conversations,) = db.execute("select count(*) from conversations").fetchone()
        messages = db.execute("select role, content, meta from messages order by id").fetchall()
    assert conversations == 1
    assert [m[0] for m in messages] == ["user", "assistant"]
    assert messages[0][1] == PROMPT
    reply, meta = messages[1][1], json.loads(messages[1][2])
    assert meta["stopped"] is True and reply.strip() and meta["n_tokens"] < 3000


def test_a_chat_killed_mid_reply_loses_neither_the_message_nor_the_text_so_far(tmp_path):
    """SIGKILL (or a crash) leaves no chance to save: the reply in flight and the message box's
    draft, written to the store as they change, are what the next `adaspark chat` keeps, and it
    says so."""
    store = tmp_path / "chat.db"
    env = {**os.environ, "ADASPARK_STORE": str(store), "ADASPARK_CONFIG": str(tmp_path / "no-config.toml"),
           "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state"), "TERM": "xterm-256color",
           "COLUMNS": "100", "LINES": "30"}
    argv = [sys.executable, "-m", "adaspark_app.cli", "chat", "--max-tokens", "3000", "--temperature", "0.8",
            "--seed", "1"]
    term = Terminal(argv, env)
    try:
        term.wait_for(b"Ready.", LOAD_TIMEOUT_S)
        term.type(PROMPT.encode() + b"\r")
        term.wait_for(b"Generating", 10.0)
        term.type(DRAFT.encode())  # typed while the reply streams, not sent
        term.read_for(2.5)  # the text so far and the draft are written every second
        assert term.proc.poll() is None
        os.killpg(term.proc.pid, signal.SIGKILL)  # the chat and its engine process, with no warning
    finally:
        term.close()
    with sqlite3.connect(store) as db:
        assert db.execute("select count(*) from messages").fetchone() == (0,)  # nothing was recorded
        ((left,),) = db.execute("select content from replies_in_flight").fetchall()
    assert left.strip()

    again = Terminal([*argv, "--continue"], env)  # the conversation the reply was in
    try:
        again.wait_for(b"Ready.", LOAD_TIMEOUT_S)
        again.wait_for(b"generated so far", 10.0)  # the notice
        again.wait_for(DRAFT.encode(), 10.0)  # back in the message box
        again.type(b"\x11")  # Ctrl+Q
    finally:
        code = again.close()
    assert code == 0
    with sqlite3.connect(store) as db:
        messages = db.execute("select role, content, meta from messages order by id").fetchall()
        assert db.execute("select count(*) from replies_in_flight").fetchone() == (0,)
    assert [(m[0], m[1]) for m in messages] == [("user", PROMPT), ("assistant", left)]
    meta = json.loads(messages[1][2])
    assert meta["chat_ended"] is True and 0 < meta["n_tokens"] < 3000
    with sqlite3.connect(store) as db:
        assert db.execute("select text from drafts").fetchall() == [(DRAFT,)]
