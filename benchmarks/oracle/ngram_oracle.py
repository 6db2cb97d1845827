"""Headroom of n-gram speculation on this machine: what an oracle would reach.

From the `ar` replies of a script, an oracle that knew in advance how far each n-gram copy runs
(the chain the engine's index proposes from the anchor, compared with the reply's true text) and
chose each round's width from verify costs measured in this process, decodes at

    tokens / sum over rounds of T(width) ,   T measured here at the reply's context.

It is compared with plain decode (T(1) per token) and with AdaSpark's and chain:4's measured
speed on the same replies (interleaved in one process). Usage:

    python -m benchmarks.oracle.ngram_oracle SCRIPT.jsonl [--max-tokens 128] [--limit N] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

from adaspark_app import native
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.engine.ngram import NgramIndex
from adaspark_app.runner import load_script

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def verify_costs(engine: ChatEngine, context_tokens: list[int], reps: int = 3) -> dict[int, float]:
    """Median seconds of a chain verify of each width at this context (KV restored after each)."""
    b = engine.backend
    b.clear_kv()
    b.prefill(context_tokens[:-1], 0)
    n = len(context_tokens) - 1
    costs = {}
    for w in WIDTHS:
        ts = []
        for _ in range(reps):
            toks = [context_tokens[-1]] * w
            out = b.verify(toks, list(range(n, n + w)), [(0,)] * w)
            ts.append(out.seconds)
            b.seq_rm(0, n, -1)
        costs[w] = statistics.median(ts)
    b.clear_kv()
    engine.decoder.kv_tokens, engine.decoder.anchor = [], None
    return costs


def copy_run(chain: list, reply: list[int], pos: int) -> int:
    """How many leading steps of an n-gram chain proposed at reply[pos] are the reply's tokens."""
    run = 0
    for st in chain:
        if pos + run < len(reply) and st.token == reply[pos + run]:
            run += 1
        else:
            break
    return run


def oracle_speedup(prompt: list[int], reply: list[int], costs: dict[int, float]) -> float:
    """Oracle decode speed over plain decode for one reply."""
    idx = NgramIndex(prompt)
    pos = 0
    t = 0.0
    while pos < len(reply):
        run = copy_run(idx.chain([], max(WIDTHS) - 1), reply, pos)
        best = max(WIDTHS, key=lambda w: (min(run, w - 1) + 1) / costs[w])
        step = min(run, best - 1) + 1
        step = min(step, len(reply) - pos)
        t += costs[best]
        idx.extend(reply[pos:pos + step])
        pos += step
    return (len(reply) / t) / (1.0 / costs[1])


def main() -> None:
    native.activate()  # the Q4_1 kernels, if built, before anything imports llama_cpp
    ap = argparse.ArgumentParser()
    ap.add_argument("script")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    convs = load_script(a.script)
    if a.limit:
        convs = convs[: a.limit]
    arms = ["ar", "adaspark", "chain:4"]
    engines = {arm: ChatEngine(None, arm=arm, n_ctx=4096, n_threads=2) for arm in arms}
    rows = []
    t0 = time.time()
    for i, conv in enumerate(convs):
        order = arms if i % 2 == 0 else arms[::-1]
        msgs = [{"role": "user", "content": conv.turns[0]}]
        res = {}
        for arm in order:
            eng = engines[arm]
            res[arm] = eng.generate(conv.id, msgs, max_tokens=a.max_tokens)
            eng.reset_conversation()
        ar = res["ar"]
        prompt = engines["ar"].prompt_tokens(msgs)
        costs = verify_costs(engines["ar"], prompt + ar.tokens[: len(ar.tokens) // 2])
        rows.append({"id": conv.id, "oracle": oracle_speedup(prompt, ar.tokens, costs),
                     "adaspark": res["adaspark"].tokens_per_s / ar.tokens_per_s,
                     "chain:4": res["chain:4"].tokens_per_s / ar.tokens_per_s,
                     "identical": res["adaspark"].tokens == ar.tokens,
                     "cost_ratio": {w: costs[w] / costs[1] for w in WIDTHS}})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "cost_ratio"}), flush=True)
    gm = {k: math.exp(sum(math.log(r[k]) for r in rows) / len(rows)) for k in ("oracle", "adaspark", "chain:4")}
    cr = {w: statistics.median(r["cost_ratio"][w] for r in rows) for w in WIDTHS}
    lines = [
        f"# N-gram headroom on `{a.script}` ({len(rows)} first turns, {a.max_tokens} tokens)", "",
        f"Command: `python -m benchmarks.oracle.ngram_oracle {a.script} --max-tokens {a.max_tokens}"
        + (f" --limit {a.limit}" if a.limit else "") + "`", "",
        "| over plain decode (geometric mean of per-reply ratios) | ratio |", "|---|---|",
        f"| oracle (knows each copy's length, widths by measured cost) | {gm['oracle']:.3f} |",
        f"| adaspark (measured, interleaved) | {gm['adaspark']:.3f} |",
        f"| chain:4 (measured, interleaved) | {gm['chain:4']:.3f} |",
        f"| adaspark's share of the oracle's gain | "
        f"{(gm['adaspark'] - 1) / (gm['oracle'] - 1) if gm['oracle'] > 1 else float('nan'):.2f} |", "",
        f"adaspark replies identical to ar: {sum(r['identical'] for r in rows)}/{len(rows)}", "",
        "Median verify time over one-row time, measured in the run: "
        + ", ".join(f"{w}: {cr[w]:.2f}" for w in WIDTHS), "",
        f"Wall time {time.time() - t0:.0f} s.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
