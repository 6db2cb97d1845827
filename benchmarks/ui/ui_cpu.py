"""How much CPU does the chat UI use while a reply streams? (issue 17: every UI cycle on a 2-core
machine is taken from a verify.)

Measures CPU time, not wall speed, so it can run on a busy machine: the UI process's CPU seconds
(all its threads, `getrusage`) and its main thread's, per 100 reply tokens and per second of
streaming, with the frames painted and the bytes written to the terminal.

The real app (`AdaSparkApp`, the real Textual driver) runs in a pseudo-terminal of 160x48 and
sends scripted prompts itself. Its engine is either

- `replay` (the default): a stand-in engine process that replays a recorded stream of a real
  engine's rounds (text and figures as recorded) at a fixed token rate (default 110 tok/s, about
  `adaspark run` on the bundled model), through the real worker, pipe and event batcher. Same
  stream every run, no model: the figure depends only on the UI.
- `real`: the bundled model through the real engine process (the engine's speed varies with
  the load, so its pacing does too).

Usage:

    python -m benchmarks.ui.ui_cpu record [--max-tokens 256]     # once: writes the stream file
    python -m benchmarks.ui.ui_cpu measure [--engine replay|real] [--ui-priority low|idle|normal]
        [--rate 110] [--json OUT.json] [--label TEXT]

The stream file is benchmarks/results/tui-vs-headless/ui-cpu-stream.jsonl.gz (the issue's palindrome
conversation, an MT-Bench conversation and two pasted-code first turns; 256 tokens each).
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import resource
import select
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import CORPORA, RESULTS, ROOT, cpu_model, module_argv, read_jsonl, write_text

STREAM = RESULTS / "tui-vs-headless" / "ui-cpu-stream.jsonl.gz"
SIZE = (160, 48)
PALINDROME = ["Write a Python function that checks whether a string is a palindrome, then explain it.",
              "Now rewrite it to ignore case, spaces and punctuation, and add three tests."]
# The RoundEvent fields the UI reads; the decision trace is kept out of the file.
KEPT_FIELDS = ("round_index", "context", "width", "measured", "verify_ms_predicted", "verify_ms", "fixed_ms",
               "expected_accepted", "accepted", "committed", "priced_by", "rows_by_source",
               "accepted_by_source", "offered", "band_rate", "text", "reply_tokens", "reply_seconds", "prefill")
PREFILL_MAX_S = 0.3
# UI_CPU_PROFILE=FILE: cProfile of the UI's main thread over the streaming windows only (the
# profiler's own overhead inflates every figure; use it for where the time goes, not how much).
PROFILER = None
if os.environ.get("UI_CPU_PROFILE") and "_child" in sys.argv:
    import cProfile

    PROFILER = cProfile.Profile()
RATE = 110.0  # replayed tokens per second: about `adaspark run`'s speed on the bundled model (report.md)


# ---------------------------------------------------------------------------- recording
def conversations() -> list[dict[str, Any]]:
    """The recorded conversations: the issue's two turns, MT-Bench 81, two pasted-code turns."""
    rows: list[dict[str, Any]] = [{"id": "palindrome", "turns": PALINDROME}]
    mt = read_jsonl(CORPORA / "mtbench.jsonl.gz")
    rows.append({"id": mt[0]["id"], "turns": [t.strip() for t in mt[0]["turns"]]})
    code = read_jsonl(CORPORA / "longcode.jsonl.gz")
    rows += [{"id": r["id"], "turns": [r["turns"][0].strip()]} for r in code[:2]]
    return rows


def record(max_tokens: int, out: Path) -> None:
    """Run the real engine on `conversations()` and write every round with its time offset."""
    from adaspark_app import native

    native.activate()
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "rec.db")
        engine = ChatEngine(store=store)
        lines = []
        for conv in conversations():
            history: list[dict[str, str]] = []
            for turn, prompt in enumerate(conv["turns"]):
                history.append({"role": "user", "content": prompt})
                rounds: list[tuple[float, Any]] = []
                t0 = time.monotonic()
                result = engine.generate(conv["id"], list(history), max_tokens=max_tokens, turn=turn,
                                         on_round=lambda e: rounds.append((time.monotonic() - t0, e)))
                history.append({"role": "assistant", "content": result.text})
                events = []
                for t, e in rounds:
                    d = asdict(e)
                    events.append([round(t, 5), {k: d[k] for k in KEPT_FIELDS}])
                res = asdict(result)
                res.pop("tokens", None)
                lines.append(json.dumps({"conversation": conv["id"], "turn": turn, "prompt": prompt,
                                         "events": events, "result": res}))
                print(f"{conv['id']} turn {turn}: {result.n_tokens} tokens, {len(rounds)} rounds, "
                      f"{result.tokens_per_s:.1f} tok/s", file=sys.stderr)
        engine.close()
        store.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, "\n".join(lines) + "\n")


def load_stream(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path)


# ---------------------------------------------------------------------------- the replay engine
class ReplayEngine:
    """ChatEngine's interface; reply k replays the stream's reply k, round by round: a round ends
    when `rate` tokens a second have been generated up to it (rate 0: at its recorded offset).
    Built in the engine process by the app's factory."""

    def __init__(self, stream_path: str, rate: float = RATE) -> None:
        self.replies = load_stream(Path(stream_path))
        self.rate = rate
        self.calls = 0
        self.model_name = "SmolLM2-135M-Instruct (replayed)"
        self.drafter_name = None
        self.notices: list[str] = []
        self._prices: dict[int, float] = {}

    def generate(self, conversation_id: str, messages: list[dict[str, str]], max_tokens: int = 512,
                 on_round: Callable[[Any], None] | None = None, cancel: Any = None, turn: int = 0,
                 sampling: Any = None, on_prefill: Any = None) -> Any:
        from adaspark_app.engine.events import ReplyResult, RoundEvent

        rec = self.replies[self.calls % len(self.replies)]
        self.calls += 1
        # The prefill as recorded (at most PREFILL_MAX_S: the recording machine was loaded):
        # the UI lays out the new messages meanwhile, as it does in a real chat.
        time.sleep(min(rec["result"].get("prefill_s", 0.0), PREFILL_MAX_S))
        t0 = time.monotonic()
        stopped = False
        for t, d in rec["events"]:
            if cancel is not None and cancel.is_set():
                stopped = True
                break
            due = d["reply_tokens"] / self.rate if self.rate > 0 else t
            wait = t0 + due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            d = dict(d, conversation=conversation_id, turn=turn,
                     offered={int(k): v for k, v in d.get("offered", {}).items()})
            if d["offered"]:
                self._prices = {w: ms / 1e3 for w, ms in d["offered"].items()}
            if on_round is not None:
                on_round(RoundEvent(**d))
        r = dict(rec["result"], conversation=conversation_id, turn=turn, stopped=stopped,
                 widths={int(k): v for k, v in rec["result"]["widths"].items()})
        return ReplyResult(**r)

    def price_table(self, context: int) -> dict[int, float]:
        return dict(self._prices)

    def plain_rate(self, context: int) -> float | None:
        return 1.0 / self._prices[1] if 1 in self._prices else None

    def cold_start_progress(self) -> tuple[int, int]:
        return (len(self._prices), len(self._prices))

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------- the app under test
def child(args: argparse.Namespace) -> None:
    """Runs in the pseudo-terminal: the real app, sending the stream's prompts one by one."""
    import functools

    from adaspark_app.store import Store
    from adaspark_app.ui.app import AdaSparkApp
    from adaspark_app.ui.engine_client import lower_ui_priority

    stream = load_stream(Path(args.stream))
    tmp = tempfile.mkdtemp(prefix="ui-cpu-")
    store = Store.open(Path(tmp) / "chat.db")
    if args.engine == "real":
        from adaspark_app.engine.worker import EngineConfig

        factory: Any = EngineConfig(store_path=str(store.path))
    else:
        from benchmarks.ui import ui_cpu  # the engine process imports ReplayEngine from this module

        factory = functools.partial(ui_cpu.ReplayEngine, str(args.stream), args.rate)
    out: dict[str, Any] = {"replies": [], "error": None}

    def cpu() -> tuple[float, float]:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime, time.thread_time()

    class MeasuredApp(AdaSparkApp):
        """AdaSparkApp counting its frames and terminal bytes, and sending the stream's prompts."""

        CSS_PATH = Path(sys.modules[AdaSparkApp.__module__].__file__).parent / "app.tcss"  # type: ignore[arg-type]
        frames = 0
        bytes_out = 0

        def _display(self, screen: Any, renderable: Any) -> None:
            if renderable is not None and not self._batch_count:
                MeasuredApp.frames += 1
            super()._display(screen, renderable)

        def on_mount(self) -> None:
            driver = self._driver
            write = driver.write

            def counting(data: str) -> None:
                MeasuredApp.bytes_out += len(data)
                write(data)

            driver.write = counting  # type: ignore[method-assign]
            self._next = 0
            self._mark: tuple | None = None
            self._waiter = self.set_interval(0.2, self._send_when_ready)

        def _send_when_ready(self) -> None:
            # As in a real start, where the model takes seconds to load: the highlighters are
            # warmed before the first reply (ChatScreen._warm_next).
            if self.engine.ready and not getattr(self.chat_screen, "_warm", None):
                self._waiter.stop()
                self.call_later(self._send_next)

        async def _send_next(self) -> None:
            if self._next >= len(stream):
                self._idle_from = (*cpu(), MeasuredApp.frames, time.monotonic())
                self.set_timer(args.idle_s, self._finish)
                return
            rec = stream[self._next]
            chat = self.chat_screen
            if rec["turn"] == 0:
                await chat.new_conversation()
            self._mark = (*cpu(), MeasuredApp.frames, MeasuredApp.bytes_out, time.monotonic())
            self._stream_from: tuple | None = None
            self._stream_to: tuple | None = None
            if not hasattr(self, "_wrapped"):
                self._wrapped = True
                runner = chat.replies  # the screen hands the engine's reply messages to it
                rounds, done = runner.rounds, runner.done

                async def reply_rounds(message: Any) -> None:
                    if self._stream_from is None:  # the decode's first token has arrived
                        self._stream_from = (*cpu(), MeasuredApp.frames, MeasuredApp.bytes_out, time.monotonic())
                        if PROFILER is not None:
                            PROFILER.enable()
                    await rounds(message)

                async def reply_done(message: Any) -> None:
                    self._stream_to = (*cpu(), MeasuredApp.frames, MeasuredApp.bytes_out, time.monotonic())
                    if PROFILER is not None:
                        PROFILER.disable()
                    await done(message)

                runner.rounds, runner.done = reply_rounds, reply_done  # type: ignore[method-assign]
            await chat.send(rec["prompt"])

        def reply_ended(self) -> None:
            super().reply_ended()
            if self._mark is None:
                return
            p1, m1, f1, b1, t1 = (*cpu(), MeasuredApp.frames, MeasuredApp.bytes_out, time.monotonic())
            p0, m0, f0, b0, t0 = self._mark
            self._mark = None
            chat = self.chat_screen
            first_round = chat.replies.round_log[0][0] if chat.replies.round_log else t1
            rec = stream[self._next]
            shown = chat.chat_view.messages()[-1].text
            s0, s1 = self._stream_from or self._mark, self._stream_to or self._mark
            out["replies"].append({
                "conversation": rec["conversation"], "turn": rec["turn"], "tokens": chat.stats.reply_tokens,
                # While the engine decodes: from the first rounds handled to the reply's end.
                "stream_s": s1[4] - s0[4], "cpu_s": s1[0] - s0[0], "main_cpu_s": s1[1] - s0[1],
                "frames": s1[2] - s0[2], "bytes": s1[3] - s0[3],
                # The whole reply, sending (two messages mounted) and finishing (render, store) too.
                "reply_wall_s": t1 - t0, "reply_cpu_s": p1 - p0, "reply_main_cpu_s": m1 - m0,
                "reply_frames": f1 - f0, "reply_bytes": b1 - b0,
                "first_round_wait_s": first_round - t0,
                "text_ok": shown == chat.conversation.last_reply, "panel_redraws": chat.panel.redraws})
            self._next += 1
            self.set_timer(0.3, self._send_next)

        def _finish(self) -> None:
            if PROFILER is not None:
                PROFILER.dump_stats(os.environ["UI_CPU_PROFILE"])
            p0, m0, f0, t0 = self._idle_from
            p1, m1 = cpu()
            out["idle"] = {"seconds": time.monotonic() - t0, "cpu_s": p1 - p0, "main_cpu_s": m1 - m0,
                           "frames": MeasuredApp.frames - f0}
            self.exit()

    app = MeasuredApp(factory, store, store_label="ui-cpu", max_tokens=args.max_tokens,
                      exit_on_load_error=True)
    out["priority"] = lower_ui_priority(args.ui_priority)
    try:
        app.run()
    except Exception as err:  # written to the result: this process's stderr is the pseudo-terminal
        out["error"] = f"{type(err).__name__}: {err}"
    finally:
        app.engine.close(timeout=10.0)
        store.close()
    Path(args.out).write_text(json.dumps(out), encoding="utf-8")


# ---------------------------------------------------------------------------- the parent
def spawn_in_pty(argv: list[str], env: dict[str, str], size: tuple[int, int] = SIZE,
                 cwd: str | Path | None = ROOT) -> tuple[subprocess.Popen, int]:
    """`argv` started in a session of its own on a fresh pseudo-terminal of `size` (columns,
    rows); returns the process and the terminal's side to read what it draws and type keys into."""
    import fcntl
    import termios

    master, slave = pty.openpty()
    cols, rows = size
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True, cwd=cwd,
                            close_fds=True)
    os.close(slave)
    return proc, master


def run_in_pty(argv: list[str], env: dict[str, str], timeout: float) -> bytes:
    """Run `argv` on a fresh pseudo-terminal of SIZE, reading (and dropping) what it draws as a
    terminal would; returns the last 4 KB of output (for a failure's message)."""
    proc, master = spawn_in_pty(argv, env)
    tail = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                tail = (tail + data)[-4096:]
            elif proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"timed out after {timeout:.0f} s")
    finally:
        proc.wait()
        os.close(master)
    return tail


def summarise(res: dict[str, Any]) -> dict[str, Any]:
    rs = res["replies"]
    tokens = sum(r["tokens"] for r in rs)
    stream = sum(r["stream_s"] for r in rs)
    cpu = sum(r["cpu_s"] for r in rs)
    main = sum(r["main_cpu_s"] for r in rs)
    frames = sum(r["frames"] for r in rs)
    reply_cpu = sum(r["reply_cpu_s"] for r in rs)
    return {"replies": len(rs), "tokens": tokens, "stream_s": stream, "cpu_s": cpu, "main_cpu_s": main,
            "reply_cpu_s": reply_cpu, "reply_cpu_per_100_tokens": 100 * reply_cpu / tokens if tokens else None,
            "cpu_per_100_tokens": 100 * cpu / tokens if tokens else None,
            "main_cpu_per_100_tokens": 100 * main / tokens if tokens else None,
            "cpu_share": cpu / stream if stream else None, "frames": frames,
            "frames_per_s": frames / stream if stream else None,
            "cpu_ms_per_frame": 1e3 * cpu / frames if frames else None,
            "texts_ok": sum(1 for r in rs if r["text_ok"])}


def measure(args: argparse.Namespace) -> None:
    env = dict(os.environ, TERM="xterm-256color", COLORTERM="truecolor")
    env.pop("TMUX", None)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        argv = module_argv("benchmarks.ui.ui_cpu", "_child", "--stream", str(args.stream),
                           "--out", str(out), "--engine", args.engine, "--rate", str(args.rate),
                           "--max-tokens", str(args.max_tokens), "--idle-s", str(args.idle_s))
        if args.ui_priority:
            argv += ["--ui-priority", args.ui_priority]
        tail = run_in_pty(argv, env, timeout=args.timeout)
        if not out.exists():
            raise SystemExit("the app wrote no result; its last output:\n" + tail.decode("utf-8", "replace"))
        res = json.loads(out.read_text())
    if res.get("error") or not res["replies"]:
        raise SystemExit(f"the app failed: {res.get('error')}; its last output:\n" + tail.decode("utf-8", "replace"))
    summary = summarise(res)
    res["summary"] = summary
    res["cpu_model"] = cpu_model()
    res["label"] = args.label
    res["engine"] = args.engine
    print(f"UI priority {res['priority']}, engine {args.engine}, CPU {res['cpu_model']}")
    print("| reply | tokens | streaming s | UI CPU s | main thread s | CPU / 100 tok | UI share of a core | frames | frames/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in res["replies"]:
        print(f"| {r['conversation']} t{r['turn']} | {r['tokens']} | {r['stream_s']:.2f} | {r['cpu_s']:.3f} | "
              f"{r['main_cpu_s']:.3f} | {100 * r['cpu_s'] / max(r['tokens'], 1):.3f} | "
              f"{100 * r['cpu_s'] / max(r['stream_s'], 1e-9):.1f}% | {r['frames']} | "
              f"{r['frames'] / max(r['stream_s'], 1e-9):.1f} |")
    s = summary
    print(f"| **all** | {s['tokens']} | {s['stream_s']:.2f} | {s['cpu_s']:.3f} | {s['main_cpu_s']:.3f} | "
          f"**{s['cpu_per_100_tokens']:.3f}** | {100 * s['cpu_share']:.1f}% | {s['frames']} | {s['frames_per_s']:.1f} |")
    idle = res.get("idle") or {}
    if idle:
        print(f"idle after the replies: {idle['cpu_s']:.3f} s CPU over {idle['seconds']:.1f} s "
              f"({100 * idle['cpu_s'] / idle['seconds']:.2f}% of a core), {idle['frames']} frames")
    print(f"whole replies (sending and finishing too): {s['reply_cpu_s']:.3f} s UI CPU, "
          f"{s['reply_cpu_per_100_tokens']:.3f} s per 100 tokens")
    print(f"texts on screen equal to the replies: {s['texts_ok']}/{s['replies']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record the real engine's rounds on the scripted turns")
    r.add_argument("--max-tokens", type=int, default=256)
    r.add_argument("--out", type=Path, default=STREAM)
    for name in ("measure", "_child"):
        m = sub.add_parser(name)
        m.add_argument("--stream", type=Path, default=STREAM)
        m.add_argument("--engine", choices=("replay", "real"), default="replay")
        m.add_argument("--ui-priority", choices=("low", "idle", "normal"), default=None)
        m.add_argument("--rate", type=float, default=RATE,
                       help="replay: tokens a second (0: the recorded pacing, which the load when recording set)")
        m.add_argument("--max-tokens", type=int, default=256)
        m.add_argument("--idle-s", type=float, default=3.0, help="UI CPU measured this long after the replies")
        if name == "measure":
            m.add_argument("--json", type=Path, default=None)
            m.add_argument("--label", default="")
            m.add_argument("--timeout", type=float, default=600.0)
        else:
            m.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.cmd == "record":
        record(args.max_tokens, args.out)
    elif args.cmd == "measure":
        measure(args)
    else:
        child(args)


if __name__ == "__main__":
    main()
