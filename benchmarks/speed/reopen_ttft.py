"""How long does a reopened conversation wait for its first token: its saved context read from
disk, against the whole history prefilled (the chat before saved contexts)?

Per conversation of a set: a first engine replies to the first turn (`--first-tokens`) and keeps
the conversation's context as the chat does when it leaves it. Then the second turn is asked of a
fresh cache, both ways interleaved (the order alternates by repeat): `saved`, an engine keeping
saved contexts (`ChatEngine(saved_context_mb=...)`), and `prefill`, one that keeps none. Time to
first token is the reply's `prefill_s`: the saved context's lookup, checksum and load included.
Both ways' replies (`--reply-tokens`, greedy) must be byte-identical. The file was just written,
so it is read from the page cache, as in a chat reopened soon after; after a reboot, add the
disk's read time of its size.

    python -m benchmarks.speed.reopen_ttft benchmarks/sets/sharegpt-paste-16-e.jsonl [--limit 8] [--repeats 3]

The ratio is prefill / saved time to first token: a geometric mean over conversations with a 95%
bootstrap interval (adaspark_app.bench.stats). The save, paid when the chat leaves the
conversation, is reported beside it.
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
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    native.activate()
    from adaspark_app.bench.stats import bootstrap_interval, geometric_mean
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.store import Store

    convs = [c for c in read_jsonl(args.set) if c.get("turns")][:args.limit]
    folder = tempfile.mkdtemp(prefix="reopen-ttft-")
    store = Store.open(os.path.join(folder, "chats.db"))
    kw = {"model_path": args.model, "store": store, "n_ctx": args.n_ctx}
    rows, log_ratios = [], {}
    with ChatEngine(saved_context_mb=1 << 14, **kw) as saved, ChatEngine(**kw) as plain:
        for conv in convs:
            cid = store.create_conversation(str(conv.get("id")), "bench")
            first = [{"role": "user", "content": conv["turns"][0]}]
            r1 = saved.generate(cid, first, max_tokens=args.first_tokens)
            t0 = time.perf_counter()
            wrote = saved.save_context()
            save_s = time.perf_counter() - t0
            size = saved.saved_contexts.path_for(cid).stat().st_size if wrote else 0
            second = conv["turns"][1] if len(conv["turns"]) > 1 else FOLLOW_UP
            history = first + [{"role": "assistant", "content": r1.text}, {"role": "user", "content": second}]
            times: dict[str, list[float]] = {"saved": [], "prefill": []}
            texts, restored, prompt = set(), 0, 0
            for rep in range(args.repeats):
                for way in (("saved", "prefill") if rep % 2 == 0 else ("prefill", "saved")):
                    eng = saved if way == "saved" else plain
                    eng.reset_conversation()  # a reopened chat: nothing of it in the KV cache
                    r = eng.generate(cid, history, max_tokens=args.reply_tokens)
                    times[way].append(r.prefill_s)
                    texts.add(r.text)
                    if way == "saved":
                        restored, prompt = r.restored_tokens, r.prompt_length
            ratio = statistics.median(times["prefill"]) / statistics.median(times["saved"])
            if restored:
                log_ratios[cid] = [math.log(p / s) for p, s in zip(times["prefill"], times["saved"])]
            rows.append((conv.get("id"), prompt, restored, statistics.median(times["prefill"]),
                         statistics.median(times["saved"]), ratio, save_s, size, len(texts) == 1))
            print(f"{conv.get('id')}: {prompt} prompt tokens, {restored} from disk, prefill/saved {ratio:.1f}x, "
                  f"identical {len(texts) == 1}", flush=True)
    store.close()
    lines = ["# Time to first token in a reopened conversation: its saved context against a prefill", "",
             f"- command: `{command_line('benchmarks.speed.reopen_ttft', argv)}`",
             f"- machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
             f"- model: {Path(args.model).name if args.model else 'the bundled SmolLM2-135M-Instruct Q4_1'}, n_ctx {args.n_ctx}",
             f"- {len(rows)} conversations, {args.repeats} repeats each way, interleaved; the saved file read "
             "from the page cache (written just before)", ""]
    if log_ratios:
        lo, hi = bootstrap_interval(log_ratios)
        gm = geometric_mean([math.exp(x) for v in log_ratios.values() for x in v])
        lines += [f"**prefill / saved, time to first token: {gm:.1f}x [{lo:.1f}, {hi:.1f}]** "
                  f"(geometric mean, 95% bootstrap interval over {len(log_ratios)} conversations)", ""]
    same = sum(r[-1] for r in rows)
    lines += [f"Replies identical both ways: {same} of {len(rows)}.", "",
              "| conversation | prompt tokens | from disk | prefill ms | saved ms | prefill / saved | save ms | file MB |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {cid} | {p} | {rs} | {pf * 1e3:.0f} | {sv * 1e3:.0f} | {ra:.1f}x | {sa * 1e3:.0f} | {sz / 1e6:.1f} |"
              for cid, p, rs, pf, sv, ra, sa, sz, _ in rows]
    emit_report(lines, args.out)
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
