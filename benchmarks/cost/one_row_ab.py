"""One-row steps on AdaSpark's kernels against ggml's vec_dot (or their wide tiles), alternating in one process.

The two settings of the patched library's one-row switch (native.one_row_switch) compute the same
bits; this measures their speed where separate processes cannot (the same arm differs by up to
11% between runs here): per context, prefill CONTEXT tokens of a long paste, then BLOCKS blocks of
STEPS one-row steps, the setting alternating per block in ABBA order, each step's cell removed
after it. The figure is the ratio of vec_dot's block medians over ours (geometric mean), with a
95% bootstrap interval over block pairs; it also checks that the two settings' logits match bit
for bit on every step of a pair. ``--rival wide`` puts the wide tiles (the Q0 kernel's one-row
products 8 weight rows a tile, engine/one_row.py's second trial) in vec_dot's place.

    python -m benchmarks.cost.one_row_ab MODEL.gguf [MODEL2.gguf ...] [--contexts 100,400,1600]
        [--blocks 16] [--steps 4] [--threads 2] [--rival vec_dot|wide] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import statistics
import sys
import time
from pathlib import Path

from adaspark_app import native
from adaspark_app.bench.stats import bootstrap_interval, geometric_mean
from benchmarks.common import CORPORA, emit_report, read_jsonl

CORPUS = CORPORA / "longpaste.jsonl.gz"


def measure(model: str, context: int, blocks: int, steps: int, threads: int, rival: str = "vec_dot") -> dict:
    from adaspark_app.engine.backend import LlamaBackend
    from adaspark_app.engine.one_row import OURS, OneRowChooser, block_setting

    b = LlamaBackend(model, n_ctx=max(4096, context + 256), n_threads=threads)
    try:
        if native.one_row_switch() is None:
            raise SystemExit(f"one_row_ab: the patched kernels are not in use ({native.status()})")
        text = " ".join(c["turns"][0] for c in read_jsonl(CORPUS))
        toks = b.tokenize(text)[:context + steps]
        b.prefill(toks[:context], 0)
        per_block: list[tuple[str, float]] = []
        hashes: dict[str, list[str]] = {OURS: [], rival: []}
        for k in range(blocks + 1):  # block 0 warms up and is dropped
            setting = block_setting(k, rival)
            b.one_row = OneRowChooser(fixed=setting)
            times = []
            for i in range(steps):
                t0 = time.perf_counter()
                b.verify([toks[context + i]], [context + i], [(0,)])
                times.append(time.perf_counter() - t0)
                if k in (1, 3):  # the first rival and OURS blocks after the warm-up: their logits
                    hashes[setting].append(hashlib.sha256(b.logits_rows(1).tobytes()).hexdigest())
            b.seq_rm(0, context, -1)
            if k:
                per_block.append((setting, statistics.median(times)))
    finally:
        b.close()
    ours = [t for s, t in per_block if s == OURS]
    vec = [t for s, t in per_block if s == rival]
    ratios = [v / o for v, o in zip(vec, ours)]  # block pairs in order (each pair adjacent)
    ci = bootstrap_interval({f"{i:03d}": [math.log(r)] for i, r in enumerate(ratios)})  # resampling pairs
    return {"context": context, "ours_ms": 1e3 * statistics.median(ours), "vec_ms": 1e3 * statistics.median(vec),
            "ratio": geometric_mean(ratios), "ci": list(ci),
            "identical": hashes[OURS] == hashes[rival], "pairs": len(ratios)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--contexts", default="100,400,1600")
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rival", choices=("vec_dot", "wide"), default="vec_dot",
                    help="the setting timed against AdaSpark's kernels")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.blocks < 2 or args.blocks % 2:
        print("one_row_ab: --blocks must be even and 2 or more", file=sys.stderr)
        return 2
    native.activate()
    from adaspark_app.bench.runner import machine_info

    what = "ggml's vec_dot" if args.rival == "vec_dot" else "AdaSpark's wide one-row tiles"
    lines = [f"# One-row steps: {what} over AdaSpark's kernels, alternating in one process", "",
             f"- command: `python -m benchmarks.cost.one_row_ab {' '.join(argv or sys.argv[1:])}`",
             f"- CPU: {machine_info()['cpu']} ({os.cpu_count()} cores), kernels variant {native.variant()}, "
             f"threads {args.threads}; {args.blocks} blocks of {args.steps} steps per context, ABBA",
             "", f"| model | context | ours ms | {args.rival} ms | {args.rival} / ours [95% interval] | logits identical |",
             "|---|---|---|---|---|---|"]
    for model in args.models:
        for context in (int(x) for x in args.contexts.split(",")):
            r = measure(model, context, args.blocks, args.steps, args.threads, args.rival)
            line = (f"| {Path(model).stem} | {context} | {r['ours_ms']:.1f} | {r['vec_ms']:.1f} | "
                    f"{r['ratio']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | {'yes' if r['identical'] else 'NO'} |")
            print(line, flush=True)
            lines.append(line)
    emit_report(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
