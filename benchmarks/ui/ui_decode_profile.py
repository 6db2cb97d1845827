"""Where does the chat's CPU go while the engine decodes? (issue 17)

Runs the real `adaspark chat` in tmux (160x48, fresh store, greedy) on scripted conversations, as
`tui_vs_headless.py` does, with `ui_trace.py` imported into the chat's process. For each reply it
reports, inside the engine's decode window (its last round's time less `decode_s`, to that round):

- the UI process's CPU as a share of one core (every thread; the tracer's own sampler thread,
  ~0.5%, included and given apart from send to done);
- the event-loop callbacks of the UI thread that used over 2 ms (when, how much);
- how late the UI took each batch of rounds in (the engine sends one every 0.25 s).

CPU time here is taken from the decode on a two-core machine, one for one. Usage:

    python -m benchmarks.ui.ui_decode_profile [--chat 3] [--paste 1] [--offset 44] [--paste-offset 0]
        [--max-tokens 512] [--ui-priority low|idle|normal] [--out DIR]
"""

from __future__ import annotations

import argparse
import bisect
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS, command_line, cpu_model, read_jsonl
from benchmarks.ui import tui_vs_headless as tvh  # the tmux driver and the corpora

SAMPLER = "trace-sampler"


def analyse(rows: list[dict]) -> list[dict]:
    """Per reply: CPU share in the decode window, big callbacks in it, batch lags, threads."""
    cpu = [(r["t"], r["cpu"]) for r in rows if r["k"] == "cpu"]
    times = [t for t, _ in cpu]

    def cpu_at(t: float) -> float:
        return cpu[min(bisect.bisect_left(times, t), len(cpu) - 1)][1]

    out, send, lags = [], None, []
    for r in rows:
        if r["k"] == "send":
            send, lags = r, []
        elif r["k"] == "rounds" and send is not None:
            lags.append(r["lag"])
        elif r["k"] == "done" and send is not None and r.get("last_round") and cpu:
            t1 = r["last_round"]
            t0 = t1 - r["decode_s"]
            handles = [h for h in rows if h["k"] == "handle" and t0 <= h["t"] <= t1]
            threads = {k: (v - send["threads"].get(k, 0)) / 1e6 for k, v in r["threads"].items()}
            out.append({"n_tokens": r["n_tokens"], "decode_s": r["decode_s"],
                        "ui_share": (cpu_at(t1) - cpu_at(t0)) / r["decode_s"],
                        "handles_ms": [(round(h["t"] - t0, 2), round(h["cpu"] * 1e3, 1)) for h in handles],
                        "lag_max_ms": max(lags) * 1e3 if lags else None,
                        "lag_median_ms": sorted(lags)[len(lags) // 2] * 1e3 if lags else None,
                        "threads_ms": {k: round(v, 1) for k, v in threads.items() if v > 0.05},
                        "send_to_done_s": r["t"] - send["t"]})
            send = None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chat", type=int, default=3)
    ap.add_argument("--paste", type=int, default=1)
    ap.add_argument("--offset", type=int, default=44)
    ap.add_argument("--paste-offset", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--ui-priority", choices=("low", "idle", "normal"), default=None)
    ap.add_argument("--out", type=Path, default=RESULTS / "tui-vs-headless" / "ui-decode-profile")
    args = ap.parse_args(argv)
    convs = tvh.load_conversations(args.chat, args.paste, args.offset, args.paste_offset)
    args.out.mkdir(parents=True, exist_ok=True)
    trace = args.out / "trace.jsonl"
    trace.unlink(missing_ok=True)
    os.environ["ADASPARK_UI_TRACE"] = str(trace)  # the private tmux server starts with this env
    # the chat runs in tmux with the checkout as its working directory (tui_vs_headless.run_tui)
    boot = "import sys; import benchmarks.ui.ui_trace; from adaspark_app.cli import main; sys.exit(main())"
    adaspark = [sys.executable, "-c", boot]
    try:
        with tempfile.TemporaryDirectory(prefix="adaspark-ui-profile-") as tmp:
            for conv in convs:
                tvh.run_tui(conv, adaspark, args.max_tokens, Path(tmp), session="profile",
                            ui_priority=args.ui_priority)
    finally:
        tvh.tmux("kill-server", check=False)
    rows = read_jsonl(trace)
    replies = analyse(rows)
    command = command_line("benchmarks.ui.ui_decode_profile", argv)
    lines = ["# The chat's CPU while the engine decodes", "", f"- command: `{command}`",
             f"- CPU: {cpu_model()} ({os.cpu_count()} cores); UI priority: {args.ui_priority or 'the default'}",
             f"- conversations: {', '.join(c['id'] for c in convs)}", "",
             "| reply | tokens | decode s | UI CPU, share of a core | callbacks over 2 ms (s into decode, ms) "
             "| batch lag median / max ms | UI thread / tracer ms, send to done |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(replies):
        th = r["threads_ms"]
        lines.append(f"| {i + 1} | {r['n_tokens']} | {r['decode_s']:.2f} | {100 * r['ui_share']:.1f}% | "
                     f"{r['handles_ms'] or '-'} | {r['lag_median_ms']:.0f} / {r['lag_max_ms']:.0f} | "
                     f"{th.get('MainThread', 0):.0f} / {th.get(SAMPLER, 0):.0f} |")
    if replies:
        share = sum(r["ui_share"] * r["decode_s"] for r in replies) / sum(r["decode_s"] for r in replies)
        lines += ["", f"Over all replies: the UI process used **{100 * share:.2f}%** of a core in the decode windows "
                      "(the tracer's sampler included)."]
    text = "\n".join(lines) + "\n"
    (args.out / "report.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
