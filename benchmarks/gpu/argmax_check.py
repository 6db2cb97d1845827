"""Where a greedy verify's tokens are taken, and what each way costs: every row's logits copied to
the host and scanned by numpy (``host``), or an argmax per row inside the forward's graph, so only a
token per row leaves the device (``device``: llama.cpp's backend sampling, the engine's default on a
GPU; engine/backend.py, ARGMAX_ENV). Where the CUDA library carries AdaSpark's patch, the device way
runs twice: stock, a kernel of one block per row one after the other, and ``one launch``, the rows'
argmaxes as one kernel of a block per row (ADASPARK_CUDA_ARGMAX, set between blocks in this process;
native/cuda_exact.py).

For a 152k vocabulary the host way moves 0.6 MB per row (39 MB for a 64-row verify) and scans it on
the CPU; on a GPU whose 7B step takes a few ms that is a large part of a wide verify. Per model, the
backend the engine uses verifies W rows at a fixed context, rolled back, in blocks that alternate the
two ways (a switch makes llama.cpp reserve its graphs again: each block's first forward of each
width is a warm-up). It reports the median ms of a verify with its tokens read, per way and width,
and whether every way gave the host's token on every row.

    python -m benchmarks.gpu.argmax_check --model M.gguf [--model M2.gguf] [--widths 1,2,4,8,16,32,64]
        [--blocks 4] [--cycles 8] [--context 512] [--out F.md] [--out-json F.json]
    python -m benchmarks.gpu.argmax_check --verdict F.json   # 0: tokens may be taken on the device
    python -m benchmarks.gpu.argmax_check --verdict-one-launch F.json   # 0: in one launch

On the CPU both ways run too (the host way is the default there: ggml's CPU argmax scans a row on
one thread).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from benchmarks.common import emit_report
from benchmarks.gpu.checks import missing_model, parse_widths, report_head, verdict

MODULE = "benchmarks.gpu.argmax_check"
PLACES = ("host", "device", "one_launch")
#: A run of argmaxes in one launch is kept where, summed over the widths of 2 rows and more, it takes at
#: most this much of the stock device way's time (it launches fewer kernels; this bounds the noise).
ONE_LAUNCH_SLACK = 1.02


def scan_ms(n_vocab: int, widths: list[int], reps: int = 7) -> dict[int, float]:
    """numpy's argmax over W rows of a vocabulary alone, per width: median ms over rows read cold
    (``ColdRows``), as logits a device just copied to the host are."""
    from benchmarks.cost.scripted_target import ColdRows

    rows = ColdRows(n_vocab, max(widths))
    out: dict[int, float] = {}
    for w in widths:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            rows.argmax(w)
            times.append(time.perf_counter() - t)
        out[w] = float(np.median(times)) * 1e3
    return out


def measure(model: str, widths: list[int], blocks: int, cycles: int, context: int, gpu_layers: str) -> dict:
    """Per width, each way's median ms of a verify with its tokens read, and the rows whose token
    the two ways agreed on."""
    from adaspark_app.engine.backend import ARGMAX_ENV, LlamaBackend
    from adaspark_app.native.cuda_exact import library_argmax, set_library_argmax

    before = os.environ.get(ARGMAX_ENV)
    os.environ[ARGMAX_ENV] = "device"  # so the backend's probe at load says whether the device way runs
    try:
        b = LlamaBackend(model, n_ctx=context + max(widths) + 64, gpu_layers=gpu_layers)
    finally:
        if before is None:
            os.environ.pop(ARGMAX_ENV)
        else:
            os.environ[ARGMAX_ENV] = before
    available = b.argmax_on_device
    initially = library_argmax()  # None: no patched CUDA library mapped, no switch to time
    places = ("host", "device") if available else ("host",)
    if available and initially is not None:
        places += ("one_launch",)
    rng = np.random.default_rng(11)
    top = min(b.n_vocab, 20000)
    b.prefill(rng.integers(100, top, size=context).tolist(), 0, argmax=False)
    toks = rng.integers(100, top, size=max(widths)).tolist()
    ms: dict[str, dict[int, list[float]]] = {p: {w: [] for w in widths} for p in PLACES}
    seen: dict[str, dict[int, list[int]]] = {p: {} for p in PLACES}
    steady = {p: True for p in places}  # every forward of a width gave the same tokens

    def verify(w: int) -> tuple[float, list[int]]:
        out = b.verify(toks[:w], list(range(context, context + w)), [(0,)] * w)
        b.seq_rm(0, context, -1)
        return out.seconds, out.argmax.tolist()

    for k in range(blocks):
        for place in places if k % 2 == 0 else places[::-1]:
            b.argmax_on_device = place != "host"
            if initially is not None:
                set_library_argmax(place == "one_launch")
            for w in widths:  # warm-up: the graphs reserved again, CUDA graphs captured
                verify(w)
            for _ in range(cycles):
                for w in widths:
                    dt, got = verify(w)
                    ms[place][w].append(dt)
                    steady[place] &= seen[place].setdefault(w, got) == got
    if initially is not None:
        set_library_argmax(initially)
    scan = scan_ms(b.n_vocab, widths)
    info = {"offload": b.offload.describe(), "on_gpu": b.offload.on_gpu, "n_vocab": b.n_vocab,
            "device_available": available, "one_launch_available": "one_launch" in places,
            "steady": steady, "widths": {}}

    def same(place: str, w: int) -> int | None:
        host, got = seen["host"].get(w), seen[place].get(w)
        return None if got is None else sum(int(x == y) for x, y in zip(host, got))

    for w in widths:
        info["widths"][str(w)] = {
            **{f"{p}_ms": float(np.median(ms[p][w])) * 1e3 if ms[p][w] else None for p in PLACES},
            "same_tokens": same("device", w), "same_tokens_one_launch": same("one_launch", w),
            "scan_ms": scan[w]}
    b.close()
    return info


def _first_reason(results: dict, reason: Callable[[str, dict], str | None]) -> str | None:
    """The first model's reason (a failed model's error, else ``reason(name, measure())``), or None."""
    if not results:
        return "no model measured"
    for model, r in results.items():
        name = Path(model).name
        why = f"{name}: {r['error']}" if "error" in r else reason(name, r)
        if why:
            return why
    return None


def _tokens_reason(name: str, r: dict, place: str, same_key: str, way: str) -> str | None:
    """Why ``place``'s tokens are not the host's: they changed between forwards of a width, or
    differed from the host's on some row (``same_key`` of each width); None if neither."""
    if not r["steady"].get(place, True):
        return f"{name}: the {way} tokens changed between forwards of one width"
    for w, row in r["widths"].items():
        n = row.get(same_key)
        if n is not None and n < int(w):
            return f"{name}: {int(w) - n} of {w} rows got another token than the host's ({way})"
    return None


def unsound(results: dict) -> str | None:
    """Why greedy tokens are not to be taken on the device after these results ({model: measure()
    or {"error"}}): a model failed, the device way gave a width other tokens from one forward to the
    next, or other tokens than the host way on some row; None if none (or if it did not run there:
    the engine then takes them on the host by itself)."""
    return _first_reason(results, lambda name, r: _tokens_reason(name, r, "device", "same_tokens", "device's"))


def one_launch_unsound(results: dict) -> str | None:
    """Why a verify's argmaxes are not to be taken in one launch after these results (as `unsound`,
    for the one-launch way's tokens), or it was slower than a kernel per row (summed over the widths
    of 2 rows and more, beyond ONE_LAUNCH_SLACK); None if neither, or where it did not run (no
    patched library: nothing to switch)."""
    def reason(name: str, r: dict) -> str | None:
        if not r.get("one_launch_available"):
            return None
        why = _tokens_reason(name, r, "one_launch", "same_tokens_one_launch", "one-launch")
        wide = [row for w, row in r["widths"].items() if int(w) >= 2]
        one, stock = sum(row["one_launch_ms"] for row in wide), sum(row["device_ms"] for row in wide)
        if not why and wide and one > ONE_LAUNCH_SLACK * stock:
            why = f"{name}: one launch took {one / stock:.3f}x the stock device way's time"
        return why

    return _first_reason(results, reason)


def report(results: dict, argv: list[str] | None = None) -> list[str]:
    """The markdown of ``results`` ({model: measure() or {"error"}})."""
    lines = report_head("Greedy tokens: logits to the host, or an argmax on the device", MODULE, argv,
                        "A verify of W rows at a fixed context, rolled back, with its tokens read: `host` "
                        "copies every row's logits and takes numpy's argmax, `device` takes an argmax per row "
                        "in the forward (llama.cpp's backend sampling: a kernel per row), `one launch` takes "
                        "them as one kernel of a block per row (AdaSpark's CUDA patch, ADASPARK_CUDA_ARGMAX). "
                        "Median ms over blocks that alternate the ways. `numpy's scan alone`: the host way's "
                        "argmax over W rows read cold (a pool larger than the caches), part of its time.")
    for model, r in results.items():
        lines += [f"## {Path(model).name}", ""]
        if "error" in r:
            lines += [f"Failed: {r['error']}", ""]
            continue
        lines.append(f"- placement: {r['offload']}; vocabulary {r['n_vocab']} tokens")
        if not r["device_available"]:
            lines.append("- the device way did not run here: llama.cpp could not put the sampler on the backend")
        lines.append("- the same tokens at every forward of a width: "
                     + ", ".join(f"{p} {'yes' if ok else 'NO'}" for p, ok in r["steady"].items()))
        if r["device_available"] and not r.get("one_launch_available"):
            lines.append("- one launch: not timed (no CUDA library with AdaSpark's patch mapped)")
        lines += ["", "| W | host ms | device ms | device / host | one launch ms | one launch / device "
                      "| rows with the host's token (device, one launch) | numpy's scan alone, ms |",
                  "|---|---|---|---|---|---|---|---|"]

        def cell(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"

        for w, row in r["widths"].items():
            h, d, o = row["host_ms"], row["device_ms"], row.get("one_launch_ms")
            same = ", ".join("-" if n is None else f"{n} of {w}"
                             for n in (row["same_tokens"], row.get("same_tokens_one_launch")))
            lines.append(f"| {w} | {h:.3f} | {cell(d)} | {cell(d / h if h and d else None)} | {cell(o)} "
                         f"| {cell(o / d if o and d else None)} | {same} | {row['scan_ms']:.3f} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="a GGUF (repeatable)")
    ap.add_argument("--widths", default="1,2,4,8,16,32,64")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--gpu-layers", default="all")
    ap.add_argument("--out")
    ap.add_argument("--out-json")
    ap.add_argument("--verdict", metavar="JSON", help="only judge an --out-json file: exit 0 if greedy tokens "
                    "may be taken on the device after it, else 1 with the reason (run.sh takes them on the host then)")
    ap.add_argument("--verdict-one-launch", metavar="JSON", help="only judge an --out-json file: exit 0 if a "
                    "verify's argmaxes may run as one launch after it, else 1 with the reason (run.sh sets "
                    "ADASPARK_CUDA_ARGMAX=0 then)")
    a = ap.parse_args(argv)
    if a.verdict:
        return verdict("argmax_check", a.verdict, "an argmax check's results", unsound)
    if a.verdict_one_launch:
        return verdict("argmax_check", a.verdict_one_launch, "an argmax check's results", one_launch_unsound)
    if not a.model:
        ap.error("--model: at least one GGUF")
    widths = parse_widths(ap, a.widths)
    if a.blocks < 2 or a.cycles < 1 or a.context < 1:
        ap.error("--blocks: at least 2 (one per way); --cycles and --context: at least 1")
    if missing_model("argmax_check", a.model):
        return 2
    from adaspark_app import native

    native.activate()  # the CPU kernels where they were built; a CUDA build has none and runs stock
    results: dict[str, dict] = {}
    for model in a.model:
        try:
            results[model] = measure(model, widths, a.blocks, a.cycles, a.context, a.gpu_layers)
        except Exception as e:  # one model's failure is reported, the others still run
            results[model] = {"error": f"{type(e).__name__}: {e}"}
        if a.out_json:
            Path(a.out_json).write_text(json.dumps(results, indent=1))
    emit_report(report(results, argv), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
