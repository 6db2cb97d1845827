"""A second Ctrl+C ends a headless command at once (adaspark_app.interrupts), in real processes
sent real SIGINTs; the llama.cpp hang it was made for is the opt-in target test in
test_real_targets.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

#: A process inside second_interrupt_exits whose main thread then sits in one C call that a
#: SIGINT does not end (libc's sleep with SIGINT blocked in that thread, as a forward inside
#: llama.cpp sits), so Python never gets to raise KeyboardInterrupt there. Where the first SIGINT
#: comes before the call starts, its KeyboardInterrupt goes to a second such call (a first Ctrl+C
#: whose stop waits on llama.cpp too).
STUCK_IN_C = """
import ctypes, signal, sys
from adaspark_app.interrupts import second_interrupt_exits
with second_interrupt_exits():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        print("ready", flush=True)
        ctypes.CDLL(None).sleep(60)
    except KeyboardInterrupt:
        ctypes.CDLL(None).sleep(60)
print("the C call returned", flush=True)
"""


def _start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_the_second_ctrl_c_ends_a_process_stuck_in_a_c_call_and_the_first_does_not():
    proc = _start(STUCK_IN_C)
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None, proc.stderr.read()  # the first is Python's: raised when the main thread gets to it
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 130
        assert proc.stderr.read().strip() == "adaspark: interrupted (a second Ctrl+C: stopped at once)"
    finally:
        proc.kill()


def test_the_first_ctrl_c_is_still_a_keyboard_interrupt_and_a_quiet_block_leaves_no_watch():
    """Outside a C call the first SIGINT raises KeyboardInterrupt as before; a block that saw none
    puts the previous wakeup fd back and ends its watcher."""
    code = """
import signal, threading, time
from adaspark_app.interrupts import second_interrupt_exits
with second_interrupt_exits():
    pass
assert signal.set_wakeup_fd(-1) == -1
time.sleep(0.2)
assert not any(t.name == "second-interrupt" for t in threading.enumerate())
try:
    with second_interrupt_exits():
        print("ready", flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
"""
    proc = _start(code)
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0, proc.stderr.read()
        assert proc.stdout.read().strip() == "KeyboardInterrupt"
    finally:
        proc.kill()
