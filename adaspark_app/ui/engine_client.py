"""The engine process, seen from the UI: start it, send it replies to make, stop, restart, close.

`EngineClient` spawns `adaspark_app.engine.worker.serve` with the "spawn" context and owns one
thread, `engine-io`, that starts each engine process and then reads its event pipe, turning
each message into a Textual message posted to the app (`post_message` is thread-safe). The UI
thread only writes commands to the other pipe and sets the shared cancel flag: it never waits
on the engine and never imports llama_cpp.

Priority: on Linux a thread's nice value is its own and a child inherits its creator's, so the
io thread is made before the UI lowers its priority (`lower_ui_priority`) and every engine
process, restarts included, is spawned from it at the priority the user started with.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import sys
import threading
from typing import Any, Callable

from textual.message import Message

from ..engine.events import ReadAhead, ReplyResult, RoundEvent
from ..engine.worker import CancelFlag, serve

UI_NICE = 19  # the UI's niceness while it runs: see lower_ui_priority
PRIORITY_ENV = "ADASPARK_UI_PRIORITY"  # "normal" (the default), "low" or "idle": see lower_ui_priority
PRIORITIES = ("low", "idle", "normal")
DEFAULT_PRIORITY = "normal"


# The engine's messages are posted to the app, which passes them on to the chat screen: none
# bubbles (from the screen back up to the app, which would pass it on again).


class EngineLoaded(Message, bubble=False):
    """The engine process has built its engine."""

    def __init__(self, model_name: str | None, drafter_name: str | None, notices: list[str],
                 gauges: dict[str, Any] | None, pid: int, restarted: bool, n_ctx: int | None = None,
                 device: str | None = None, opens_thinking: bool = False) -> None:
        super().__init__()
        self.n_ctx = n_ctx  # the context the engine opened, in tokens (None: not told)
        self.device = device  # where the model runs ("CPU, 2 threads", "NVIDIA H200, all layers")
        self.opens_thinking = opens_thinking  # the model's prompt opens its thinking (thinking.py)
        self.model_name = model_name
        self.drafter_name = drafter_name
        self.notices = notices
        self.gauges = gauges
        self.pid = pid
        self.restarted = restarted


class EngineLoadFailed(Message, bubble=False):
    """Building the engine failed; `error` is the one-line message for the user."""

    def __init__(self, error: str, restarted: bool) -> None:
        super().__init__()
        self.error = error
        self.restarted = restarted


class EnginePrefill(Message, bubble=False):
    """A long prompt is being read before the reply's first token: `done` of `total` tokens."""

    def __init__(self, request_id: int, done: int, total: int) -> None:
        super().__init__()
        self.request_id = request_id
        self.done = done
        self.total = total


class EngineReadingAhead(Message, bubble=False):
    """A long history (and the message typed so far) is being read ahead of its next message:
    `done` of `total` tokens (conversation_id None: a new conversation's)."""

    def __init__(self, conversation_id: str | None, done: int, total: int) -> None:
        super().__init__()
        self.conversation_id = conversation_id
        self.done = done
        self.total = total


class EngineReadAhead(Message, bubble=False):
    """The engine has read a conversation's history ahead (whole, or until the next command;
    None: the reading failed, the engine's log says why)."""

    def __init__(self, result: ReadAhead | None) -> None:
        super().__init__()
        self.result = result


class EngineRounds(Message, bubble=False):
    """A batch of a reply's rounds: events in round order, the monotonic time of each."""

    def __init__(self, request_id: int, events: list[RoundEvent], times: list[float],
                 gauges: dict[str, Any] | None) -> None:
        super().__init__()
        self.request_id = request_id
        self.events = events
        self.times = times
        self.gauges = gauges


class EngineDone(Message, bubble=False):
    """A reply ended (complete, at the token cap, or stopped by the user)."""

    def __init__(self, request_id: int, result: ReplyResult, gauges: dict[str, Any] | None) -> None:
        super().__init__()
        self.request_id = request_id
        self.result = result
        self.gauges = gauges


class EngineStopped(Message, bubble=False):
    """A reply was cancelled before it started (no token was generated)."""

    def __init__(self, request_id: int) -> None:
        super().__init__()
        self.request_id = request_id


class EngineReplyFailed(Message, bubble=False):
    """The engine raised while making a reply; the engine process goes on."""

    def __init__(self, request_id: int, error: str) -> None:
        super().__init__()
        self.request_id = request_id
        self.error = error


class EngineDied(Message, bubble=False):
    """The engine process ended without being asked to (a crash, or killed); `reason`: the error
    line it wrote to its log before it ended (a failed llama.cpp check), None where it wrote none."""

    def __init__(self, exitcode: int | None, pid: int | None, reason: str | None = None) -> None:
        super().__init__()
        self.exitcode = exitcode
        self.pid = pid
        self.reason = reason


ERROR_PREFIX = "adaspark: error: "
_LOG_TAIL = 16384


def last_error_line(log_path: str | None, since: int) -> str | None:
    """The last ``adaspark: error:`` line the engine process wrote to `log_path` after byte
    `since` (the log's size when the process started: an earlier crash's line is not this one's),
    without the prefix; None where there is none or the log cannot be read."""
    if not log_path:
        return None
    try:
        with open(log_path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(since, end - _LOG_TAIL))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line[len(ERROR_PREFIX):].strip() for line in tail.splitlines() if line.startswith(ERROR_PREFIX)]
    return lines[-1] if lines and lines[-1] else None


def _log_size(log_path: str | None) -> int:
    try:
        return os.path.getsize(log_path) if log_path else 0
    except OSError:
        return 0


def lower_ui_priority(priority: str | None = None) -> str:
    """Lower the calling thread's CPU priority so the OS gives llama.cpp's threads the cores;
    threads it creates later inherit it (on Linux both the nice value and the policy belong to
    the thread, so the engine processes, spawned from the io thread made earlier, keep theirs).
    Returns what was applied: "low" (nice 19), "idle" (nice 19 and SCHED_IDLE) or "normal".

    Why it can be lowered: on two cores with two llama.cpp threads every slice the UI runs
    preempts a verify, and the decode runs at the speed of its slowest thread. At nice 19 the UI
    gets a small share and the gaps; SCHED_IDLE also lets a waking llama.cpp thread preempt it at
    once. Off Linux the nice value is the process's, which the engine would inherit, so nothing
    is changed there.

    Why the default is "normal": since the UI's own work per reply is small (issue 17), starving
    it costs more than it saves. On Qwen2.5-Coder-1.5B, two held-out sets each way, TUI over
    headless was 0.976x and 1.001x at normal against 0.961x and 0.947x at nice 19, and the longest
    wait of a reply's text to be drawn fell from 1.2-1.3 s to 0.6-0.7 s
    (benchmarks/results/tui-vs-headless/README.md). `ADASPARK_UI_PRIORITY` chooses.
    """
    if priority is None:
        priority = os.environ.get(PRIORITY_ENV, "")
    priority = priority.strip().lower()
    if priority not in PRIORITIES:
        priority = DEFAULT_PRIORITY
    if priority == "normal" or not sys.platform.startswith("linux"):
        return "normal"
    try:
        os.nice(UI_NICE)
    except OSError:
        return "normal"
    if priority == "idle":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError):
            return "low"
    return priority


class EngineClient:
    """One engine process at a time, restartable; requests are numbered so late messages of an
    abandoned reply (after a restart) are recognised and dropped by the UI."""

    def __init__(self, factory: Callable[[], Any], post: Callable[[Message], Any], *,
                 log_path: str | None = None) -> None:
        self._factory = factory
        self._post = post
        self.log_path = log_path  # where the engine process writes what it prints
        self._ctx = multiprocessing.get_context("spawn")
        self._ids = itertools.count(1)
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._closing = False
        self._starts = 0
        self._commands: Any = None  # the UI's end of the command pipe (None while no process)
        self._process: Any = None
        self.cancel_flag: CancelFlag | None = None
        self.ready = False  # the current process has loaded its engine
        self.error: str | None = None  # the last load error
        self.pid: int | None = None
        self.loads = 0  # engines loaded so far (1 + successful restarts)
        self.pending: int | None = None  # request id of the reply in progress
        self._queued: tuple | None = None  # a generate command waiting for the process to exist
        self._cancel_queued = False
        self._superseded: Any = None  # the process `switch` replaced, while it closes
        # multiprocessing's resource tracker is started with the stderr fd it finds; started later,
        # inside the running app, that would be Textual's stand-in for stderr, which has no fd.
        try:
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()
        except Exception:
            pass
        # Made now, before the UI lowers its priority: engine processes inherit the io thread's.
        self._thread = threading.Thread(target=self._io_loop, name="engine-io", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ UI thread API
    @property
    def alive(self) -> bool:
        p = self._process
        return p is not None and p.is_alive()

    def start(self) -> None:
        """Start (or restart) the engine process; returns at once, `EngineLoaded` follows."""
        with self._lock:
            if self._closing:
                return
            self.ready = False
            self.error = None
            self._starts += 1
        self._wake.set()

    def generate(self, conversation_id: str, messages: list[dict[str, str]], max_tokens: int, turn: int,
                 sampling: Any = None) -> int:
        """Ask for a reply; returns its request id. A request made while the model loads (or
        while a restart spawns the process) waits and is answered once the engine is there.
        Raises RuntimeError if the client is closed or was never started."""
        with self._lock:
            if self._closing or self._starts == 0:
                raise RuntimeError("the engine is not running")
            request_id = next(self._ids)
            command = ("generate", request_id, conversation_id, messages, max_tokens, turn, sampling)
            self.pending = request_id
            if self._commands is None or self.cancel_flag is None:
                self._queued = command  # sent by the io thread as soon as the process exists
                self._cancel_queued = False
                return request_id
            self.cancel_flag.clear()  # the previous reply has ended: its stop must not stop this one
            try:
                self._commands.send(command)
            except (OSError, ValueError) as err:
                self.pending = None
                raise RuntimeError(f"the engine is not running ({err})") from None
        return request_id

    def read_ahead(self, conversation_id: str | None, messages: list[dict[str, str]], max_tokens: int,
                   draft: str = "") -> bool:
        """Ask the engine to read the history `messages` of the conversation the chat shows into its
        cache before the next message is sent, and `draft`, the message as far as it is typed
        (`ChatEngine.read_ahead`; conversation_id None: a new conversation); it stops as soon as the
        next command arrives. Only a loaded engine is asked (the chat asks again when one loads).
        Returns whether it was asked."""
        with self._lock:
            if self._closing or self._commands is None or not self.ready:
                return False
            try:
                self._commands.send(("read_ahead", conversation_id, messages, max_tokens, draft))
            except (OSError, ValueError):
                return False
        return True

    def cancel(self) -> None:
        """Stop the reply in progress after its current round (never blocks)."""
        with self._lock:
            if self._queued is not None:
                self._cancel_queued = True
                return
            flag = self.cancel_flag
        if flag is not None:
            flag.set()

    def reply_ended(self, request_id: int) -> None:
        """The UI is done with `request_id` (answered, or given back): a copy of it still queued
        for a process yet to start (one whose start failed) must not be sent to the next one."""
        with self._lock:
            if self.pending == request_id:
                self.pending = None
            if self._queued is not None and self._queued[1] == request_id:
                self._queued = None

    def switch(self, factory: Callable[[], Any]) -> None:
        """Replace the engine process by one built from `factory` (the model picker: another
        model). The current process is asked to close (it saves nothing more: no reply runs);
        the io thread, made before the UI lowered its priority, then spawns the new one, so it
        runs at the user's priority as the first did. `EngineLoaded` (restarted) follows."""
        with self._lock:
            if self._closing:
                return
            self._factory = factory
            self.ready = False
            self.pending = None
            self._queued = None
            commands = self._commands
            self._superseded = self._process  # its late "loaded" must not announce the old model
            # a reply asked for from now on waits for the new process (the io thread sends it)
            self._commands, self.cancel_flag = None, None
        if commands is not None:
            try:
                commands.send(("close",))
            except (OSError, ValueError):
                pass  # already gone: the io thread sees it and starts the new one
        self.start()

    def kill(self) -> None:
        """Kill the engine process (tests; a crash looks the same to the UI)."""
        p = self._process
        if p is not None and p.pid and p.exitcode is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self, timeout: float = 10.0) -> bool:
        """Stop a running reply, ask the engine to close, and wait for it (then kill it).
        Returns False if it had to be killed. Safe to call twice and from any thread."""
        with self._lock:
            self._closing = True
            commands, process = self._commands, self._process
        self.cancel()
        self._wake.set()
        clean = True
        if process is not None:
            try:
                commands.send(("close",))
            except (OSError, ValueError, AttributeError):
                pass
            process.join(timeout)
            if process.is_alive():
                clean = False
                process.kill()
                process.join(2.0)
        self._thread.join(timeout)
        return clean

    @property
    def exitcode(self) -> int | None:
        p = self._process
        return None if p is None else p.exitcode

    # ------------------------------------------------------------------ the io thread
    def _io_loop(self) -> None:
        """Thread boundary: spawns engine processes and reads their events; touches no widget."""
        while True:
            self._wake.wait()
            with self._lock:
                self._wake.clear()
                if self._closing:
                    return
                restarted = self._starts > 1
            self._run_one(restarted)
            with self._lock:
                if self._closing:
                    return

    def _run_one(self, restarted: bool) -> None:
        ctx = self._ctx
        cmd_recv, cmd_send = ctx.Pipe(duplex=False)
        ev_recv, ev_send = ctx.Pipe(duplex=False)
        flag = CancelFlag(ctx)
        process = ctx.Process(target=serve, args=(cmd_recv, ev_send, flag, self._factory, self.log_path),
                              name="adaspark-engine", daemon=True)
        log_start = _log_size(self.log_path)
        try:
            process.start()
        except Exception as err:
            self._post(EngineLoadFailed(f"could not start the engine process: {err}", restarted))
            return
        cmd_recv.close()
        ev_send.close()
        with self._lock:
            self._process, self._commands, self.cancel_flag = process, cmd_send, flag
            self.pid = process.pid
            closing = self._closing
            queued, self._queued = self._queued, None
            if queued is not None and self._cancel_queued:
                flag.set()  # stopped while it waited: the engine answers "stopped"
            try:
                if queued is not None:
                    cmd_send.send(queued)
                if closing:
                    cmd_send.send(("close",))
            except OSError:
                pass  # the process died at once: the read below sees it
        asked_to_close = False
        try:
            while True:
                try:
                    msg = ev_recv.recv()
                except (EOFError, OSError):
                    break
                kind = msg[0]
                if process is self._superseded:  # replaced by `switch`: nothing it says concerns the UI
                    asked_to_close = asked_to_close or kind in ("closed", "load_failed")
                    continue
                if kind == "rounds":
                    self._post(EngineRounds(msg[1], msg[2], msg[3], msg[4]))
                elif kind == "prefill":
                    self._post(EnginePrefill(msg[1], msg[2], msg[3]))
                elif kind == "reading_ahead":
                    self._post(EngineReadingAhead(msg[1], msg[2], msg[3]))
                elif kind == "read_ahead":
                    self._post(EngineReadAhead(msg[1]))
                elif kind == "done":
                    self._post(EngineDone(msg[1], msg[2], msg[3]))
                elif kind == "loaded":
                    info = msg[1]
                    self.ready = True
                    self.loads += 1
                    self._post(EngineLoaded(info["model_name"], info["drafter_name"], info["notices"],
                                            info["gauges"], info["pid"], restarted, info.get("n_ctx"),
                                            info.get("device"), bool(info.get("opens_thinking"))))
                elif kind == "stopped":
                    self._post(EngineStopped(msg[1]))
                elif kind == "failed":
                    self._post(EngineReplyFailed(msg[1], msg[2]))
                elif kind == "load_failed":
                    self.error = msg[1]
                    asked_to_close = True  # the process exits by itself after a failed load
                    self._post(EngineLoadFailed(msg[1], restarted))
                elif kind == "closed":
                    asked_to_close = True
        finally:
            ev_recv.close()
            process.join(5.0)
            with self._lock:
                self.ready = False
                self._commands = None
                closing = self._closing
            try:
                cmd_send.close()
            except OSError:
                pass
        if not closing and not asked_to_close and process is not self._superseded:
            self._post(EngineDied(process.exitcode, process.pid, last_error_line(self.log_path, log_start)))
