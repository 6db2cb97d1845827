"""Does the TUI slow decoding? `adaspark chat` in a real terminal against `adaspark run`, same turns.

For each scripted conversation (short chat from MT-Bench, long pastes from ShareGPT), in turn:

- TUI: `adaspark chat --temperature 0 --store FRESH.db --max-tokens N` (greedy, as `run`) runs in
  tmux at 160x48; each user turn is
  pasted (tmux bracketed paste) and sent with Enter, and the reply is awaited by polling the
  store's `messages` table. Its speed is the `tokens_per_s` the app records in the assistant
  row's `meta`: n_tokens / decode_s measured in the engine process as `adaspark run` measures it.
- headless: `adaspark run CONV.jsonl --max-tokens N --fresh-store --out OUT.jsonl`.

The two run back to back per conversation, alternating which goes first, each on a fresh store.
Before the first conversation an untimed `adaspark run` of one turn (64 tokens) warms the machine
(`--no-warmup` skips it): without it the first reply of the first conversation (the TUI's: the
rotation starts with it) was 0.92-0.97x in four runs, where the others averaged ~0.98.
With `--control`, a third arm runs `adaspark run` once more (fresh store, same turns), and the
three rotate which goes first: control / headless is what the machine's own noise does to a
reply's ratio with no UI at all, the reference for how far below 1 a TUI / headless ratio may fall
by chance. Reported: the speed ratio TUI / headless per reply, and overall the geometric mean with a 95%
bootstrap interval over conversations (adaspark_app/bench/stats.py), the display's own speed
(`shown_tokens_per_s`), and whether the texts are identical. Usage:

    python -m benchmarks.ui.tui_vs_headless [--chat 6] [--paste 4] [--max-tokens 256]
        [--out benchmarks/results/tui-vs-headless] [--ui-priority low|idle|normal] [--adaspark "adaspark"]
        [--control]

Needs tmux. Run it on a quiet machine: both arms share its cores with anything else running.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from adaspark_app.bench.stats import bootstrap_interval, geometric_mean

from benchmarks.common import CORPORA, RESULTS, ROOT, cpu_model, read_jsonl

SIZE = (160, 48)
READY_TIMEOUT_S = 120.0  # the app up and the model loaded
REPLY_TIMEOUT_S = 600.0


@dataclass
class Reply:
    arm: str  # "tui" | "headless" | "control" (headless again: the A/A reference)
    conversation: str
    turn: int
    category: str
    text: str
    n_tokens: int
    decode_s: float
    tokens_per_s: float
    looped: bool
    shown_tokens_per_s: float | None = None
    first: bool = False  # this arm ran first for the conversation
    shown_lag_ms: float | None = None  # the longest any of the reply's text waited to be drawn (TUI)


def load_conversations(n_chat: int, n_paste: int, offset: int = 0, paste_offset: int | None = None) -> list[dict]:
    """`n_chat` MT-Bench conversations (two turns) from the `offset`-th on and `n_paste` long
    pastes (one) from the `paste_offset`-th (default: `offset`), turns stripped: the chat sends
    what was typed without surrounding blanks, so both arms get that."""
    def take(name: str, n: int, start: int) -> list[dict]:
        rows = read_jsonl(CORPORA / name)
        return [{"id": r["id"], "category": r.get("category") or name, "turns": [t.strip() for t in r["turns"]]}
                for r in rows[start:start + n]]
    return take("mtbench.jsonl.gz", n_chat, offset) + take("longpaste.jsonl.gz", n_paste,
                                                         offset if paste_offset is None else paste_offset)


# ---------------------------------------------------------------------------- the TUI arm
_TMUX_SOCKET: list[str] = []  # made on first use: a private tmux server started with this process's env


def tmux_socket() -> str:
    if not _TMUX_SOCKET:
        _TMUX_SOCKET.append(str(Path(tempfile.mkdtemp(prefix="adaspark-bench-tmux-")) / "tmux.sock"))
    return _TMUX_SOCKET[0]


def tmux(*args: str, check: bool = True) -> str:
    return subprocess.run(["tmux", "-S", tmux_socket(), *args], check=check, capture_output=True, text=True).stdout


def assistant_rows(db: Path) -> list[tuple[str, dict]]:
    """The assistant messages stored so far (read-only; the app writes in WAL mode)."""
    if not db.exists():
        return []
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            rows = conn.execute("select content, meta from messages where role = 'assistant' order by id").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []
    return [(c, json.loads(m) if m else {}) for c, m in rows]


def store_files_state(db: Path) -> tuple:
    """Size and modification time of the store and its WAL (a stat each: no SQLite)."""
    out = []
    for p in (db, db.with_name(db.name + "-wal")):
        try:
            st = p.stat()
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


def user_rows(db: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return [r[0] for r in conn.execute("select content from messages where role = 'user' order by id")]
    finally:
        conn.close()


def run_tui(conv: dict, adaspark: list[str], max_tokens: int, work: Path, session: str,
            ui_priority: str | None = None, model: list[str] = ()) -> list[Reply]:
    db = work / f"tui-{conv['id']}.db"
    env = ["env", "-u", "COLUMNS", "-u", "LINES"]  # the terminal's own size, not an inherited one
    if ui_priority is not None:
        env.append(f"ADASPARK_UI_PRIORITY={ui_priority}")
    cmd = " ".join(shlex.quote(a) for a in [*env, *adaspark, "chat", "--temperature", "0", "--store", str(db),
                                             "--max-tokens", str(max_tokens), *model])
    tmux("kill-session", "-t", session, check=False)
    tmux("new-session", "-d", "-s", session, "-x", str(SIZE[0]), "-y", str(SIZE[1]), "-c", str(ROOT), cmd)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "Ready." not in tmux("capture-pane", "-p", "-t", session, check=False):
            if time.monotonic() > deadline:
                raise RuntimeError(f"adaspark chat did not become ready:\n{tmux('capture-pane', '-p', '-t', session, check=False)}")
            time.sleep(0.2)
        replies = []
        for turn, text in enumerate(conv["turns"]):
            before = len(assistant_rows(db))
            buf = work / "turn.txt"
            buf.write_text(text, encoding="utf-8")
            tmux("load-buffer", "-b", "turn", str(buf))
            tmux("paste-buffer", "-p", "-r", "-d", "-b", "turn", "-t", session)  # bracketed, LFs kept
            time.sleep(0.3 + len(text) / 20000)  # let the app take the paste in before Enter
            tmux("send-keys", "-t", session, "Enter")
            deadline = time.monotonic() + REPLY_TIMEOUT_S
            seen = None
            while True:
                # Query the store only when its files changed: a query (open, WAL index, read
                # every reply) costs ~1 ms at normal priority, ten times a second, taken from the
                # decode it waits for, while headless `run` is waited for without any polling.
                now_seen = store_files_state(db)
                if now_seen != seen:
                    seen = now_seen
                    if len(rows := assistant_rows(db)) > before:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no reply to turn {turn} of {conv['id']}")
                time.sleep(0.1)
            content, meta = rows[-1]
            replies.append(Reply("tui", conv["id"], turn, conv["category"], content, int(meta["n_tokens"]),
                                 float(meta["decode_s"]), float(meta["tokens_per_s"]), bool(meta.get("looped")),
                                 meta.get("shown_tokens_per_s"), shown_lag_ms=meta.get("shown_lag_ms")))
            time.sleep(0.5)  # the app finishes drawing the reply before the next paste
        sent = user_rows(db)
        if sent != conv["turns"]:
            raise RuntimeError(f"the chat received other text than the script's turns for {conv['id']}")
        return replies
    finally:
        tmux("send-keys", "-t", session, "C-q", check=False)
        deadline = time.monotonic() + 15
        while session in tmux("ls", check=False) and time.monotonic() < deadline:
            time.sleep(0.2)
        tmux("kill-session", "-t", session, check=False)


# ---------------------------------------------------------------------------- the headless arm
def run_headless(conv: dict, adaspark: list[str], max_tokens: int, work: Path, model: list[str] = (),
                 arm: str = "headless") -> list[Reply]:
    script = work / f"run-{conv['id']}.jsonl"
    out = work / f"{arm}-{conv['id']}.out.jsonl"
    script.write_text(json.dumps({"id": conv["id"], "turns": conv["turns"]}) + "\n", encoding="utf-8")
    subprocess.run([*adaspark, "run", str(script), "--max-tokens", str(max_tokens), "--fresh-store",
                    "--out", str(out), *model], check=True, stdin=subprocess.DEVNULL)
    replies = []
    for line in out.read_text().splitlines():
        d = json.loads(line)
        replies.append(Reply(arm, conv["id"], int(d["turn"]), conv["category"], d["text"],
                             int(d["n_tokens"]), float(d["decode_s"]), float(d["tokens_per_s"]), bool(d["looped"])))
    return replies


# ---------------------------------------------------------------------------- report
def summarize(pairs: list[tuple[Reply, Reply]]) -> dict:
    by_conv: dict[str, list[float]] = {}
    for tui, run in pairs:
        if tui.tokens_per_s > 0 and run.tokens_per_s > 0:
            by_conv.setdefault(tui.conversation, []).append(math.log(tui.tokens_per_s / run.tokens_per_s))
    ratios = [math.exp(x) for v in by_conv.values() for x in v]
    out = {"replies": len(pairs), "with_speed": len(ratios), "conversations": len(by_conv),
           "identical": sum(t.text == r.text for t, r in pairs)}
    if ratios:
        out["geomean_ratio"] = geometric_mean(ratios)
        out["ci95"] = list(bootstrap_interval(by_conv))
        out["min_ratio"] = min(ratios)
        out["replies_at_or_above_0.95"] = sum(x >= 0.95 for x in ratios)
    return out


def summary_line(label: str, s: dict) -> str:
    return (f"**{label}: {s['geomean_ratio']:.3f}x [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]** "
            f"(geometric mean over {s['with_speed']} replies, 95% bootstrap interval over "
            f"{s['conversations']} conversations); lowest reply {s['min_ratio']:.3f}x; "
            f"{s['replies_at_or_above_0.95']}/{s['with_speed']} replies at 0.95x or more; "
            f"identical texts {s['identical']}/{s['replies']}.")


def write_report(outdir: Path, command: str, pairs: list[tuple[Reply, Reply]], meta: dict,
                 controls: list[Reply] | None = None) -> str:
    """report.md, replies.jsonl and report.json in `outdir`; `controls[i]` is the control arm's
    reply for `pairs[i]` (``--control``)."""
    s = summarize(pairs)
    sc = summarize([(c, run) for c, (_, run) in zip(controls, pairs)]) if controls else None
    nice_label = ("the app's default" if meta["ui_priority"] is None
                  else f"ADASPARK_UI_PRIORITY={meta['ui_priority']}")
    lines = ["# TUI against headless: does `adaspark chat` decode at `adaspark run` speed?", "",
             f"- command: `{command}`",
             f"- CPU: {meta['cpu']} ({meta['cores']} cores), {meta['platform']}, Python {meta['python']}, "
             f"kernels {meta['kernels']}",
             f"- load average at start {meta['load_start']} / at end {meta['load_end']}",
             f"- model: {meta.get('model', 'bundled')} (both arms), conversations {', '.join(meta['conversations'])}",
             f"- TUI: tmux {SIZE[0]}x{SIZE[1]}, `adaspark chat --temperature 0 --store FRESH.db "
             f"--max-tokens {meta['max_tokens']}`, "
             "speed = `tokens_per_s` from the assistant row's meta (engine n_tokens / decode_s)",
             f"- UI priority: {nice_label}",
             f"- headless: `adaspark run CONV.jsonl --max-tokens {meta['max_tokens']} --fresh-store`",
             ("- control: `adaspark run` again (fresh store, same turns); order: per conversation, "
              "rotating which of the three arms runs first; fresh stores in all" if controls else
              "- order: per conversation, alternating which arm runs first; fresh stores in both"),
             f"- generated {meta['generated']}, elapsed {meta['elapsed_s']:.0f} s", ""]
    if "geomean_ratio" in s:
        lines += [summary_line("TUI / headless", s), ""]
    lags = sorted(t.shown_lag_ms for t, _ in pairs if t.shown_lag_ms is not None)
    if lags:
        lines += [f"Display lag (the longest any text of a reply waited to be drawn; the engine sends "
                  f"every 0.25 s): median over replies {lags[len(lags) // 2]:.0f} ms, worst {lags[-1]:.0f} ms.", ""]
    if sc and "geomean_ratio" in sc:
        lines += [summary_line("control / headless (headless twice, no UI)", sc), ""]
    ctrl_head = " control / headless |" if controls else ""
    lines += ["| conversation | turn | category | tokens | headless tok/s | TUI tok/s | TUI / headless | "
              f"on screen tok/s | first | identical |{ctrl_head}",
              "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if controls else "")]
    for i, (tui, run) in enumerate(pairs):
        ratio = tui.tokens_per_s / run.tokens_per_s if run.tokens_per_s > 0 and tui.tokens_per_s > 0 else None
        shown = f"{tui.shown_tokens_per_s:.1f}" if tui.shown_tokens_per_s else "-"
        first = "TUI" if tui.first else "control" if controls and controls[i].first else "headless"
        cap = " (cap)" if tui.looped or run.looped else ""
        lines.append(f"| {tui.conversation} | {tui.turn} | {tui.category} | {tui.n_tokens}{cap} | "
                     f"{run.tokens_per_s:.1f} | {tui.tokens_per_s:.1f} | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} | {shown} | {first} | "
                     f"{'yes' if tui.text == run.text else 'NO'} |"
                     + (f" {controls[i].tokens_per_s / run.tokens_per_s:.3f} |" if controls and run.tokens_per_s > 0
                        else (" - |" if controls else "")))
    text = "\n".join(lines) + "\n"
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "report.md").write_text(text, encoding="utf-8")
    with open(outdir / "replies.jsonl", "w", encoding="utf-8") as f:
        for tui, run in pairs:
            f.write(json.dumps(asdict(tui)) + "\n")
            f.write(json.dumps(asdict(run)) + "\n")
        for c in controls or []:
            f.write(json.dumps(asdict(c)) + "\n")
    (outdir / "report.json").write_text(json.dumps({"summary": s, "control": sc, "meta": meta}, indent=2) + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chat", type=int, default=6, help="MT-Bench conversations (two turns each)")
    ap.add_argument("--paste", type=int, default=4, help="long-paste conversations (one turn each)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--offset", type=int, default=0, help="skip this many conversations of each corpus")
    ap.add_argument("--paste-offset", type=int, default=None, help="skip this many long pastes (default: --offset)")
    ap.add_argument("--model", default=None, help="a GGUF for both arms (default: the bundled model)")
    ap.add_argument("--out", default=str(RESULTS / "tui-vs-headless"))
    ap.add_argument("--ui-priority", choices=("low", "idle", "normal"), default=None,
                    help="ADASPARK_UI_PRIORITY for the chat (default: the app's own choice)")
    ap.add_argument("--adaspark", default=None,
                    help="how to invoke adaspark (default: the `adaspark` command, else python -m adaspark_app.cli)")
    ap.add_argument("--control", action="store_true",
                    help="a third arm: `adaspark run` again, the A/A reference for per-reply noise")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the untimed first run (model file into the page cache, the CPU busy): "
                         "without it the first conversation's first arm ran a few percent slow")
    args = ap.parse_args(argv)
    if shutil.which("tmux") is None:
        print("tui_vs_headless: tmux is needed", file=sys.stderr)
        return 2
    adaspark = shlex.split(args.adaspark) if args.adaspark else (
        ["adaspark"] if shutil.which("adaspark") else [sys.executable, "-m", "adaspark_app.cli"])
    convs = load_conversations(args.chat, args.paste, args.offset, args.paste_offset)
    model = ["--model", args.model] if args.model else []
    command = "python -m benchmarks.ui.tui_vs_headless " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    from adaspark_app import native

    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "kernels": native.activate(), "max_tokens": args.max_tokens,
            "load_start": [round(x, 2) for x in os.getloadavg()], "conversations": [c["id"] for c in convs],
            "ui_priority": args.ui_priority, "model": args.model or "bundled"}
    t0 = time.monotonic()
    pairs: list[tuple[Reply, Reply]] = []
    controls: list[Reply] = []
    try:
        with tempfile.TemporaryDirectory(prefix="adaspark-tui-bench-") as tmp:
            work = Path(tmp)
            if not args.no_warmup and convs:
                warm = {**convs[0], "id": "warmup", "turns": convs[0]["turns"][:1]}
                run_headless(warm, adaspark, min(64, args.max_tokens), work, model=model, arm="warmup")
            for i, conv in enumerate(convs):
                if args.control:
                    arms = ("tui", "headless", "control")[i % 3:] + ("tui", "headless", "control")[:i % 3]
                else:
                    arms = ("tui", "headless") if i % 2 == 0 else ("headless", "tui")
                got: dict[str, list[Reply]] = {}
                for arm in arms:
                    if arm == "tui":
                        got[arm] = run_tui(conv, adaspark, args.max_tokens, work, session="chat",
                                           ui_priority=args.ui_priority, model=model)
                    else:
                        got[arm] = run_headless(conv, adaspark, args.max_tokens, work, model=model, arm=arm)
                for k, (tui, run) in enumerate(zip(got["tui"], got["headless"])):
                    tui.first, run.first = arms[0] == "tui", arms[0] == "headless"
                    pairs.append((tui, run))
                    if args.control:
                        ctrl = got["control"][k]
                        ctrl.first = arms[0] == "control"
                        controls.append(ctrl)
                    r = tui.tokens_per_s / run.tokens_per_s if run.tokens_per_s > 0 else float("nan")
                    c = (f", control {controls[-1].tokens_per_s / run.tokens_per_s:.3f}"
                         if args.control and run.tokens_per_s > 0 else "")
                    print(f"{conv['id']} turn {tui.turn}: headless {run.tokens_per_s:.1f} tok/s, TUI "
                          f"{tui.tokens_per_s:.1f} tok/s, ratio {r:.3f}{c}, identical {tui.text == run.text}", flush=True)
    finally:  # no chat left running in a tmux server, whatever happened
        tmux("kill-server", check=False)
        shutil.rmtree(Path(tmux_socket()).parent, ignore_errors=True)
    meta["load_end"] = [round(x, 2) for x in os.getloadavg()]
    meta["elapsed_s"] = time.monotonic() - t0
    meta["generated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(write_report(Path(args.out), command, pairs, meta, controls or None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
