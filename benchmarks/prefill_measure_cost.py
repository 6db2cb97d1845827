"""What measuring the ladder in a fresh store's first prefill costs, and what it saves, on the
first reply (Decoder._prefill).

    python benchmarks/prefill_measure_cost.py SET.jsonl [--model GGUF] [--prompts 3] [--reps 4]
        [--max-tokens 128] [--out FILE.md]

For each of the set's first prompts (its first turn, rendered with the model's chat template),
the first reply of a fresh store three ways, in one process, the order rotated each repetition
and the cache cleared before each: `adaspark` measuring in the prefill (now), `adaspark` with
`measure_in_prefill` off (the ladder measured in decode rounds, as before), and `ar`. Each
trial times the prefill and the reply's decode (greedy, up to --max-tokens). Reports per prompt
medians of paired ratios with 95% bootstrap intervals: the prefill, the decode and their sum,
now over before, and each over `ar`'s sum. Nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from adaspark_app.engine.arms import Arm
from adaspark_app.engine.backend import LlamaBackend
from adaspark_app.engine.decoder import Decoder, run_reply
from adaspark_app.engine.template import chat_template_for
from adaspark_app.models.discovery import bundled_entries

ARMS = ("prefill", "decode", "ar")  # adaspark measuring in the prefill, in decode rounds; ar


def first_reply(b: LlamaBackend, arm: str, prompt: list[int], max_tokens: int) -> tuple[float, float, list[int], int]:
    """(prefill seconds, decode seconds, widths the prefill measured, reply tokens) of a fresh
    decoder's reply."""
    b.seq_rm(0, 0, -1)
    dec = Decoder(b, Arm("ar" if arm == "ar" else "adaspark"))
    dec.measure_in_prefill = arm == "prefill"
    t0 = time.perf_counter()
    first, _, _ = dec.start_reply(prompt)
    t_prefill = time.perf_counter() - t0
    reply, stats = run_reply(dec, max_tokens, b.is_eog, first_token=first)
    return t_prefill, stats["decode_s"], list(dec.prefill_measured), len(reply)


def interval(x: list[float], n: int = 4000, seed: int = 0) -> str:
    a = np.asarray(x)
    meds = np.median(np.random.default_rng(seed).choice(a, size=(n, len(a)), replace=True), axis=1)
    return f"{np.median(a):.3f} [{np.quantile(meds, 0.025):.3f}, {np.quantile(meds, 0.975):.3f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("set")
    ap.add_argument("--model")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    model = a.model or str(bundled_entries()[0].path)
    b = LlamaBackend(model, n_threads=a.threads)
    tpl = chat_template_for(b)
    convs = [json.loads(x) for x in open(a.set)][: a.prompts]
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout
    lines = [f"# The first reply on a fresh store: the ladder measured in the prefill (now) or in decode (before)", "",
             f"- command: `python benchmarks/prefill_measure_cost.py {' '.join(sys.argv[1:])}`",
             f"- model: `{model}`; CPU: {cpu.split(':')[-1].strip()}, {a.threads} threads; {a.reps} repetitions per "
             f"prompt, arms rotated; greedy, up to {a.max_tokens} tokens", "",
             "Medians of paired ratios, 95% bootstrap intervals over repetitions.", "",
             "| prompt | tokens | reply tokens | widths the prefill measured | prefill now/before | decode now/before | "
             "prefill+decode now/before | now / `ar` | before / `ar` |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k, c in enumerate(convs):
        prompt = b.tokenize(tpl.render([{"role": "user", "content": c["turns"][0]}], add_generation_prompt=True),
                            add_special=False, parse_special=True)
        if k == 0:
            first_reply(b, "ar", prompt, 8)  # warm-up (and the process's one-row trial)
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in ARMS}
        widths: list[int] = []
        n_reply = 0
        for i in range(a.reps):
            for arm in ARMS[i % 3:] + ARMS[:i % 3]:
                p, d, w, n_reply = first_reply(b, arm, prompt, a.max_tokens)
                got[arm].append((p, d))
                widths = w or widths
        ratio = lambda f, x, y: [f(u) / f(v) for u, v in zip(got[x], got[y])]  # noqa: E731
        pre, dec_, tot = (lambda t: t[0]), (lambda t: t[1]), (lambda t: t[0] + t[1])
        lines.append(f"| {c['id']} | {len(prompt)} | {n_reply} | {widths} | {interval(ratio(pre, 'prefill', 'decode'))} | "
                     f"{interval(ratio(dec_, 'prefill', 'decode'))} | {interval(ratio(tot, 'prefill', 'decode'))} | "
                     f"{interval(ratio(tot, 'prefill', 'ar'))} | {interval(ratio(tot, 'decode', 'ar'))} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        open(a.out, "w").write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
