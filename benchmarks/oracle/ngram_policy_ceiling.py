"""How far a width policy that sees only the n-gram proposal at the anchor can go on this CPU.

From the `ar` replies of a script (greedy, so they are what every lossless arm emits), replay
decoding with the engine's n-gram index and price each round by verify-cost ratios over a one-row
step (measured in-process by `ngram_oracle.py`; passed in below) plus a drafted round's host
overhead D. Policies compared:

- oracle: knows how far each copy runs and verifies exactly that (the headroom);
- static: a fixed width whenever the anchor's proposal is a copy with matched context >= m;
- per-bucket: the best fixed width for each (kind, evidence bin) of the anchor's proposal, chosen
  by coordinate search on the same replies (in-sample);
- per-bucket, split: the same with each bucket split by one more feature of the anchor, to see
  whether it singles out rounds worth drafting that the bucket alone does not (``SPLITS``).

    python -m benchmarks.oracle.ngram_policy_ceiling SCRIPT.jsonl [--max-tokens 128] [--overhead 0.12] [--splits]
        [--model GGUF --costs VERIFY_COSTS.json]

``--model`` decodes the replies on another target (default: the bundled model) and ``--costs``
prices rounds by that target's verify costs (verify_costs.py's JSON: median process time per
width over the one-row time); without it, the bundled model's ratios below.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

import numpy as np

from adaspark_app import native
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.engine.ngram import NgramIndex
from adaspark_app.learn.kinds import NgramKind
from adaspark_app.runner import load_script
from benchmarks.common import load_costs
from benchmarks.oracle.ngram_oracle import copy_run

# Verify time over one-row time on this machine (benchmarks/results/oracle/ngram_oracle_longpaste.md).
WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
RATIOS = (1.0, 1.81, 2.39, 2.89, 4.11, 4.86, 6.98, 9.0, 13.17, 17.4)


def cost(w: int) -> float:
    return float(np.interp(w, WIDTHS, RATIOS))


def ebin(e: int) -> int:
    return min(int(math.log2(max(e, 1))), 5)


def set_costs(path: str) -> None:
    """Price rounds by a target's measured verify costs instead of the bundled model's."""
    global WIDTHS, RATIOS
    table = load_costs(path)
    WIDTHS = tuple(sorted(table))
    RATIOS = tuple(table[w] for w in WIDTHS)


def ar_replies(script: str, max_tokens: int, model: str | None = None) -> list[tuple[list[int], list[int]]]:
    eng = ChatEngine(model, arm="ar", n_ctx=4096, n_threads=2)
    out = []
    for c in load_script(script):
        msgs = []
        for turn, u in enumerate(c.turns):
            msgs.append({"role": "user", "content": u})
            prompt = eng.prompt_tokens(msgs)
            r = eng.generate(c.id, msgs, max_tokens=max_tokens, turn=turn)
            out.append((prompt, list(r.tokens)))
            msgs.append({"role": "assistant", "content": r.text})
        eng.reset_conversation()
    eng.close()
    return out


# Features a bucket may be split by (--splits), each 0/1 or a small count, computed at the anchor:
# - agree: a copy's next token is also the most frequent follower of the last 3 tokens;
# - ambiguous: the last 4 tokens occurred before with 2+ different next tokens;
# - streak: the index's proposal for the token just committed was right.
SPLITS = ("agree", "ambiguous", "streak")


def _features(idx: NgramIndex, first, last_hit: bool) -> dict[str, int]:
    text = idx._tokens  # read only
    best = idx._best.get(tuple(text[-3:])) if len(text) >= 3 else None  # the follower table's top
    return {"agree": int(first is not None and best is not None and best[0] == first.token),
            "ambiguous": int(idx.anchor_ambiguous()), "streak": int(last_hit)}


def positions(data, splits: bool = False):
    """Per reply, per position: (kind, evidence) of the anchor's proposal, the chain's length, the
    true copy run, and (with ``splits``) the SPLITS features."""
    seqs = []
    for prompt, reply in data:
        idx = NgramIndex(prompt)
        seq = []
        last_hit = False
        for pos in range(len(reply)):
            chain = idx.chain([], 32)
            run = copy_run(chain, reply, pos)
            first = chain[0] if chain else None
            feats = _features(idx, first, last_hit) if splits else {}
            seq.append((first.kind if first else None, first.evidence if first else 0, len(chain), run, feats))
            last_hit = run > 0
            idx.extend([reply[pos]])
        seqs.append(seq)
    return [s for s in seqs if len(s) > 4]


def speed(seq, choose, d: float) -> float:
    pos, t = 0, 0.0
    while pos < len(seq):
        kind, ev, length, run, feats = seq[pos]
        w = max(1, min(choose(kind, ev, run, feats), length + 1))
        t += 1.0 if w == 1 else cost(w) + d
        pos += 1 if w == 1 else min(run, w - 1) + 1
    return len(seq) / t


def geo(seqs, choose, d: float) -> float:
    return math.exp(float(np.mean([math.log(speed(s, choose, d)) for s in seqs])))


def search(seqs, keys, key, d: float) -> dict:
    """Coordinate search (3 sweeps) for the best fixed width per key(kind, evidence, features)."""
    pol = {k: 1 for k in keys}

    def choose(kind, ev, run, feats):
        return 1 if kind is None else pol.get(key(kind, ev, feats), 1)

    for _ in range(3):
        for k in keys:
            pol[k] = max(WIDTHS, key=lambda w: (pol.__setitem__(k, w), geo(seqs, choose, d))[1])
    return pol


def main() -> None:
    native.activate()  # the Q4_1 kernels, if built, before anything imports llama_cpp
    ap = argparse.ArgumentParser()
    ap.add_argument("script")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--overhead", type=float, default=0.12, help="a drafted round's host time D over a one-row step")
    ap.add_argument("--splits", action="store_true", help="also search each bucket split by each of SPLITS")
    ap.add_argument("--model", default=None, help="the target GGUF (default: the bundled model)")
    ap.add_argument("--costs", default=None, help="the target's verify costs (verify_costs.py JSON)")
    a = ap.parse_args()
    if a.costs:
        set_costs(a.costs)
    seqs = positions(ar_replies(a.script, a.max_tokens, a.model), a.splits)
    d = a.overhead

    def oracle(kind, ev, run, feats):
        return max(WIDTHS, key=lambda w: (min(run, w - 1) + 1) / (cost(w) + (d if w > 1 else 0.0)))

    acc = defaultdict(lambda: [0, 0])
    for s in seqs:
        for kind, ev, _, run, _ in s:
            if kind is not None:
                acc[(kind, ebin(ev))][0] += run > 0
                acc[(kind, ebin(ev))][1] += 1
    print(f"# N-gram width policies on `{a.script}` ({len(seqs)} replies, {a.max_tokens} tokens, D = {d})\n")
    print("Speed over plain decode, geometric mean over replies, from `ar` replies and verify-cost ratios.\n")
    print("| policy | speed |\n|---|---|")
    print(f"| oracle (knows each copy's run) | {geo(seqs, oracle, d):.3f} |")
    for m in (8, 16):
        for w in (4, 8, 12):
            print(f"| static: width {w} when the anchor's copy matched >= {m} tokens | "
                  f"{geo(seqs, lambda k, e, r, f, m=m, w=w: w if k == NgramKind.COPY and e >= m else 1, d):.3f} |")
    pol = search(seqs, [(k, e) for k, e in acc], lambda kind, ev, feats: (kind, ebin(ev)), d)

    def by_bucket(kind, ev, run, feats):
        return 1 if kind is None else pol.get((kind, ebin(ev)), 1)

    print(f"| per-bucket width, coordinate search on these replies (in-sample) | {geo(seqs, by_bucket, d):.3f} |")
    for name in SPLITS if a.splits else ():
        def key(kind, ev, feats, name=name):
            return (kind, ebin(ev), feats[name])

        keys = sorted({key(k, e, f) for s in seqs for k, e, _, _, f in s if k is not None}, key=str)
        split_pol = search(seqs, keys, key, d)

        def by_split(kind, ev, run, feats, split_pol=split_pol, key=key):
            return 1 if kind is None else split_pol.get(key(kind, ev, feats), 1)

        print(f"| per-bucket width, each bucket split by `{name}` (in-sample) | {geo(seqs, by_split, d):.3f} |")
    print()
    print("| anchor proposal (kind, evidence bin) | proposals | first token accepted | per-bucket width |")
    print("|---|---|---|---|")
    for b in sorted(acc, key=str):
        n_ok, n = acc[b]
        lo = 2 ** b[1]
        print(f"| {b[0]}, {lo}{'+' if b[1] == 5 else '-' + str(2 * lo - 1)} | {n} | {n_ok / n:.0%} | {pol[b]} |")


if __name__ == "__main__":
    main()
