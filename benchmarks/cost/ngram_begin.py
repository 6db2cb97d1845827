"""What the n-gram index costs a reply before its first token: indexing the whole prompt, or
extending the index that holds the conversation so far (`NgramSource.begin`).

Real text: the long pastes of `benchmarks/corpora/longpaste.jsonl.gz`, joined and tokenised by the
bundled model's vocabulary (no model is loaded), cut to histories of each `--lengths`; the new
message is `--message` more tokens. The two ways alternate, `--repeats` times each.

    python -m benchmarks.cost.ngram_begin [--lengths 1000,2000,4000,8000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from benchmarks.common import CORPORA, command_line, cpu_model, emit_report, read_jsonl


def _tokens(n: int) -> list[int]:
    from adaspark_app.engine.backend import default_model_path
    from llama_cpp import Llama

    texts = [c["turns"][0] for c in read_jsonl(CORPORA / "longpaste.jsonl.gz")]
    vocab = Llama(default_model_path(), vocab_only=True, verbose=False)
    out: list[int] = []
    for text in texts:
        out += vocab.tokenize(text.encode(), add_bos=False, special=False)
        if len(out) >= n:
            break
    return out[:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1000,2000,4000,8000")
    ap.add_argument("--message", type=int, default=30, help="the new message's tokens")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from adaspark_app.engine.proposers import NgramSource
    from adaspark_app.learn.precision import SourcePrecision

    lengths = [int(x) for x in args.lengths.split(",")]
    text = _tokens(max(lengths) + args.message)
    rows = []
    for n in lengths:
        history, prompt = text[:n], text[:n + args.message]
        times: dict[str, list[float]] = {"rebuilt": [], "extended": []}
        for rep in range(args.repeats):
            for way in (("rebuilt", "extended") if rep % 2 == 0 else ("extended", "rebuilt")):
                src = NgramSource(lambda t: False, SourcePrecision())
                if way == "extended":
                    src.begin(history)  # the conversation so far, indexed before the reply was asked
                t0 = time.perf_counter()
                src.begin(prompt)
                times[way].append(time.perf_counter() - t0)
        rebuilt, extended = (statistics.median(times[w]) for w in ("rebuilt", "extended"))
        rows.append((n, rebuilt, extended))
        print(f"{n} tokens: rebuilt {rebuilt * 1e3:.2f} ms, extended {extended * 1e3:.3f} ms", flush=True)
    lines = ["# The n-gram index before a reply's first token: indexing the whole prompt, or extending "
             "the conversation's index", "",
             f"- command: `{command_line('benchmarks.cost.ngram_begin', argv)}`",
             f"- machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
             f"- text: `benchmarks/corpora/longpaste.jsonl.gz` in the bundled model's tokens; a new message of "
             f"{args.message} tokens; median of {args.repeats} alternating repeats", "",
             "| history tokens | rebuilt ms | extended ms | rebuilt / extended |", "|---|---|---|---|"]
    lines += [f"| {n} | {r * 1e3:.2f} | {e * 1e3:.3f} | {r / e:.0f}x |" for n, r, e in rows]
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
