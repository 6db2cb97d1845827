"""Verify cost by width in 1-thread CPU time: ggml's vec_dot path (GGML_CPU_TILED_MM=0) against its
tiled K-quant matmul for every batch (GGML_CPU_TILED_MM_FORCE=1), with a roofline estimate.
With AdaSpark's libggml-cpu (native.activate) the ``off`` mode runs its Q4_1, Q4_K, Q6_K (and,
on the AVX-512 VNNI variants, Q0) kernels for every batch, one row included; ``ADASPARK_STOCK_KERNELS=1`` measures the
stock libraries, and ``LLAMA_CPP_LIB_PATH`` with ``ADASPARK_KERNELS_DIR`` set to the same directory
(and ``ADASPARK_KERNELS_VARIANT``) an earlier build's runtime directory, for a before/after.

The machine is shared, so wall-clock time is noise: each measurement is the calling thread's CPU
time (``time.thread_time``) around one ``llama_decode`` with ``n_threads=1`` (ggml then computes
on the calling thread; the process CPU time is recorded too, as a check). Every mode runs in its
own process (ggml reads the switches once); modes alternate, ``--passes`` processes each. In a
process: prefill ``--context`` tokens of a long paste, then ``--reps`` rounds, each verifying a
chain of every width in a shuffled order (the KV cells removed after each), the first round
dropped as warm-up; the per-width median is that process's figure.

The roofline (``--roofline``): weight bytes a forward reads (the GGUF's tensors, less
token_embd when the model has its own output head: a forward reads only its rows), KV-cache bytes
at the context, 2 x parameters flops per row, against a 1-thread numpy streaming read of a 1 GB
array and a stated peak int8 rate. Predicted cost of n rows over one row is
max(bytes / bandwidth, n x ops / peak) over the same for n = 1.

    python -m benchmarks.cost.verify_cost_cpu MODEL.gguf [--context 400] [--passes 4] [--reps 9]
        [--modes off,force] [--roofline] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import CORPORA, ROOT, module_argv, read_jsonl

WIDTHS = (1, 2, 4, 8, 16, 32, 64)
CORPUS = CORPORA / "longpaste.jsonl.gz"
#: The ggml switches of each mode (tiled.cpp reads them once, at the first K-quant matmul).
MODES = {"off": {"GGML_CPU_TILED_MM": "0"},
         "force": {"GGML_CPU_TILED_MM": "1", "GGML_CPU_TILED_MM_FORCE": "1"},
         "stock": {"GGML_CPU_TILED_MM": "1"}}  # ggml's default: tiled at 8+ rows


def child(model: str, context: int, reps: int, widths: list[int], seed: int) -> dict:
    """Run in the mode's own process: per width, the CPU seconds of each timed decode."""
    from adaspark_app import native

    native.activate()
    from adaspark_app.engine.backend import LlamaBackend

    b = LlamaBackend(model, n_ctx=4096, n_threads=1)
    text = "\n".join(c["turns"][0] for c in read_jsonl(CORPUS))
    toks = b.tokenize(text)[:context + max(widths)]
    b.prefill(toks[:context], 0, argmax=False)
    rng = random.Random(seed)
    cpu: dict[int, list[float]] = {w: [] for w in widths}
    proc: dict[int, list[float]] = {w: [] for w in widths}
    for rep in range(reps + 1):
        order = list(widths)
        rng.shuffle(order)
        for w in order:
            b._fill_batch(toks[context:context + w], range(context, context + w), [(0,)] * w, [True] * w)
            t0, p0 = time.thread_time(), time.process_time()
            b._decode()
            t1, p1 = time.thread_time(), time.process_time()
            b.seq_rm(0, context, -1)
            if rep:  # round 0 is warm-up
                cpu[w].append(t1 - t0)
                proc[w].append(p1 - p0)
    b.close()
    return {"kernels": native.status(), "variant": native.variant(),
            "env": {k: os.environ.get(k) for k in ("GGML_CPU_TILED_MM", "GGML_CPU_TILED_MM_FORCE")},
            "thread_s": {w: statistics.median(v) for w, v in cpu.items()},
            "process_s": {w: statistics.median(v) for w, v in proc.items()}}


def run_mode(model: str, mode: str, context: int, reps: int, seed: int) -> dict:
    """One process in `mode`; its per-width medians."""
    env = {k: v for k, v in os.environ.items() if k not in ("GGML_CPU_TILED_MM", "GGML_CPU_TILED_MM_FORCE")}
    env.update(MODES[mode])
    out = subprocess.run(module_argv("benchmarks.cost.verify_cost_cpu", "_child", model, str(context), str(reps),
                                     ",".join(map(str, WIDTHS)), str(seed)),
                         env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["thread_s"] = {int(k): v for k, v in res["thread_s"].items()}
    res["process_s"] = {int(k): v for k, v in res["process_s"].items()}
    return res


# ---------------------------------------------------------------- roofline
def model_bytes(model: str) -> dict:
    """Tensor bytes from the GGUF's table (offset differences), and what a forward reads."""
    from adaspark_app.gguf_file import read_gguf_header

    h = read_gguf_header(model, skip_arrays=True)
    size = os.path.getsize(model)
    items = sorted(h.tensors.items(), key=lambda kv: kv[1].offset)
    nbytes = {}
    for i, (name, info) in enumerate(items):
        end = items[i + 1][1].offset if i + 1 < len(items) else size - h.data_offset
        nbytes[name] = end - info.offset
    total = sum(nbytes.values())
    has_output = "output.weight" in nbytes
    read = total - (nbytes.get("token_embd.weight", 0) if has_output else 0)
    params = sum(info.n_elements for name, info in h.tensors.items()
                 if len(info.shape) >= 2 and name != "token_embd.weight")
    if not has_output:  # tied head: token_embd is the output matrix
        params += h.tensors["token_embd.weight"].n_elements
    arch = h.kv.get("general.architecture")
    g = lambda k: h.kv.get(f"{arch}.{k}")  # noqa: E731
    n_layer, n_head = int(g("block_count")), int(g("attention.head_count"))
    n_kv = int(g("attention.head_count_kv") or n_head)
    head_dim = int(g("attention.key_length") or int(g("embedding_length")) // n_head)
    return {"total_bytes": total, "read_bytes": read, "matmul_params": params, "n_layer": n_layer,
            "n_head": n_head, "n_kv_head": n_kv, "head_dim": head_dim, "tied_output": not has_output}


def stream_bandwidth(gb: float = 1.0, reps: int = 5) -> float:
    """Bytes per CPU-second of a 1-thread streaming read (numpy sum over a float64 array)."""
    import numpy as np

    a = np.ones(int(gb * (1 << 30)) // 8)
    a.sum()
    best = 0.0
    for _ in range(reps):
        t0 = time.thread_time()
        a.sum()
        best = max(best, a.nbytes / (time.thread_time() - t0))
    return best


def roofline(mb: dict, context: int, bw: float, peak_ops: float, widths=WIDTHS) -> dict:
    """Predicted seconds per width and over one row (see the module docstring)."""
    kv_row = 2 * mb["n_layer"] * mb["n_kv_head"] * mb["head_dim"] * context * 2  # BF16 K + F16 V
    attn_ops = 4 * mb["n_layer"] * mb["n_head"] * mb["head_dim"] * context
    out = {}
    for n in widths:
        mem = (mb["read_bytes"] + kv_row) / bw  # weights and KV once per forward
        ops = n * (2 * mb["matmul_params"] + attn_ops) / peak_ops
        out[n] = max(mem, ops)
    return {"kv_bytes_per_row": kv_row, "ops_per_row": 2 * mb["matmul_params"] + attn_ops,
            "seconds": out, "over_one": {n: s / out[1] for n, s in out.items()}}


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        m, c, r, w, s = argv[1:6]
        print(json.dumps(child(m, int(c), int(r), [int(x) for x in w.split(",")], int(s))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--context", type=int, default=400)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--modes", default="off,force")
    ap.add_argument("--roofline", action="store_true")
    ap.add_argument("--clock-ghz", type=float, default=2.6, help="assumed core clock for the peak")
    ap.add_argument("--int8-ops-per-cycle", type=int, default=256,
                    help="assumed: 2 AVX-512 VNNI vpdpbusd per cycle x 64 int8 MACs x 2 ops")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    modes = a.modes.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for p in range(a.passes):
        for m in (modes if p % 2 == 0 else modes[::-1]):
            runs[m].append(run_mode(a.model, m, a.context, a.reps, seed=p))
            print(f"pass {p + 1}/{a.passes} {m}: one row {runs[m][-1]['thread_s'][1] * 1e3:.1f} ms CPU", flush=True)
    res: dict = {"model": a.model, "context": a.context, "passes": a.passes, "reps": a.reps,
                 "cpu": platform.processor() or platform.machine(), "runs": runs, "modes": {}}
    for m in modes:
        one = statistics.median(r["thread_s"][1] for r in runs[m])
        res["modes"][m] = {"kernels": runs[m][0]["kernels"], "variant": runs[m][0]["variant"],
                           "one_row_ms": one * 1e3,
                           "over_one": {w: statistics.median(r["thread_s"][w] / r["thread_s"][1] for r in runs[m])
                                        for w in WIDTHS},
                           "ms": {w: statistics.median(r["thread_s"][w] for r in runs[m]) * 1e3 for w in WIDTHS},
                           "process_over_thread": statistics.median(r["process_s"][w] / r["thread_s"][w]
                                                                    for r in runs[m] for w in WIDTHS)}
    if len(modes) >= 2:  # paired by pass: the second mode's CPU time over the first's, geometric mean
        m0, m1 = modes[0], modes[1]
        res["paired"] = {w: math.exp(statistics.mean(math.log(r1["thread_s"][w] / r0["thread_s"][w])
                                                     for r0, r1 in zip(runs[m0], runs[m1]))) for w in WIDTHS}
    if a.roofline:
        mb = model_bytes(a.model)
        bw = stream_bandwidth()
        peak = a.clock_ghz * 1e9 * a.int8_ops_per_cycle
        res["roofline"] = {"model": mb, "bandwidth_Bps": bw, "peak_int8_ops": peak,
                           "clock_ghz": a.clock_ghz, "int8_ops_per_cycle": a.int8_ops_per_cycle,
                           **roofline(mb, a.context, bw, peak)}
    text = json.dumps(res, indent=1)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
