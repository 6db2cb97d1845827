"""Stopping a headless command (adaspark_app.interrupts, hard_exit): Ctrl+C, SIGTERM and SIGHUP
stop it as Ctrl+C always did, and a second one ends it at once, its temporary stores removed, in
real processes sent real signals; the llama.cpp hang it was made for is the opt-in target test in
test_real_targets.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: A process inside stops_on_signals whose main thread then sits in one C call that a signal does
#: not end (libc's sleep with the stop signals blocked in that thread, as a forward inside
#: llama.cpp sits), so Python never gets to raise there. Where the first signal comes before the
#: call starts, its KeyboardInterrupt goes to a second such call (a first stop whose end waits on
#: llama.cpp too). It holds a temporary folder, as `run --fresh-store` holds its store.
STUCK_IN_C = """
import ctypes, signal, sys
from adaspark_app.hard_exit import TemporaryDir
from adaspark_app.interrupts import STOP_SIGNALS, stops_on_signals
with stops_on_signals():
    scratch = TemporaryDir(prefix="adaspark-test-")
    signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
    try:
        print("ready", scratch.name, flush=True)
        ctypes.CDLL(None).sleep(60)
    except KeyboardInterrupt:
        ctypes.CDLL(None).sleep(60)
print("the C call returned", flush=True)
"""


def _start(code: str, *, ignore_hup: bool = False) -> tuple[subprocess.Popen, str]:
    def child_signals() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background job's SIGINT is ignored otherwise
        if ignore_hup:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as `nohup` starts a command

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=child_signals)
    first = proc.stdout.readline().split()
    assert first[:1] == ["ready"], proc.stderr.read()
    return proc, " ".join(first[1:])


@pytest.mark.parametrize("signame, code, line", [
    ("SIGINT", 130, "adaspark: interrupted (a second Ctrl+C: stopped at once)"),
    ("SIGTERM", 143, "adaspark: stopped at once (a second stop signal: SIGTERM)"),
    ("SIGHUP", 129, "adaspark: stopped at once (a second stop signal: SIGHUP)"),
])
def test_the_second_stop_ends_a_process_stuck_in_a_c_call_and_removes_its_temporary_folder(signame, code, line):
    proc, scratch = _start(STUCK_IN_C)
    try:
        assert Path(scratch).is_dir()
        proc.send_signal(getattr(signal, signame))
        time.sleep(1.0)
        assert proc.poll() is None, proc.stderr.read()  # the first is Python's: raised when the main thread gets to it
        proc.send_signal(getattr(signal, signame))
        assert proc.wait(timeout=10) == code
        assert proc.stderr.read().strip() == line
        assert not Path(scratch).exists()  # os._exit skips every finally: hard_exit removed it
    finally:
        proc.kill()


def test_a_stop_and_then_ctrl_c_also_ends_it_at_once():
    proc, _ = _start(STUCK_IN_C)
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 130
    finally:
        proc.kill()


#: The first stop outside a C call: which exception, and what the CLI makes of it.
FIRST_STOP = """
import signal, threading, time
from adaspark_app.interrupts import exit_code, stop_words, stops_on_signals
with stops_on_signals():
    pass
assert signal.set_wakeup_fd(-1) == -1
assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
time.sleep(0.2)
assert not any(t.name == "stop-signals" for t in threading.enumerate())
try:
    with stops_on_signals():
        print("ready", flush=True)
        time.sleep(60)
except KeyboardInterrupt as exc:
    print(type(exc).__name__, exit_code(exc), stop_words(exc), flush=True)
"""


@pytest.mark.parametrize("signame, seen", [
    ("SIGINT", "KeyboardInterrupt 130 interrupted"),
    ("SIGTERM", "Stopped 143 terminated (SIGTERM)"),
    ("SIGHUP", "Stopped 129 stopped: the terminal closed (SIGHUP)"),
])
def test_the_first_stop_is_a_keyboard_interrupt_and_a_quiet_block_leaves_no_watch(signame, seen):
    """Outside a C call the first stop raises KeyboardInterrupt (SIGTERM's and SIGHUP's a Stopped
    naming the signal); a block that saw none puts the previous wakeup fd and handlers back and
    ends its watcher."""
    proc, _ = _start(FIRST_STOP)
    try:
        proc.send_signal(getattr(signal, signame))
        assert proc.wait(timeout=10) == 0, proc.stderr.read()
        assert proc.stdout.read().strip() == seen
    finally:
        proc.kill()


def test_a_sighup_nohup_ignores_stays_ignored():
    code = FIRST_STOP.replace("with stops_on_signals():\n    pass\n", "").replace(
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL\n", "")
    proc, _ = _start(code, ignore_hup=True)
    try:
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.stderr.read()
        assert proc.stdout.read().strip() == "Stopped 143 terminated (SIGTERM)"
    finally:
        proc.kill()


def _cli(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))  # where --fresh-store's and bench's stores go
    (tmp_path / "tmp").mkdir()
    return subprocess.Popen([sys.executable, "-m", "adaspark_app.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_lines(path: Path, proc: subprocess.Popen, count: int = 1) -> None:
    deadline = time.time() + 240
    while time.time() < deadline:
        if path.exists() and path.read_text().count("\n") >= count:
            return
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    raise AssertionError(f"no {count} lines in {path}")


def _stop_once_written(proc: subprocess.Popen, path: Path, count: int, signum: int, code: int,
                       delay: float = 0.0) -> str:
    """Send `signum` once `path` has `count` lines (and `delay` seconds more), check that the
    process ends with `code`, and give its stderr; the process is killed whatever happens."""
    try:
        _wait_for_lines(path, proc, count)
        time.sleep(delay)
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == code, proc.stderr.read()
        return proc.stderr.read()
    finally:
        proc.kill()


def _script(tmp_path: Path, public_prompts: list, count: int) -> Path:
    script = tmp_path / "s.jsonl"
    script.write_text("".join(json.dumps({"id": f"c{i}", "turns": p["turns"][:1]}) + "\n"
                              for i, p in enumerate(public_prompts[:count])))
    return script


@pytest.mark.model
def test_sigterm_stops_run_as_ctrl_c_does_keeping_its_replies_and_removing_its_fresh_store(tmp_path, public_prompts):
    """`kill` (or `timeout`) on `adaspark run --fresh-store`: the finished replies stay in --out,
    the last line says what stopped it, the exit code is 143, and the temporary store is gone (it
    was killed where it stood before: no line, -15, the store left behind)."""
    out = tmp_path / "out.jsonl"
    proc = _cli(tmp_path, "run", str(_script(tmp_path, public_prompts, 12)), "--fresh-store", "--max-tokens", "64",
                "--out", str(out))
    said = _stop_once_written(proc, out, 1, signal.SIGTERM, 143)
    assert said.strip().splitlines()[-1] == "adaspark: terminated (SIGTERM)"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 1 <= len(rows) <= 12 and rows[0]["conversation"] == "c0" and rows[0]["text"]
    assert not any(r["stopped"] for r in rows[:-1])  # only a reply in progress (none between two) ends stopped
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.model
def test_ctrl_c_keeps_runs_reply_in_progress_as_far_as_it_got(tmp_path):
    """The first Ctrl+C ends the reply in progress at its next round: it is written, marked
    stopped, and is the start of the reply the run gives uninterrupted; no turn starts after it
    (before, the reply in progress was lost)."""
    script = tmp_path / "s.jsonl"
    rows_in = [{"id": "hi", "turns": ["Say hello."]},
               {"id": "story", "turns": ["Write a long story about a dragon and a knight.", "Another one."]}]
    script.write_text("".join(json.dumps(r) + "\n" for r in rows_in))
    out = tmp_path / "out.jsonl"
    proc = _cli(tmp_path, "run", str(script), "--fresh-store", "--max-tokens", "400", "--out", str(out))
    said = _stop_once_written(proc, out, 1, signal.SIGINT, 130, delay=0.3)  # 0.3 s: into the story's reply
    assert said.strip().splitlines()[-1] == "adaspark: interrupted"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["conversation"], r["turn"], r["stopped"]) for r in rows] == [("hi", 0, False), ("story", 0, True)]
    assert 0 < rows[1]["n_tokens"] < 400 and rows[1]["text"]
    script.write_text(json.dumps(rows_in[1] | {"turns": rows_in[1]["turns"][:1]}) + "\n")
    whole = subprocess.run([sys.executable, "-m", "adaspark_app.cli", "run", str(script), "--fresh-store",
                            "--max-tokens", "400"], capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr
    full = json.loads(whole.stdout)["text"]
    assert full.startswith(rows[1]["text"]) and len(full) > len(rows[1]["text"])


@pytest.mark.model
def test_sigterm_stops_bench_with_its_partial_report(tmp_path, public_prompts):
    report = tmp_path / "report"
    proc = _cli(tmp_path, "bench", str(_script(tmp_path, public_prompts, 12)), "--arms", "ar,adaspark",
                "--max-tokens", "48", "--report", str(report), "--no-progress")
    said = " ".join(_stop_once_written(proc, report / "replies.jsonl", 2, signal.SIGTERM, 143).split())  # rich wraps
    assert f"terminated (SIGTERM): partial report written to {report}" in said
    meta = json.loads((report / "report.json").read_text())["meta"]
    assert meta["interrupted"] is True and 2 <= meta["replies_done"] < meta["replies_planned"]
    assert (report / "report.md").is_file()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_killed_processs_temporary_folder_is_removed_by_the_next_one_and_a_live_ones_is_not(tmp_path, monkeypatch):
    """SIGKILL runs nothing, so a folder outlives its owner; its lock does not (the kernel drops it),
    and the next TemporaryDir of that prefix removes the folders whose lock nobody holds: not a live
    process's, nor one without a lock (another version's)."""
    import tempfile

    from adaspark_app.hard_exit import TemporaryDir

    code = ("import sys, time\nfrom adaspark_app.hard_exit import TemporaryDir\n"
            "d = TemporaryDir(prefix='adaspark-test-')\nprint('ready', d.name, flush=True)\ntime.sleep(60)\n")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    owners = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
              for _ in range(2)]
    try:
        killed, live = (Path(p.stdout.readline().split()[1]) for p in owners)
        owners[0].kill()
        owners[0].wait(timeout=10)
        (tmp_path / "adaspark-test-old").mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        assert killed.is_dir() and live.is_dir()
        mine = TemporaryDir(prefix="adaspark-test-")
        assert not killed.exists()
        assert live.is_dir() and (tmp_path / "adaspark-test-old").is_dir() and Path(mine.name).is_dir()
        mine.cleanup()
        assert not Path(mine.name).exists()
    finally:
        for p in owners:
            p.kill()
