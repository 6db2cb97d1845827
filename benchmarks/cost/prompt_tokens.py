"""What a reply's prompt costs before its first token: the conversation rendered through the chat
template and tokenised whole, or a piece at a time with the pieces of earlier prompts reused
(`engine/prompt_tokens.py`). Times `ChatEngine.fit_window`, which renders, tokenises and picks
the window (several windows once the context is full).

Each conversation of the set grows as in a chat: its user turns in order, then `--follow-ups` more
user turns from the conversations of `--follow` (a set of chats, taken in turn), each answered by a
reply of `--reply-chars` characters of real text (the long pastes of
`benchmarks/corpora/longpaste.jsonl.gz`, in turn). Each way keeps its own state from turn to turn, as
a chat keeps it between replies; the ways alternate at every turn. Every turn's window and tokens
must be the same both ways. The ratio is whole / pieces per turn: geometric mean, 95% bootstrap
interval over conversations.

`--ttft` times the whole wait for a reply's first token instead (`ReplyResult.prefill_s`, which
counts the prompt's preparation): an engine per way, each reading the history ahead before the
turn's message as the chat does while it is typed (`ChatEngine.read_ahead`), then replying
`--reply-tokens` tokens, greedy; the replies must be the same both ways.

    python -m benchmarks.cost.prompt_tokens benchmarks/sets/sharegpt-paste-16-c.jsonl.gz \
        --follow benchmarks/sets/sharegpt-chat-12-h.jsonl.gz [--follow-ups 9] [--n-ctx 8192]
        [--reply-chars 1500] [--max-tokens 512] [--ttft] [--model GGUF] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from pathlib import Path

from benchmarks.common import CORPORA, command_line, cpu_model, emit_report, read_jsonl

WAYS = ("whole", "pieces")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("set", type=Path, help="a JSONL set of conversations (their user turns)")
    ap.add_argument("--follow", type=Path, help="a JSONL set of chats whose user turns follow each conversation's own")
    ap.add_argument("--follow-ups", type=int, default=9)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=512, help="the reply's cap the window leaves room for")
    ap.add_argument("--reply-chars", type=int, default=1500, help="each reply's length in characters")
    ap.add_argument("--turn-chars", type=int, default=6000, help="a user turn is cut to this many characters")
    ap.add_argument("--limit", type=int, default=0, help="conversations (0: all)")
    ap.add_argument("--ttft", action="store_true", help="time the first token's wait after reading ahead")
    ap.add_argument("--reply-tokens", type=int, default=4, help="--ttft: each timed reply's length")
    ap.add_argument("--model", help="a GGUF (default: the bundled model)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from adaspark_app import native

    native.activate()
    from adaspark_app.bench.stats import bootstrap_interval, geometric_mean
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.engine.prompt_tokens import PromptTokens

    conversations = read_jsonl(args.set)[:args.limit or None]
    follow = [t for c in read_jsonl(args.follow) for t in c["turns"]] if args.follow else []
    replies = [t if isinstance(t, str) else t["content"]
               for c in read_jsonl(CORPORA / "longpaste.jsonl.gz") for t in c["turns"]]
    engines = {way: ChatEngine(args.model, n_ctx=args.n_ctx, arm="ar") for way in (WAYS if args.ttft else WAYS[:1])}
    engine = engines["whole"]  # fit_window's way: one engine, its PromptTokens swapped per way
    log_ratios: dict[str, list[float]] = {}
    rows: list[tuple[int, float, float, int]] = []  # (prompt tokens, whole s, pieces s, dropped turns)
    differ = 0
    try:
        b = engine.backend
        t0 = time.perf_counter()
        specials = b.special_tokens()  # once a model, as the engine's one PromptTokens asks it
        scan_s = time.perf_counter() - t0
        for ci, conv in enumerate(conversations):
            cid = str(conv.get("id", ci))
            state = {"whole": PromptTokens(b.tokenize_bytes, lambda: specials, keep_tokens=0),
                     "pieces": PromptTokens(b.tokenize_bytes, lambda: specials)}
            for way, eng in engines.items():
                eng.reset_conversation()
                eng.prompts = state[way]
            messages: list[dict[str, str]] = []
            more = [follow[(ci * args.follow_ups + k) % len(follow)] for k in range(args.follow_ups)] if follow else []
            for ti, turn in enumerate([*conv["turns"], *more]):
                asked = [*messages, {"role": "user", "content": turn[:args.turn_chars]}]
                got: dict[str, tuple] = {}
                secs: dict[str, float] = {}
                for way in (WAYS if ti % 2 == 0 else WAYS[::-1]):
                    if args.ttft:
                        eng = engines[way]
                        if messages:
                            eng.read_ahead(cid, messages, max_tokens=args.reply_tokens)
                        r = eng.generate(cid, asked, max_tokens=args.reply_tokens)
                        got[way], secs[way] = (r.text, r.dropped_turns), r.prefill_s
                    else:
                        engine.prompts = state[way]
                        start = time.perf_counter()
                        got[way] = engine.fit_window(asked, args.max_tokens)
                        secs[way] = time.perf_counter() - start
                differ += got["whole"] != got["pieces"]
                window, tokens = engines["whole"].fit_window(asked, args.ttft and args.reply_tokens or args.max_tokens)
                rows.append((len(tokens), secs["whole"], secs["pieces"], window.dropped_turns))
                log_ratios.setdefault(cid, []).append(math.log(secs["whole"] / secs["pieces"]))
                reply = replies[(ci * 7 + ti) % len(replies)][:args.reply_chars]
                messages = [*asked, {"role": "assistant", "content": reply}]
            print(f"{cid}: {len(log_ratios[cid])} turns, last prompt {rows[-1][0]} tokens", flush=True)
    finally:
        for eng in engines.values():
            eng.close()
    ratio = geometric_mean(math.exp(x) for xs in log_ratios.values() for x in xs)
    lo, hi = bootstrap_interval(log_ratios)
    what = (f"time to first token after reading ahead ({args.reply_tokens}-token replies, greedy)"
            if args.ttft else "fit_window")
    lines = ["# A reply's prompt before its first token: tokenised whole, or a piece at a time", "",
             f"- command: `{command_line('benchmarks.cost.prompt_tokens', argv)}`",
             f"- machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
             f"- model: {engine.model_name}; context {args.n_ctx}, replies of {args.reply_chars} characters of "
             f"`benchmarks/corpora/longpaste.jsonl.gz`; {len(rows)} turns of {len(log_ratios)} conversations of "
             f"`{args.set}`" + (f", each followed by {args.follow_ups} user turns of `{args.follow}`" if follow else "")
             + f"; the vocabulary's scan for its special tokens (once a model): {scan_s * 1e3:.1f} ms",
             f"- {'replies' if args.ttft else 'windows and tokens'} different between the ways: {differ} of {len(rows)}",
             "", f"**whole / pieces, {what} per turn: {ratio:.2f}x [{lo:.2f}, {hi:.2f}]**", "",
             "| prompt tokens | turns | whole ms (median) | pieces ms (median) | turns with turns dropped |",
             "|---|---|---|---|---|"]
    edges = [0, 1000, 2000, 4000, 8000, 1 << 30]
    for a, z in zip(edges, edges[1:]):
        part = [r for r in rows if a <= r[0] < z]
        if part:
            label = f"{a}-{z - 1}" if z < 1 << 30 else f"{a}+"
            lines.append(f"| {label} | {len(part)} | {statistics.median(r[1] for r in part) * 1e3:.2f} | "
                         f"{statistics.median(r[2] for r in part) * 1e3:.2f} | {sum(r[3] > 0 for r in part)} |")
    emit_report(lines, args.out)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
