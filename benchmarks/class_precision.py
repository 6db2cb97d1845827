"""Class precision against one p_src, on real rounds of the bundled model (no drafter).

Two measurements, both on a bench script (JSONL of conversations):

- ``speed``: three engines in one process, `ar`, adaspark pricing n-gram nodes by one p_src
  (before), adaspark pricing them by their proposal class's precision (now), compared by
  ``interleaved.compare``.
- ``logloss``: one adaspark engine per pricing over the first turns; the acceptance model's
  fitted and head-based log loss on requests after the first (each round scored before either
  learns from it), and the share of rounds the guard let the fitted model price.

    python benchmarks/class_precision.py speed SCRIPT.jsonl [--passes 2] [--max-tokens 128]
    python benchmarks/class_precision.py logloss SCRIPT.jsonl [--requests 20] [--max-tokens 128]

"Before" is the same engine with every candidate's ng_prec left unset (nan), which prices every
n-gram node at p_src exactly as the model did before class precision.
"""

from __future__ import annotations

import argparse

import numpy as np
from interleaved import compare  # benchmarks/ is the script's own directory

from adaspark_app import native
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.runner import load_script


def _engine(arm: str, pricing: str = "class") -> ChatEngine:
    eng = ChatEngine(None, arm=arm, n_ctx=4096, n_threads=2)
    if pricing == "one":
        eng.decoder.node_precision = lambda c: np.full(len(c), np.nan)
    return eng


def speed(script: str, passes: int, max_tokens: int) -> None:
    arms = {"ar": _engine("ar"), "before": _engine("adaspark", "one"), "now": _engine("adaspark")}
    print("\n" + compare(arms, script, passes, max_tokens))


def logloss(script: str, requests: int, max_tokens: int) -> None:
    prompts = [c.turns[0] for c in load_script(script)][:requests]
    print(f"\n`{script}`, first turns of {len(prompts)} conversations, {max_tokens} tokens\n")
    print("| pricing | fitted log loss | head-based log loss | rounds priced by the fitted model |")
    print("|---|---|---|---|")
    for pricing in ("one", "class"):
        eng = _engine("adaspark", pricing)
        acc = eng.decoder.acceptance
        by = {"fitted": 0, "head": 0}
        q = acc.q

        def counted(*a, _q=q):
            out = _q(*a)
            by[out[1]] += 1
            return out

        acc.q = counted
        fit = head = nodes = 0.0
        for i, text in enumerate(prompts):
            eng.generate(f"c{i}", [{"role": "user", "content": text}], max_tokens=max_tokens)
            f, h, n = acc.request_log_loss()
            eng.reset_conversation()
            if i and n:
                fit, head, nodes = fit + f * n, head + h * n, nodes + n
        eng.close()
        share = by["fitted"] / max(sum(by.values()), 1)
        print(f"| {'one p_src' if pricing == 'one' else 'class precision'} | {fit / nodes:.3f} | "
              f"{head / nodes:.3f} | {share:.0%} |")


def main() -> None:
    native.activate()  # the Q4_1 kernels, if built, before anything imports llama_cpp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("speed", "logloss"))
    ap.add_argument("script")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    if a.mode == "speed":
        speed(a.script, a.passes, a.max_tokens)
    else:
        logloss(a.script, a.requests, a.max_tokens)


if __name__ == "__main__":
    main()
