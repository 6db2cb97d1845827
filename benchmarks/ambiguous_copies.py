"""Ambiguous copies counted with the shortest copies by the draft gate, against not, on real rounds.

A copy whose last 4 tokens earlier passages continued with different tokens was picked among
passages that part ways right there (`NgramIndex.anchor_ambiguous`); on the long pastes such
copies matched on 8-15 tokens were right at their first token 54% of the time against 96% for
the rest (`results/ngram_policy_ceiling_longpaste.md`). Now the gate's probe class counts them
with the copies matched on 4-7 tokens (unless they matched 32+); before, by their matched length.
Three engines in one process, `ar`, before and now, compared by ``interleaved.compare``.

    python benchmarks/ambiguous_copies.py SCRIPT.jsonl [--passes 2] [--max-tokens 128]
"""

from __future__ import annotations

import argparse

from interleaved import compare  # benchmarks/ is the script's own directory

from adaspark_app import native
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.learn.gates import PROBE_NONE, probe_class


def _engine(arm: str, ambiguity: bool = True) -> ChatEngine:
    eng = ChatEngine(None, arm=arm, n_ctx=4096, n_threads=2)
    if not ambiguity:
        def probe(dec, first=None):
            step = dec.ngram.first_step()
            return PROBE_NONE if step is None else probe_class(step.kind, step.evidence)
        eng.decoder.policy.probe = probe
    return eng


def main() -> None:
    native.activate()  # the Q4_1 kernels, if built, before anything imports llama_cpp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    arms = {"ar": _engine("ar"), "before": _engine("adaspark", False), "now": _engine("adaspark")}
    print("\n" + compare(arms, a.script, a.passes, a.max_tokens))


if __name__ == "__main__":
    main()
