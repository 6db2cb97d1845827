"""What a verify between one-row steps costs on a GPU, with llama.cpp's CUDA graphs as stock keeps
them and with a graph per width (ADASPARK_CUDA_GRAPHS=1, native/cuda_exact.patch's last hunk).

Stock llama.cpp keeps one CUDA graph per context, keyed by the graph's first node, which every
forward of a context shares: a verify of n rows between one-row steps changes that graph's
properties, so the verify and the step after it launch node by node from the host, and the step
after that captures the graph again. A small model on a fast GPU is bound by those launches, so
the cost a speculative round pays is not the one a probe of n rows repeated (``probe.py``) shows.

Per model and mode (one process each: the library reads its switches once), the backend the engine
uses decodes, at a fixed context, cycles of the engine's pattern: a verify of W rows, rolled back,
then three one-row steps, rolled back too, so every cycle computes the same thing. It reports each
forward's median ms (synchronized), the same W repeated (the probe's view), the one-row step
repeated, and whether every cycle's logits were the same bits (a graph replayed with a stale
argument would not be), also across modes. Modes: ``stock`` (ADASPARK_CUDA_GRAPHS=0), ``width``
(=1), ``none`` (GGML_CUDA_DISABLE_GRAPHS=1: every forward launched node by node).

    python -m benchmarks.gpu.graph_check --model M.gguf [--model M2.gguf] [--widths 2,4,8,16,32,64]
        [--cycles 20] [--context 512] [--modes stock,width,none] [--out F.md] [--out-json F.json]
    python -m benchmarks.gpu.graph_check --verdict F.json   # 0: a graph per width may be used; 1: why not

On a CPU-only build every mode runs the same forwards (no graphs): the report says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import emit_report
from benchmarks.gpu.checks import missing_model, parse_widths, report_head, verdict

MODULE = "benchmarks.gpu.graph_check"
#: The environment of each mode's process.
MODES = {"stock": {"ADASPARK_CUDA_GRAPHS": "0"}, "width": {"ADASPARK_CUDA_GRAPHS": "1"},
         "none": {"ADASPARK_CUDA_GRAPHS": "0", "GGML_CUDA_DISABLE_GRAPHS": "1"}}
#: A cycle's forwards: the verify, then the one-row steps after it.
STEPS = ("verify", "after 1", "after 2", "after 3")


def _digest(rows: np.ndarray) -> str:
    """The logits' bits, hashed in place (a 64-row verify of a 152k vocabulary is 39 MB)."""
    return hashlib.sha256(memoryview(np.ascontiguousarray(rows)).cast("B")).hexdigest()[:16]


def measure(model: str, widths: list[int], cycles: int, context: int, gpu_layers: str) -> dict:
    """This process's forwards (its mode is its environment's): per width the median ms of each
    step of a cycle, of the width repeated and of the one-row step repeated, and the logits'
    digests (one per step when every cycle agreed, else None)."""
    from adaspark_app.engine.backend import LlamaBackend
    from adaspark_app.native.cuda_exact import library_graphs, library_rows

    b = LlamaBackend(model, n_ctx=context + 2 * max(widths) + 64, gpu_layers=gpu_layers)
    L, ctx = b.llama, b.ctx
    rng = np.random.default_rng(7)
    vocab = b.n_vocab
    prompt = rng.integers(100, min(vocab, 20000), size=context).tolist()
    b.prefill(prompt, 0, argmax=False)
    p0 = context
    toks = rng.integers(100, min(vocab, 20000), size=max(widths) + 3).tolist()

    def forward(tokens: list[int], pos: int) -> tuple[float, str]:
        n = len(tokens)
        b._fill_batch(tokens, range(pos, pos + n), [(0,)] * n, [True] * n)
        t = time.perf_counter()
        b._decode()
        L.llama_synchronize(ctx)
        dt = time.perf_counter() - t
        return dt, _digest(b.logits_view(n))

    def one_rows(k: int) -> list[tuple[float, str]]:
        out = [forward(toks[i:i + 1], p0 + i) for i in range(k)]
        b.seq_rm(0, p0)
        return out

    def verify(w: int) -> tuple[float, str]:
        out = forward(toks[:w], p0)
        b.seq_rm(0, p0)
        return out

    for _ in range(4):  # warm: the one-row graph (stock keeps it) and the kernels' first launches
        one_rows(3)
    steady_one = [one_rows(1)[0][0] for _ in range(cycles)]
    rows: dict[str, dict] = {}
    for w in widths:
        times = {s: [] for s in STEPS}
        digests = {s: set() for s in STEPS}
        for _ in range(cycles):
            for step, (dt, dg) in zip(STEPS, [verify(w)] + one_rows(3)):
                times[step].append(dt)
                digests[step].add(dg)
        repeated = []
        for _ in range(cycles):
            dt, dg = verify(w)
            repeated.append(dt)
            digests["verify"].add(dg)
        rows[str(w)] = {"ms": {s: float(np.median(v)) * 1e3 for s, v in times.items()},
                        "repeated_ms": float(np.median(repeated)) * 1e3,
                        "digests": {s: (next(iter(d)) if len(d) == 1 else None) for s, d in digests.items()}}
    info = {"offload": b.offload.describe(), "on_gpu": b.offload.on_gpu, "exact_rows": library_rows(),
            "graphs_by_width": library_graphs(), "one_row_ms": float(np.median(steady_one)) * 1e3,
            "widths": rows}
    b.close()
    return info


def _child(argv: list[str], env: dict[str, str], timeout: float) -> dict:
    out = subprocess.run([sys.executable, "-m", MODULE, *argv], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=timeout)
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"rc {out.returncode}: {tail}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _every_cycle(row: dict) -> bool:
    """Whether every cycle of a width computed the same bits at each of its steps."""
    return all(d is not None for d in row["digests"].values())


def _modes_agree(ok: dict[str, dict], w: str) -> bool:
    """Whether the modes that ran computed the same bits for width ``w``."""
    return len({json.dumps(r["widths"][w]["digests"], sort_keys=True) for r in ok.values()}) == 1


def unsound(results: dict) -> str | None:
    """Why a graph per width is not to be used after these results ({model: {mode: ...}}): no run of
    it finished, it failed on a model, a cycle's logits differed, or the modes' did; None if none."""
    if not any("width" in modes for modes in results.values()):
        return "no graph-per-width run finished"
    for model, modes in results.items():
        if "error" in modes.get("width", {}):
            return f"{Path(model).name}: {modes['width']['error']}"
        ok = {m: r for m, r in modes.items() if "error" not in r}
        for w in next(iter(ok.values()), {}).get("widths", {}):
            if not all(_every_cycle(r["widths"][w]) for r in ok.values()):
                return f"{Path(model).name}: a cycle's logits differed at {w} rows"
            if not _modes_agree(ok, w):
                return f"{Path(model).name}: the modes' logits differ at {w} rows"
    return None


def report(results: dict, argv: list[str] | None = None) -> list[str]:
    """The markdown of ``results`` ({model: {mode: measure() or {"error"}}})."""
    lines = report_head("A verify between one-row steps, by CUDA graph mode", MODULE, argv,
                        "Each cycle: a verify of W rows, then three one-row steps, rolled back (the same "
                        "forwards every cycle); median ms, synchronized. `repeated`: W rows again and again "
                        "(what a probe of one width sees); `extra after`: what the three steps after the verify "
                        "cost over three steady one-row steps. Modes: `stock` one graph per context, `width` a "
                        "graph per width (ADASPARK_CUDA_GRAPHS=1), `none` no graphs.")
    for model, modes in results.items():
        lines += [f"## {Path(model).name}", ""]
        ok = {m: r for m, r in modes.items() if "error" not in r}
        for m, r in modes.items():
            if "error" in r:
                lines.append(f"- `{m}`: failed ({r['error']})")
        if not ok:
            lines.append("")
            continue
        first = next(iter(ok.values()))
        lines.append(f"- placement: {first['offload']}; CUDA kernels batch-invariant to "
                     f"{first['exact_rows']} rows" if first["on_gpu"] else f"- placement: {first['offload']} "
                     "(no GPU: every mode runs the same forwards)")
        for m, r in ok.items():
            lines.append(f"- `{m}`: one-row step {r['one_row_ms']:.3f} ms; the library's graph per width: "
                         f"{r['graphs_by_width']}")
        lines += ["", "| W | mode | verify ms | over one row | repeated / one row | extra after (one rows) |"
                  " same bits every cycle |", "|---|---|---|---|---|---|---|"]
        widths = list(first["widths"])
        for w in widths:
            for m, r in ok.items():
                row = r["widths"][w]
                one = r["one_row_ms"]
                extra = sum(row["ms"][s] for s in STEPS[1:]) / one - 3
                lines.append(f"| {w} | `{m}` | {row['ms']['verify']:.3f} | {row['ms']['verify'] / one:.2f} | "
                             f"{row['repeated_ms'] / one:.2f} | {extra:+.2f} | {'yes' if _every_cycle(row) else 'NO'} |")
        agree = [_modes_agree(ok, w) for w in widths]
        lines += ["", f"Logits the same bits in every mode: {'yes' if all(agree) else 'NO'} "
                      f"({sum(agree)} of {len(agree)} widths).", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="a GGUF (repeatable)")
    ap.add_argument("--widths", default="2,4,8,16,32,64")
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--modes", default="stock,width,none")
    ap.add_argument("--gpu-layers", default="all")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per model and mode")
    ap.add_argument("--out")
    ap.add_argument("--out-json")
    ap.add_argument("--verdict", metavar="JSON", help="only judge an --out-json file: exit 0 if a graph per "
                    "width may be used after it, else 1 with the reason (run.sh falls back to stock graphs then)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.verdict:
        return verdict("graph_check", a.verdict, "a graph check's results", unsound)
    if not a.model:
        ap.error("--model: at least one GGUF")
    widths = parse_widths(ap, a.widths)
    if a.cycles < 1 or a.context < 1:
        ap.error("--cycles and --context: at least 1")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        ap.error(f"--modes: some of {', '.join(MODES)}, not {a.modes!r}")
    if missing_model("graph_check", a.model):
        return 2
    if a.child:
        print(json.dumps(measure(a.model[0], widths, a.cycles, a.context, a.gpu_layers)))
        return 0
    results: dict[str, dict] = {}
    for model in a.model:
        results[model] = {}
        for mode in modes:
            child = ["--child", "--model", model, "--widths", ",".join(map(str, widths)), "--cycles",
                     str(a.cycles), "--context", str(a.context), "--gpu-layers", a.gpu_layers]
            try:
                results[model][mode] = _child(child, MODES[mode], a.timeout)
            except subprocess.TimeoutExpired:
                results[model][mode] = {"error": f"over {a.timeout:.0f} s"}
            print(f"{Path(model).name} {mode}: {results[model][mode].get('error', 'done')}", file=sys.stderr)
            if a.out_json:
                Path(a.out_json).write_text(json.dumps(results, indent=1))
    emit_report(report(results, argv), a.out)
    failed = any("error" in r for modes_ in results.values() for r in modes_.values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
