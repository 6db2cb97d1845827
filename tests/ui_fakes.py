"""Test support for the UI: a scripted engine, a recording wrapper for the real one, and polling.

The app runs every engine in its own process (spawned: `adaspark_app/ui/engine_client.py`), so
what a test hands the app is a picklable *factory* that the engine process calls:

- `scripted(...)` builds a `ScriptedEngine` there. It has ChatEngine's interface and emits
  RoundEvents like the real engine (a prefill token first, then verify rounds with widths,
  sources and offered prices) on a synthetic clock, so the panel's figures are the same on every
  machine and snapshot tests are stable. It replaces only the model: the process, the pipes, the
  cancel flag and the UI are the real ones.
- `recording(EngineConfig(...), log)` wraps the real ChatEngine and logs what it was asked.

What the engine process saw is read back from a JSON-lines log (`read_log`); a test steers a
scripted reply with `spawn_event()`s (multiprocessing Events of the spawn context, the only kind a
spawned process can share).
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable

from adaspark_app.engine.events import ReplyResult, RoundEvent

TOKEN_RE = re.compile(r"\s*\S+|\s+")
PRICES_S = {1: 0.010, 2: 0.0185, 4: 0.029, 8: 0.048}  # verify seconds by width (DESIGN.md ratios)
ROUND_S = 0.02  # synthetic decode seconds per round
SPAWN = multiprocessing.get_context("spawn")


def spawn_event() -> Any:
    """An Event shared with the engine process (created before the app starts it)."""
    return SPAWN.Event()


def _log(path: str | None, record: dict[str, Any]) -> None:
    if path is None:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def read_log(path: str | os.PathLike, event: str | None = None) -> list[dict[str, Any]]:
    """The records an engine process wrote to `path` (only those of `event`, if given)."""
    p = Path(path)
    if not p.exists():
        return []
    rows = [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if event is None or r.get("event") == event]


class ScriptedEngine:
    """Same interface as `ChatEngine`; replies come from `replies` in turn (the last one repeats).

    `fail` is raised after `fail_after_rounds` rounds of each call listed in `fail_calls` (all
    calls when None). With `hold_after_rounds`, a reply sets `held` at that round and waits for
    `gate` (or a cancel), as a slow round would.
    """

    def __init__(self, replies: list[str] | None = None, *, round_sleep: float = 0.002,
                 committed: tuple[int, ...] = (2, 3, 1, 4), widths: tuple[int, ...] = (4, 8, 1, 4),
                 fail: BaseException | None = None, fail_after_rounds: int = 0,
                 fail_calls: tuple[int, ...] | None = None,
                 hold_after_rounds: int | None = None, held: Any = None, gate: Any = None,
                 model_name: str = "Scripted-135M (test)", drafter_name: str | None = None,
                 load_seconds: float = 0.0, log_path: str | None = None,
                 learned_not_saved: str | None = None, read_ahead_fails: bool = False,
                 opens_thinking: bool = False) -> None:
        if load_seconds:
            time.sleep(load_seconds)
        self.replies = list(replies or ["Hello! I am a **scripted** reply."])
        self.round_sleep = round_sleep
        self.committed = committed
        self.widths = widths
        self.fail = fail
        self.fail_after_rounds = fail_after_rounds
        self.fail_calls = fail_calls
        self.hold_after_rounds = hold_after_rounds
        self.held = held if held is not None else threading.Event()
        self.gate = gate if gate is not None else threading.Event()
        self.model_name = model_name
        self.drafter_name = drafter_name
        self.notices: list[str] = []
        self.log_path = log_path
        self.learned_not_saved = learned_not_saved  # what each reply says of its learning's save
        self.read_ahead_fails = read_ahead_fails  # a reading that counts its start, then raises
        self.opens_thinking = opens_thinking  # as a DeepSeek-R1 distill's template: replies start thinking
        self.calls = 0
        self.rounds_total = 0
        self.closed = False
        _log(log_path, {"event": "load", "pid": os.getpid()})

    # ------------------------------------------------------------------ ChatEngine interface
    def generate(self, conversation_id: str, messages: list[dict[str, str]], max_tokens: int = 512,
                 on_round: Callable[[RoundEvent], None] | None = None,
                 cancel: Any = None, turn: int = 0, sampling: Any = None, on_prefill: Any = None) -> ReplyResult:
        if self.closed:
            raise RuntimeError("engine is closed")
        call = self.calls
        self.calls += 1
        # A sampled reply's seed, as the real engine reports it: the given one, else a random one.
        resolved = sampling.resolved() if sampling is not None and not sampling.greedy else None
        _log(self.log_path, {"event": "generate", "conversation": conversation_id, "messages": messages,
                             "turn": turn, "max_tokens": max_tokens, "pid": os.getpid(),
                             "thread": threading.current_thread().name,
                             "sampling": sampling.to_json() if sampling is not None else None})
        reply = self.replies[min(call, len(self.replies) - 1)]
        pieces = TOKEN_RE.findall(reply)[:max_tokens]
        context = sum(len(m["content"]) for m in messages) // 4 + 8
        emitted: list[str] = []
        seconds = 0.0
        stopped = False
        widths: dict[int, int] = {}
        rows: dict[str, int] = {"drafter": 0, "ngram": 0, "agreed": 0}
        accepted_src: dict[str, int] = {"drafter": 0, "ngram": 0, "agreed": 0}
        fails = self.fail is not None and (self.fail_calls is None or call in self.fail_calls)
        i = 0
        r = 0
        while i < len(pieces):
            if cancel is not None and cancel.is_set():
                stopped = True
                break
            if fails and r >= self.fail_after_rounds:
                raise self.fail  # type: ignore[misc]
            if self.hold_after_rounds is not None and r == self.hold_after_rounds:
                self.held.set()
                deadline = time.monotonic() + 20.0
                while not self.gate.is_set() and not (cancel is not None and cancel.is_set()):
                    if time.monotonic() > deadline:
                        raise RuntimeError("scripted engine held for a release that never came")
                    time.sleep(0.002)
                self.held.clear()
                if cancel is not None and cancel.is_set():
                    stopped = True
                    break
            if r == 0:  # the prefill's token, reported like the real engine does
                n, width, verify_ms = 1, 1, 0.0
            else:
                n = self.committed[(r - 1) % len(self.committed)]
                width = self.widths[(r - 1) % len(self.widths)]
                n = max(1, min(n, width, len(pieces) - i))
                verify_ms = PRICES_S[width] * 1e3 if width in PRICES_S else width * 6.0
                seconds += ROUND_S
            chunk = pieces[i:i + n]
            i += n
            emitted.extend(chunk)
            ev_rows, ev_acc = self._sources(width, n - 1)
            if verify_ms > 0:
                widths[width] = widths.get(width, 0) + 1
                self.rounds_total += 1
                for s in rows:
                    rows[s] += ev_rows.get(s, 0)
                    accepted_src[s] += ev_acc.get(s, 0)
            if on_round is not None:
                on_round(RoundEvent(
                    conversation=conversation_id, turn=turn, round_index=r, context=context + i, width=width,
                    measured=verify_ms > 0 and self.rounds_total <= 2, verify_ms_predicted=verify_ms or None,
                    verify_ms=verify_ms, fixed_ms=1.0 if verify_ms else 0.0, expected_accepted=max(n - 1, 0) + 0.3,
                    accepted=max(n - 1, 0), committed=n,
                    priced_by=("head" if self.rounds_total <= 4 else "fitted") if verify_ms else "none",
                    rows_by_source=ev_rows, accepted_by_source=ev_acc,
                    offered={w: s * 1e3 for w, s in PRICES_S.items()} if verify_ms else {},
                    band_rate=90.0 if verify_ms else None, text="".join(chunk), reply_tokens=i,
                    reply_seconds=seconds, prefill=r == 0, seed=resolved.seed if resolved is not None else None))
            r += 1
            if self.round_sleep:
                time.sleep(self.round_sleep)
        return ReplyResult(
            conversation=conversation_id, turn=turn, text="".join(emitted), n_tokens=len(emitted),
            decode_s=seconds, prefill_s=0.001, prompt_tokens=context, context=context + len(emitted),
            rounds=sum(widths.values()), widths=widths, measure_rounds=min(self.rounds_total, 2),
            rows_by_source=rows, accepted_by_source=accepted_src, looped=len(pieces) >= max_tokens,
            stopped=stopped, arm="adaspark", sampling=resolved.to_json() if resolved is not None else {},
            seed=resolved.seed if resolved is not None else None, learned_not_saved=self.learned_not_saved)

    @staticmethod
    def _sources(width: int, accepted: int) -> tuple[dict[str, int], dict[str, int]]:
        """Split a round's width-1 draft rows and its accepted tokens over the three sources."""
        if width <= 1:
            return {}, {}
        drafts = width - 1
        agreed = drafts // 3
        ngram = (drafts - agreed) // 2
        rows = {"agreed": agreed, "ngram": ngram, "drafter": drafts - agreed - ngram}
        acc: dict[str, int] = {}
        left = accepted
        for s in ("agreed", "drafter", "ngram"):
            take = min(left, rows[s])
            acc[s] = take
            left -= take
        return rows, acc

    def price_table(self, context: int) -> dict[int, float]:
        return dict(PRICES_S)

    def plain_rate(self, context: int) -> float | None:
        return 1.0 / PRICES_S[1] if self.rounds_total else None

    def cold_start_progress(self) -> tuple[int, int]:
        return (min(self.rounds_total, len(PRICES_S)), len(PRICES_S))

    def read_ahead(self, conversation_id: str | None, messages: list[dict[str, str]], max_tokens: int = 512,
                   stop: Any = None, on_progress: Any = None, draft: str = "") -> Any:
        """Logs what the chat asks to have read (the real engine's reading: tests/test_read_ahead.py)."""
        from adaspark_app.engine.events import ReadAhead

        _log(self.log_path, {"event": "read_ahead", "conversation": conversation_id, "messages": messages,
                             "max_tokens": max_tokens, "draft": draft, "pid": os.getpid()})
        if self.read_ahead_fails:
            on_progress(0, 600)
            raise RuntimeError("scripted failure while reading ahead")
        return ReadAhead(conversation_id, 0, 0, 0, 0)

    def close(self) -> None:
        self.closed = True
        _log(self.log_path, {"event": "close", "pid": os.getpid()})


def scripted(replies: list[str] | None = None, **kwargs: Any) -> Callable[[], ScriptedEngine]:
    """A picklable factory the engine process calls to build a ScriptedEngine."""
    return functools.partial(ScriptedEngine, replies, **kwargs)


def _raise(error: BaseException, after_s: float = 0.0) -> Any:
    time.sleep(after_s)
    raise error


def failing(error: BaseException, after_s: float = 0.0) -> Callable[[], Any]:
    """A factory whose engine fails to load with `error` (in the engine process), `after_s`
    seconds into its load."""
    return functools.partial(_raise, error, after_s)


def _built_without_header_rules(factory: Callable[[], Any]) -> Any:
    import adaspark_app.llama_aborts as rules

    rules.header_problem = lambda header: None
    return factory()


def without_header_rules(factory: Callable[[], Any]) -> Callable[[], Any]:
    """`factory`'s engine, built in an engine process whose header rules are off
    (llama_aborts.header_problem finds nothing): a file they refuse then stands for one whose
    llama.cpp assertion no rule knows yet."""
    return functools.partial(_built_without_header_rules, factory)


class _CrashingAtGenerate:
    """The real engine whose first reply crashes inside llama.cpp: ``llama_get_logits`` given a
    context pointer that points nowhere reads address 8 (SIGSEGV in llama.cpp's own code)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._engine = factory()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        import ctypes

        import llama_cpp

        llama_cpp.llama_get_logits(ctypes.c_void_p(8))
        raise AssertionError("llama_get_logits read address 8 and went on")


def crashing_at_generate(factory: Callable[[], Any]) -> Callable[[], Any]:
    """`factory`'s engine, built in the engine process, whose first reply crashes in llama.cpp."""
    return functools.partial(_CrashingAtGenerate, factory)


class RecordingEngine:
    """The real engine (built by `factory` in the engine process), logging what it is asked."""

    def __init__(self, factory: Callable[[], Any], log_path: str) -> None:
        self._engine = factory()
        self._log_path = log_path
        _log(log_path, {"event": "load", "pid": os.getpid()})

    def generate(self, conversation_id: str, messages: list[dict[str, str]], *args: Any, **kwargs: Any) -> Any:
        # What the template made of the messages, and the prompt's length in tokens with and
        # without the last message (a test of KV reuse compares the prefill with them).
        e = self._engine
        sampling = kwargs.get("sampling")
        _log(self._log_path, {"event": "generate", "conversation": conversation_id, "messages": messages,
                              "pid": os.getpid(), "thread": threading.current_thread().name,
                              "prompt_text": e.template.render(messages, add_generation_prompt=True),
                              "n_prompt": len(e.prompt_tokens(messages)),
                              "n_before_last": len(e.backend.tokenize(
                                  e.template.render(messages[:-1], add_generation_prompt=False),
                                  add_special=False, parse_special=True)) if len(messages) > 1 else 0,
                              "sampling": sampling.to_json() if sampling is not None else None,
                              "max_tokens": kwargs.get("max_tokens")})
        return self._engine.generate(conversation_id, messages, *args, **kwargs)

    def read_ahead(self, conversation_id: str, messages: list[dict[str, str]], *args: Any, **kwargs: Any) -> Any:
        _log(self._log_path, {"event": "read_ahead", "conversation": conversation_id, "messages": messages,
                              "max_tokens": kwargs.get("max_tokens"), "draft": kwargs.get("draft", "")})
        return self._engine.read_ahead(conversation_id, messages, *args, **kwargs)

    def close(self) -> None:
        self._engine.close()  # the worker then closes the engine's store (found through __getattr__)
        _log(self._log_path, {"event": "close", "pid": os.getpid()})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def recording(factory: Callable[[], Any], log_path: str | os.PathLike) -> Callable[[], RecordingEngine]:
    """A picklable factory: the real engine from `factory`, wrapped in a RecordingEngine."""
    return functools.partial(RecordingEngine, factory, str(log_path))


async def wait_until(pilot: Any, predicate: Callable[[], Any], timeout: float = 10.0,
                     interval: float = 0.01, what: str | Callable[[], str] | None = None) -> None:
    """Poll `predicate` between Pilot pauses until it is truthy; fail after `timeout` seconds.

    Polling instead of bare `pilot.pause()` keeps tests fast when things are quick and patient
    when the machine is slow. `what` (or a function giving it, read at the timeout) names what
    was awaited in the failure message.
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {said or predicate}")
        await pilot.pause(interval)


def notifications(app: Any) -> list[str]:
    """The messages of the app's notifications that have arrived so far."""
    return [n.message for n in app._notifications]


async def notified(pilot: Any, *parts: str, timeout: float = 10.0) -> str:
    """Wait for a notification holding every one of `parts`; return it.

    `notify()` posts a message that the app takes in on a later turn of its loop, so a
    notification made just before a reply ended may not be in the list yet when the test sees
    the reply end.
    """
    def found() -> str | None:
        return next((n for n in notifications(pilot.app) if all(p in n for p in parts)), None)

    await wait_until(pilot, found, timeout=timeout,
                     what=lambda: f"a notification with {parts} (have {notifications(pilot.app)})")
    return found() or ""


def panel_text(stats: Any) -> str:
    """The side panel's text for these SpecStats, as the widget renders it (the same function)."""
    from rich.console import Console

    from adaspark_app.ui.widgets import render_panel

    console = Console(width=44, record=True, color_system=None)
    console.print(render_panel(stats))
    return console.export_text()
