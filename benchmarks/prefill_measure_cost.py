"""What measuring the ladder in a fresh store's first prefill costs (Decoder._prefill).

    python benchmarks/prefill_measure_cost.py SET.jsonl [--model GGUF] [--prompts 3] [--reps 6] [--out FILE.md]

For each of the set's first prompts (its first turn, rendered with the model's chat template):
the prefill of a fresh `adaspark` decoder (which decodes the prompt's last tokens as timed
verifies of 2, 4, 8 ... rows) against the prefill of an `ar` decoder (one piece), in one
process, ABBA order, the cache cleared before each. Reports per prompt the median of the paired
ratios with a 95% bootstrap interval, the extra time in one-row steps (its median one-row step
from `ar` steps after the prefill), and the widths measured. Nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

from adaspark_app.engine.arms import Arm
from adaspark_app.engine.backend import LlamaBackend
from adaspark_app.engine.decoder import Decoder
from adaspark_app.engine.template import chat_template_for
from adaspark_app.models.discovery import bundled_entries


def prefill_s(b: LlamaBackend, arm: str, prompt: list[int]) -> tuple[float, list[int]]:
    b.seq_rm(0, 0, -1)
    dec = Decoder(b, Arm(arm))
    t0 = time.perf_counter()
    dec.start_reply(prompt)
    return time.perf_counter() - t0, list(dec.prefill_measured)


def one_row_s(b: LlamaBackend, prompt: list[int], n: int = 15) -> float:
    dec = Decoder(b, Arm("ar"))
    b.seq_rm(0, 0, -1)
    dec.start_reply(prompt)
    ts = [dec.round().verify_s for _ in range(n)]
    return statistics.median(ts)


def boot(x: np.ndarray, n: int = 4000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(x, size=(n, len(x)), replace=True), axis=1)
    return float(np.quantile(meds, 0.025)), float(np.quantile(meds, 0.975))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("set")
    ap.add_argument("--model")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    model = a.model or str(bundled_entries()[0].path)
    b = LlamaBackend(model, n_threads=a.threads)
    tpl = chat_template_for(b)
    convs = [json.loads(x) for x in open(a.set)][: a.prompts]
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.split(":")[-1].strip()
    lines = [f"# Measuring the ladder in the first prefill: its cost ({cpu or platform.processor()}, {a.threads} threads)", "",
             f"- command: `python benchmarks/prefill_measure_cost.py {' '.join(sys.argv[1:])}`",
             f"- model: `{model}`; ABBA pairs per prompt: {a.reps}", "",
             "| prompt | tokens | widths measured | `adaspark` prefill / `ar` prefill [95%] | extra, one-row steps |",
             "|---|---|---|---|---|"]
    for c in convs:
        prompt = b.tokenize(tpl.render([{"role": "user", "content": c["turns"][0]}], add_generation_prompt=True),
                            add_special=False, parse_special=True)
        prefill_s(b, "ar", prompt)  # warm-up
        ratios, extra, widths = [], [], []
        for i in range(a.reps):
            order = ("adaspark", "ar") if i % 2 == 0 else ("ar", "adaspark")
            got = {}
            for arm in order:
                got[arm] = prefill_s(b, arm, prompt)
            widths = got["adaspark"][1]
            ratios.append(got["adaspark"][0] / got["ar"][0])
            extra.append(got["adaspark"][0] - got["ar"][0])
        t1 = one_row_s(b, prompt)
        r = np.array(ratios)
        lo, hi = boot(r)
        lines.append(f"| {c['id']} | {len(prompt)} | {widths} | {np.median(r):.3f} [{lo:.3f}, {hi:.3f}] | "
                     f"{statistics.median(extra) / t1:.1f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        open(a.out, "w").write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
