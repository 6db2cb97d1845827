"""Verify time by width and context length, for several builds of libggml-cpu side by side.

Each library directory (a copy of llama-cpp-python's `lib/` with one `libggml-cpu.so` in place of
its own, as `native.activate` makes them) is used through ``LLAMA_CPP_LIB_PATH`` in its own
process. In a process: prefill CONTEXT tokens of a long paste, then REPS rounds, each verifying
a chain of every width (in a shuffled order, the cells removed after each); the first round is
dropped and the per-width median of the wall time of `llama_decode` (plus the argmax) is the
process's figure. Libraries alternate per pass and context, so drift hits them alike; the figure
is the median over passes. Wall time with the threads the engine uses: run it on a quiet machine.

    python -m benchmarks.cost.context_costs MODEL.gguf --lib before=DIR --lib after=DIR
        [--contexts 100,800,1600,3000] [--widths 1,2,4,8,16] [--passes 3] [--reps 7] [--threads 2]
        [--set NAME:VAR=VALUE ...] [--out FILE.md]

``--set`` gives one library's processes an environment variable, e.g. the same directory twice,
``--lib stock=DIR --lib ours=DIR --set stock:ADASPARK_STOCK_ATTENTION=1``, to compare ggml's own
attention kernel with AdaSpark's in one build.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from adaspark_app.bench.runner import machine_info

from benchmarks.common import CORPORA, ROOT, emit_report

CORPUS = CORPORA / "longpaste.jsonl.gz"

_CHILD = r"""
import json, random, statistics, sys, time
from adaspark_app.engine.backend import LlamaBackend
from benchmarks.common import read_jsonl
model, context, widths, reps, threads = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
b = LlamaBackend(model, n_ctx=max(4096, context + 256), n_threads=threads)
text = " ".join(c["turns"][0] for c in read_jsonl(%(corpus)r))
toks = b.tokenize(text)[:context]
b.prefill(toks, 0)
pos = len(toks)
times = {w: [] for w in widths}
rng = random.Random(0)
for r in range(reps + 1):
    order = list(widths)
    rng.shuffle(order)
    for w in order:
        out = b.verify(toks[:w], list(range(pos, pos + w)), [(0,)] * w)
        b.seq_rm(0, pos, -1)
        if r:
            times[w].append(out.seconds)
print(json.dumps({w: statistics.median(v) for w, v in times.items()}))
"""


def measure(lib: str, model: str, context: int, widths: list[int], reps: int, threads: int,
            extra: dict[str, str] | None = None) -> dict[int, float]:
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": lib, **(extra or {})}
    code = _CHILD % {"corpus": str(CORPUS)}
    out = subprocess.run([sys.executable, "-c", code, model, str(context), json.dumps(widths), str(reps), str(threads)],
                         env=env, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--lib", action="append", required=True, help="NAME=DIR, two or more; the first is the base")
    ap.add_argument("--contexts", default="100,800,1600,3000")
    ap.add_argument("--widths", default="1,2,4,8,16")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="NAME:VAR=VALUE, an environment variable for one library")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    libs = [tuple(x.split("=", 1)) for x in args.lib]
    if len(libs) < 2 or any(len(x) != 2 or not Path(x[1]).is_dir() for x in libs):
        print("context_costs: give two or more --lib NAME=DIR (existing directories)", file=sys.stderr)
        return 2
    extra: dict[str, dict[str, str]] = {}
    for item in args.set:
        name, _, assign = item.partition(":")
        var, eq, value = assign.partition("=")
        if name not in dict(libs) or not var or not eq:
            print(f"context_costs: --set {item}: give NAME:VAR=VALUE with NAME one of the --lib names", file=sys.stderr)
            return 2
        extra.setdefault(name, {})[var] = value
    contexts = [int(x) for x in args.contexts.split(",")]
    widths = [int(x) for x in args.widths.split(",")]
    got: dict[tuple[str, int], list[dict[int, float]]] = {}
    for p in range(args.passes):
        for context in contexts:
            order = libs if (p + context) % 2 == 0 else libs[::-1]
            for name, lib in order:
                got.setdefault((name, context), []).append(measure(lib, args.model, context, widths, args.reps, args.threads,
                                                                    extra.get(name)))
                print(f"pass {p + 1} context {context} {name}: " + ", ".join(
                    f"{w}: {got[(name, context)][-1][w] * 1e3:.1f} ms" for w in widths), file=sys.stderr, flush=True)
    med = {k: {w: statistics.median(r[w] for r in v) for w in widths} for k, v in got.items()}
    base = libs[0][0]
    lines = [f"# Verify time by context: {', '.join(n for n, _ in libs)}", "",
             f"- command: `python -m benchmarks.cost.context_costs {' '.join(argv or sys.argv[1:])}`",
             f"- CPU: {machine_info()['cpu']} ({os.cpu_count()} cores), threads {args.threads}; median over {args.passes} passes "
             f"of per-process medians of {args.reps} rounds",
             *[f"- `{n}` runs with " + ", ".join(f"`{k}={v}`" for k, v in e.items()) for n, e in extra.items()], "",
             "ms per verify (and over the one-row step of the same library and context); last columns: "
             f"each library over `{base}` at the same width and context", "",
             "| context | rows | " + " | ".join(f"`{n}` ms (over 1 row)" for n, _ in libs) + " | "
             + " | ".join(f"`{n}` / `{base}`" for n, _ in libs[1:]) + " |",
             "|---|---|" + "---|" * (2 * len(libs) - 1)]
    for context in contexts:
        for w in widths:
            cells = [f"{med[(n, context)][w] * 1e3:.1f} ({med[(n, context)][w] / med[(n, context)][1]:.2f})" for n, _ in libs]
            ratios = [f"{med[(n, context)][w] / med[(base, context)][w]:.3f}" for n, _ in libs[1:]]
            lines.append(f"| {context} | {w} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
