"""How long does a reopened conversation wait for its first token: its saved context read from
disk, or its history read while the next message is typed, against the whole history prefilled
(the chat before either)?

Per conversation of a set: a first engine replies to the first turn (`--first-tokens`) and keeps
the conversation's context as the chat does when it leaves it. Then the second turn is asked of a
fresh cache, the ways interleaved (their order turns by repeat): `saved`, an engine keeping saved
contexts (`ChatEngine(saved_context_mb=...)`); `prefill`, one that keeps none; `ahead`, that one
after `ChatEngine.read_ahead` of the history (what the chat does when a conversation opens),
stopped after `--typing` seconds if given (the time the user takes to type), else read whole.
Time to first token is the reply's `prefill_s`: the prompt's tokens and the saved context's lookup, checksum and load
included. Every way's replies (`--reply-tokens`, greedy) must be byte-identical. The file was just
written, so it is read from the page cache, as in a chat reopened soon after; after a reboot, add
the disk's read time of its size.

    python -m benchmarks.speed.reopen_ttft benchmarks/sets/sharegpt-paste-16-e.jsonl.gz [--limit 8] [--repeats 3]
        [--ways saved,prefill,ahead] [--typing S] [--after-reply | --typed N]

`--after-reply` times a follow-up instead (ways prefill and ahead): the first turn is replied to
again before each timed reply, so the cache holds the conversation as a reply leaves it, and the
ahead way reads the history as the chat does after every reply (the turn's end, the next one's
start, and the reply as its text tokenises).

`--typed N` times a new conversation's first message instead (ways prefill and ahead): its text
but the last N characters is pasted into the message box, and the ahead way reads it as a draft
(`read_ahead(..., draft=...)`, what the chat does once typing pauses) while the last N characters
are typed (`--typing` seconds, default read whole), then sends the whole message.

Each ratio is prefill / that way's time to first token: a geometric mean over conversations with
a 95% bootstrap interval (adaspark_app.bench.stats). The save, paid when the chat leaves the
conversation, and the history's reading, paid while the user types, are reported beside them.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from adaspark_app import native
from benchmarks.common import command_line, cpu_model, emit_report, read_jsonl

FOLLOW_UP = "Summarise what I sent in three bullet points."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set", help="a JSONL set: {'id', 'turns': [user messages]}")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--first-tokens", type=int, default=64, help="the first reply's length")
    ap.add_argument("--reply-tokens", type=int, default=16, help="the timed reply's length (compared)")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--model", help="a GGUF (default: the bundled model)")
    ap.add_argument("--ways", default="saved,prefill", help="of saved, prefill, ahead (prefill is the base)")
    ap.add_argument("--typing", type=float, help="the `ahead` way: stop reading the history after this many "
                    "seconds (default: read it whole)")
    ap.add_argument("--after-reply", action="store_true",
                    help="time a follow-up: the cache holds the first reply, as a chat that goes on")
    ap.add_argument("--typed", type=int, help="time a first message whose text but its last TYPED characters "
                    "was pasted and read ahead while those are typed")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    if "prefill" not in ways or not set(ways) <= {"saved", "prefill", "ahead"} or len(ways) < 2:
        ap.error("--ways: prefill and one or more of saved, ahead")
    if (args.after_reply or args.typed) and "saved" in ways:
        ap.error("--after-reply, --typed: the ways prefill and ahead (nothing is read from disk in a chat that goes on)")
    if args.after_reply and args.typed:
        ap.error("--after-reply or --typed, not both")
    native.activate()
    from adaspark_app.bench.stats import bootstrap_interval, geometric_mean
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.store import Store

    convs = [c for c in read_jsonl(args.set) if c.get("turns")][:args.limit]
    folder = tempfile.mkdtemp(prefix="reopen-ttft-")
    store = Store.open(os.path.join(folder, "chats.db"))
    kw = {"model_path": args.model, "store": store, "n_ctx": args.n_ctx}
    rows, log_ratios = [], {w: {} for w in ways if w != "prefill"}
    with ChatEngine(saved_context_mb=1 << 14, **kw) as saved, ChatEngine(**kw) as plain:
        for conv in convs:
            cid = store.create_conversation(str(conv.get("id")), "bench")
            first = [{"role": "user", "content": conv["turns"][0]}]
            save_s, size = 0.0, 0
            if args.typed:  # the first message itself, its start pasted before the rest is typed
                history, draft = first, conv["turns"][0][:-args.typed]
            else:
                r1 = saved.generate(cid, first, max_tokens=args.first_tokens)
                t0 = time.perf_counter()
                wrote = saved.save_context()
                save_s = time.perf_counter() - t0
                size = saved.saved_contexts.path_for(cid).stat().st_size if wrote else 0
                second = conv["turns"][1] if len(conv["turns"]) > 1 else FOLLOW_UP
                history, draft = first + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": second}], ""
            times: dict[str, list[float]] = {w: [] for w in ways}
            texts, given, prompt, read_s = set(), {w: 0 for w in ways}, 0, []
            for rep in range(args.repeats):
                for way in ways[rep % len(ways):] + ways[:rep % len(ways)]:
                    eng = saved if way == "saved" else plain
                    eng.reset_conversation()  # a reopened chat: nothing of it in the KV cache
                    if args.after_reply:  # the cache as the first reply leaves it (greedy: the same reply)
                        eng.generate(cid, first, max_tokens=args.first_tokens)
                    if way == "ahead":
                        t1 = time.perf_counter()
                        stop = None if args.typing is None else (lambda t1=t1: time.perf_counter() - t1 >= args.typing)
                        eng.read_ahead(cid, history[:-1], max_tokens=args.reply_tokens, stop=stop, draft=draft)
                        read_s.append(time.perf_counter() - t1)
                    r = eng.generate(cid, history, max_tokens=args.reply_tokens)
                    times[way].append(r.prefill_s)
                    texts.add(r.text)
                    given[way] = r.restored_tokens + r.read_ahead_tokens
                    prompt = r.prompt_length
            for way in log_ratios:
                if given[way]:
                    log_ratios[way][cid] = [math.log(p / s) for p, s in zip(times["prefill"], times[way])]
            medians = {w: statistics.median(v) for w, v in times.items()}
            rows.append((conv.get("id"), prompt, given, medians, save_s, size,
                         statistics.median(read_s) if read_s else None, len(texts) == 1))
            print(f"{conv.get('id')}: {prompt} prompt tokens, " + ", ".join(
                f"{w} {given[w]} given, {medians['prefill'] / medians[w]:.1f}x" for w in log_ratios)
                + f", identical {len(texts) == 1}", flush=True)
    store.close()
    others = list(log_ratios)
    typing = "in full" if args.typing is None else (
        f"until {args.typing:g} s had passed (the message's typing), at the end of a chunk")
    title = ("# Time to first token of a follow-up: the history read ahead after the reply, against none"
             if args.after_reply else f"# Time to first token of a pasted text and {args.typed} characters typed "
             "after it: the paste read ahead while they are typed, against none" if args.typed else
             "# Time to first token in a reopened conversation: its saved context, or its history read ahead, "
             "against a prefill")
    lines = [title, "",
             f"- command: `{command_line('benchmarks.speed.reopen_ttft', argv)}`",
             f"- machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
             f"- model: {Path(args.model).name if args.model else 'the bundled SmolLM2-135M-Instruct Q4_1'}, n_ctx {args.n_ctx}",
             f"- {len(rows)} conversations, {args.repeats} repeats each way, interleaved"
             + ("; the saved file read from the page cache (written just before)" if "saved" in ways else "")
             + (f"; the {'pasted text' if args.typed else 'history'} read ahead {typing}" if "ahead" in ways else ""),
             ""]
    for way in others:
        if log_ratios[way]:
            lo, hi = bootstrap_interval(log_ratios[way])
            gm = geometric_mean([math.exp(x) for v in log_ratios[way].values() for x in v])
            d = 1 if lo >= 10 else 2  # a follow-up's small ratios need their second decimal
            lines += [f"**prefill / {way}, time to first token: {gm:.{d}f}x [{lo:.{d}f}, {hi:.{d}f}]** "
                      f"(geometric mean, 95% bootstrap interval over {len(log_ratios[way])} conversations)", ""]
    same = sum(r[-1] for r in rows)
    lines += [f"Replies identical every way: {same} of {len(rows)}.", ""]
    head = ["conversation", "prompt tokens", "prefill ms"]
    for way in others:
        head += [f"{way}: tokens given", f"{way} ms", f"prefill / {way}"]
    head += (["save ms", "file MB"] if "saved" in ways else []) + (["reading ahead ms"] if "ahead" in ways else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cid, p, gv, med, sa, sz, rd, _ in rows:
        cells = [str(cid), str(p), f"{med['prefill'] * 1e3:.0f}"]
        for way in others:
            cells += [str(gv[way]), f"{med[way] * 1e3:.0f}", f"{med['prefill'] / med[way]:.{1 if med['prefill'] >= 10 * med[way] else 2}f}x"]
        if "saved" in ways:
            cells += [f"{sa * 1e3:.0f}", f"{sz / 1e6:.1f}"]
        if "ahead" in ways:
            cells.append(f"{rd * 1e3:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    emit_report(lines, args.out)
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
