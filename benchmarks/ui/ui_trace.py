"""Instrumentation for `ui_decode_profile.py`, imported into the chat's own process (never by the app).

Writes one JSON line per event to the file named by $ADASPARK_UI_TRACE:

- `send` / `done`: the request leaving for the engine, and the reply's end (`decode_s`, the
  engine time of its last round), each with every thread's CPU so far (`/proc/self/task/*/schedstat`, ns);
- `rounds`: a batch of rounds handled by the UI thread, with its lag (now less the engine time of
  its first round: how late the UI took the text in);
- `handle`: an event-loop callback of the UI thread that used more than 2 ms of CPU;
- `cpu`: the process's CPU time (all threads), sampled every 20 ms by a thread of its own (that
  thread costs ~0.5% of a core, counted in the figures and reported apart).
"""

from __future__ import annotations

import asyncio.events
import json
import os
import threading
import time

from adaspark_app.ui import engine_client
from adaspark_app.ui.screens import replies

_LOG = open(os.environ["ADASPARK_UI_TRACE"], "a", buffering=1)
_LOCK = threading.Lock()


def _write(kind: str, **fields) -> None:
    with _LOCK:
        _LOG.write(json.dumps({"k": kind, "t": time.monotonic(), **fields}) + "\n")


def _threads() -> dict[str, int]:
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError):
            continue
        out[names.get(int(tid), f"native-{tid}")] = ns
    return out


_run = asyncio.events.Handle._run


def _timed_run(self) -> None:
    t0 = time.thread_time()
    try:
        return _run(self)
    finally:
        used = time.thread_time() - t0
        if used > 0.002:
            _write("handle", cpu=used)


asyncio.events.Handle._run = _timed_run

_generate = engine_client.EngineClient.generate


def _traced_generate(self, *args, **kwargs):
    _write("send", threads=_threads())
    return _generate(self, *args, **kwargs)


engine_client.EngineClient.generate = _traced_generate

_rounds = replies.ReplyRunner.rounds
_last_round = [None]


async def _traced_rounds(self, message, *args, **kwargs):
    if message.times:
        _write("rounds", lag=time.monotonic() - message.times[0])
        _last_round[0] = message.times[-1]
    return await _rounds(self, message, *args, **kwargs)


replies.ReplyRunner.rounds = _traced_rounds

_done = replies.ReplyRunner.done


async def _traced_done(self, message, *args, **kwargs):
    _write("done", threads=_threads(), decode_s=message.result.decode_s, n_tokens=message.result.n_tokens,
           last_round=_last_round[0])
    _last_round[0] = None
    return await _done(self, message, *args, **kwargs)


replies.ReplyRunner.done = _traced_done


def _sample() -> None:
    while True:
        t = os.times()
        _write("cpu", cpu=t.user + t.system)
        time.sleep(0.02)


threading.Thread(target=_sample, name="trace-sampler", daemon=True).start()
