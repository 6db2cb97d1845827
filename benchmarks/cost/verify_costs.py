"""Verify cost by width, stock llama.cpp kernels against AdaSpark's Q4_1 multi-row kernels.

Each arm runs in its own process (a process loads one libggml-cpu): stock with
ADASPARK_STOCK_KERNELS=1, patched without. The processes alternate, ``--passes`` times each; every
process prefills a context and times chain verifies of each width (median of ``--reps``), KV
restored after each. Reported: verify time over the same process's one-row time, and the one-row
time of patched over stock (pairs of consecutive processes, geometric mean).

    python -m benchmarks.cost.verify_costs [--context 800] [--passes 3] [--reps 7] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import emit_report

WIDTHS = (1, 2, 3, 4, 8, 16, 32, 64)

_CHILD = """
import json, statistics, sys
from adaspark_app import native
native.activate()  # unless ADASPARK_STOCK_KERNELS (the parent sets it for the stock run)
from adaspark_app.engine.backend import LlamaBackend, default_model_path
ctx, reps, widths = int(sys.argv[1]), int(sys.argv[2]), [int(w) for w in sys.argv[3].split(",")]
b = LlamaBackend(default_model_path(), n_ctx=4096, n_threads=2)
toks = b.tokenize("The quick brown fox jumps over the lazy dog. " * 400)[:ctx + 1]
b.prefill(toks[:-1], 0)
n = len(toks) - 1
res = {w: [] for w in widths}
for _ in range(reps):
    for w in widths:
        out = b.verify([toks[-1]] * w, list(range(n, n + w)), [(0,)] * w)
        res[w].append(out.seconds)
        b.seq_rm(0, n, -1)
print(json.dumps({"kernels": native.status(), "seconds": {w: statistics.median(v) for w, v in res.items()}}))
"""


def _run(stock: bool, context: int, reps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "ADASPARK_KERNELS_DIR")}
    if stock:
        env["ADASPARK_STOCK_KERNELS"] = "1"
    else:
        env.pop("ADASPARK_STOCK_KERNELS", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, str(context), str(reps), ",".join(map(str, WIDTHS))],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=800)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    runs: dict[str, list[dict]] = {"stock": [], "patched": []}
    for p in range(a.passes):
        for arm in (("stock", "patched") if p % 2 == 0 else ("patched", "stock")):
            runs[arm].append(_run(arm == "stock", a.context, a.reps))
        print(f"pass {p + 1}/{a.passes} done", flush=True)
    if runs["patched"][0]["kernels"] != "q4_1-tinyblas":
        sys.exit(f"the patched kernels are not in use: {runs['patched'][0]['kernels']}")

    def ratio(r: dict, w: int) -> float:
        return r["seconds"][str(w)] / r["seconds"]["1"]

    lines = [f"# Verify cost by width at {a.context} tokens of context: stock kernels vs AdaSpark's Q4_1 kernels", "",
             f"`python -m benchmarks.cost.verify_costs --context {a.context} --passes {a.passes} --reps {a.reps}`", "",
             f"Machine: {platform.processor() or platform.machine()}, 2 threads; bundled SmolLM2-135M-Instruct Q4_1. "
             f"{a.passes} processes per arm, alternating; in each, the median of {a.reps} verifies per width.", "",
             "| rows | stock: time over one row | patched: time over one row | patched / stock |", "|---|---|---|---|"]
    for w in WIDTHS:
        s = statistics.median(ratio(r, w) for r in runs["stock"])
        p = statistics.median(ratio(r, w) for r in runs["patched"])
        lines.append(f"| {w} | {s:.2f} | {p:.2f} | {p / s:.3f} |")
    one = [p["seconds"]["1"] / s["seconds"]["1"] for s, p in zip(runs["stock"], runs["patched"])]
    g = math.exp(statistics.mean(math.log(x) for x in one))
    ms = statistics.median(r["seconds"]["1"] for r in runs["stock"]) * 1e3
    lines += ["", f"One-row step, patched over stock: {g:.3f} (per pair: {', '.join(f'{x:.3f}' for x in one)}); "
              f"stock one-row step {ms:.2f} ms. One-row products keep the stock kernel."]
    emit_report(lines, a.out)


if __name__ == "__main__":
    main()
