"""AdaSpark's engine where llama.cpp can offload: placement, identity with `ar`, verify cost per
width and host time per round, in one run (the engine part of `benchmarks/gpu/run.sh`).

For each arm (`ar` first), the first turn of each conversation of SCRIPT is decoded with every
layer on the GPU (or the CPU on a CPU-only build, which says so). It reports:

- where the model ran (``LlamaBackend.offload``, the KV cache types), the device line and the
  kernels (on a GPU: stock, or batch-invariant under ADASPARK_CUDA_EXACT=1; a CUDA graph per width
  under ADASPARK_CUDA_GRAPHS=1);
- the share of each arm's replies byte-identical to `ar`'s (tokens), per arm;
- the verify's median ms per width, from the rounds' own timings, over the one-row median;
- for `adaspark`, host time per tree round by step (``round_host_time --parts``) and the pricing
  replayed with warm and flushed caches (``--cache``). On a GPU the decoder learns a round's
  acceptance labels during the next forward (``LlamaBackend.forward_overlaps``); the arm
  ``adaspark@serial`` runs it with that off, learning after the forward as on the CPU, so the
  two host-time tables show what the overlap saves.

    python -m benchmarks.gpu.engine_check --model M.gguf [--script S.jsonl] [--limit 8]
        [--max-tokens 64] [--arms ar,pinned:4,pinned:16,adaspark,adaspark@serial] [--gpu-layers all]
        [--out-json F] [--out F.md]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import numpy as np

from adaspark_app import native
from adaspark_app.native import pricing
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.runner import load_script
from benchmarks.common import cpu_model
from benchmarks.cost.round_host_time import KINDS, _cache_table, _capture_pricing, _instrument, _instrument_parts, \
    _parts_table

DEFAULT_SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "data" / "mtbench_sample.jsonl"


def run_arm(model: str, arm: str, prompts: list[tuple[str, str]], max_tokens: int, gpu_layers: str | int,
            n_ctx: int) -> dict:
    """One arm over the prompts: replies' tokens, verify seconds per width, and (adaspark) host time.
    ``ARM@serial``: the arm with the forward not overlapping the host's work."""
    name, serial = arm.removesuffix("@serial"), arm.endswith("@serial")
    eng = ChatEngine(model, arm=name, n_ctx=n_ctx, gpu_layers=gpu_layers)
    if serial:
        eng.backend.forward_overlaps = False
    rec = {k: [] for k in KINDS}
    parts: list[dict[str, float]] = []
    priced: list[tuple] = []
    between: list[float] = []  # from a round's end to the next one's start: the reply loop and its event
    if name == "adaspark":
        _instrument_parts(eng, parts)
        _instrument(eng, rec, between)
        _capture_pricing(eng, priced)
    verify: dict[int, list[float]] = {}

    def on_round(ev) -> None:
        if not ev.prefill:
            verify.setdefault(ev.width, []).append(ev.verify_ms)

    tokens = []
    try:
        b = eng.backend
        placement = {"offload": b.offload.describe(), "kv_types": list(b.kv_types), "device": eng.device_label,
                     "kernels": f"CUDA: {eng.cuda_kernels}" if b.offload.on_gpu else f"CPU: {native.status()}",
                     "pricing": pricing.status()}
        for cid, text in prompts:
            r = eng.generate(cid, [{"role": "user", "content": text}], max_tokens=max_tokens, on_round=on_round)
            tokens.append(list(r.tokens))
            eng.reset_conversation()
    finally:
        eng.close()
    out = {"arm": arm, "placement": placement, "tokens": tokens, "forward_overlaps": b.forward_overlaps,
           "verify_ms": {str(w): float(np.median(v)) for w, v in sorted(verify.items())},
           "verify_rounds": {str(w): len(v) for w, v in sorted(verify.items())}}
    if name == "adaspark":
        host = [h for k in KINDS for h, _ in rec[k]]
        out["host_us"] = {"rounds": len(host), "round_mean": float(np.mean(host)) * 1e6 if host else None,
                          "between_median": float(np.median(between)) * 1e6 if between else None,
                          "between_mean": float(np.mean(between)) * 1e6 if between else None}
        out["host_parts"] = _parts_table(arm, parts) if parts else []
        out["host_cache"] = _cache_table(priced) if priced else []
    return out


def identical_share(base: list[list[int]], other: list[list[int]]) -> tuple[int, int]:
    """(replies byte-identical to the base's, replies compared)."""
    return sum(a == b for a, b in zip(base, other)), min(len(base), len(other))


def report(results: list[dict], cmd: str) -> list[str]:
    base = results[0]["tokens"]
    one = results[0]["verify_ms"].get("1")
    lines = [f"# AdaSpark's engine on {results[0]['placement']['device']}", "", f"`{cmd}`", "",
             f"Machine: {cpu_model()} ({platform.machine()}), Python {platform.python_version()}; "
             f"{results[0]['placement']['offload']}, KV cache types {results[0]['placement']['kv_types']}, "
             f"kernels {results[0]['placement'].get('kernels', '?')}, the round's pricing "
             f"{results[0]['placement'].get('pricing', '?')}.", "",
             "| arm | replies identical to ar | verify ms per width (rounds) | T(n)/T(1) |", "|---|---|---|---|"]
    for r in results:
        same, n = identical_share(base, r["tokens"])
        widths = ", ".join(f"{w}: {ms:.2f} ({r['verify_rounds'][w]})" for w, ms in r["verify_ms"].items())
        ratios = ", ".join(f"{w}: {ms / one:.2f}" for w, ms in r["verify_ms"].items()) if one else ""
        lines.append(f"| {r['arm']} | {same}/{n} | {widths} | {ratios} |")
    hosts = [r for r in results if r.get("host_us")]
    if hosts:
        lines += ["", "Host time per round (outside the forward) and between rounds (the reply loop and the round's "
                  "event), us:", "", "| arm | forward overlaps | rounds | round, mean | between, median | between, mean |",
                  "|---|---|---|---|---|---|"]
        def cell(v: float | None) -> str:
            return "-" if v is None else f"{v:.0f}"

        for r in hosts:
            h = r["host_us"]
            lines.append(f"| {r['arm']} | {r.get('forward_overlaps')} | {h['rounds']} | {cell(h['round_mean'])} | "
                         f"{cell(h['between_median'])} | {cell(h['between_mean'])} |")
    for r in results:
        if r.get("host_parts"):
            lines += ["", *r["host_parts"]]
        if r.get("host_cache"):
            lines += ["", *r["host_cache"]]
    return lines


def main(argv: list[str] | None = None) -> None:
    native.activate()  # the CPU kernels where they were built; a CUDA build has none and runs stock
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--script", default=str(DEFAULT_SCRIPT))
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--arms", default="ar,pinned:4,pinned:16,adaspark,adaspark@serial")
    ap.add_argument("--gpu-layers", default="all")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--out-json", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    arms = a.arms.split(",")
    if arms[0] != "ar":
        arms = ["ar"] + [x for x in arms if x != "ar"]
    prompts = [(c.id, c.turns[0]) for c in load_script(a.script)[: a.limit]]
    cmd = (f"python -m benchmarks.gpu.engine_check --model {Path(a.model).name} --limit {a.limit} "
           f"--max-tokens {a.max_tokens} --arms {a.arms} --gpu-layers {a.gpu_layers}")
    results = []
    for arm in arms:
        results.append(run_arm(a.model, arm, prompts, a.max_tokens, a.gpu_layers, a.n_ctx))
        same, n = identical_share(results[0]["tokens"], results[-1]["tokens"])
        print(f"{arm}: {same}/{n} identical to ar; verify ms {results[-1]['verify_ms']}", flush=True)
        # after every arm, so a run stopped at its time limit keeps the arms it finished
        if a.out_json:
            a.out_json.write_text(json.dumps(results))
        if a.out:
            Path(a.out).write_text("\n".join(report(results, cmd)) + "\n", encoding="utf-8")
    print("\n".join(report(results, cmd)))  # the file holds it already (written above)


if __name__ == "__main__":
    main()
