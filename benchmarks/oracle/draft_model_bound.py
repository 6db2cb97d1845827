"""Would a smaller model of the same family, drafting for a target, beat plain decode on this CPU?

Classic speculative decoding with a draft model: each round the draft proposes a chain of k tokens
by its own greedy steps, the target verifies the k + 1 rows in one forward, and the round emits the
agreed prefix plus the target's own next token. Because verification stops at the first
disagreement, the draft's chain up to there is the target's own text, so teacher forcing gives the
exact count: feed the target's greedy reply (the `ar` replies of a bench run) through the draft
with logits on every row, and a round starting at reply position i accepts as many tokens as the
draft's argmax agrees with the reply from i on, at most k.

Priced in one-row target steps: k draft steps at ``c`` (the draft's one-row step over the target's,
measured here in 1-thread CPU time like benchmarks/cost/verify_cost_cpu.py, or given) plus the
target's verify of k + 1 rows (its cost table, as benchmarks/common.py load_costs reads it). That is a bound
in the draft's favour: it charges nothing for the draft's prefill of the prompt, nothing for host
time, and nothing for catching the draft up on the target's bonus token. The last column prices
the drafts at nothing: what a drafter as cheap as DSpark's block (a few percent of a step) would
reach if it agreed as often.

    python -m benchmarks.oracle.draft_model_bound --target BIG.gguf --draft SMALL.gguf --set SET.jsonl \
        --replies REPLIES.jsonl --costs verify_cost_cpu_BIG.json [--draft-cost C] [--max-k 8]

A draft whose vocabulary differs from the target's cannot draft for it: one line, exit 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path



def chain_speed(agree: Sequence[bool], k: int, c_draft: float, cost: Callable[[int], float]) -> float:
    """Tokens per one-row target step over one reply: rounds of a k-token draft chain.

    ``agree[i]``: whether the draft's argmax after the reply's first i tokens is the reply's token i.
    A round at i accepts the run of agreements from i (at most k) and the target's own next token.
    """
    if k < 1:
        raise ValueError("k must be at least 1")
    n = len(agree)
    i = tokens = 0
    steps = 0.0
    while i < n:
        a = 0
        while a < k and i + a < n and agree[i + a]:
            a += 1
        got = min(a + 1, n - i)
        tokens += got
        steps += k * c_draft + cost(k + 1)
        i += got
    return tokens / steps if steps else 1.0


def bound_table(runs: list[Sequence[bool]], c_draft: float, cost: Callable[[int], float],
                max_k: int = 8) -> list[tuple[int, float]]:
    """(k, geometric mean over replies of speed over plain decode) for k = 1 .. max_k."""
    out = []
    for k in range(1, max_k + 1):
        logs = [math.log(chain_speed(r, k, c_draft, cost)) for r in runs if len(r)]
        out.append((k, math.exp(sum(logs) / len(logs)) if logs else 1.0))
    return out


def same_vocabulary(a, b) -> bool:
    """Whether two backends (LlamaBackend) share one vocabulary by the engine's own rule for a
    drafter (engine.dspark): the same size and the same text (llama_vocab_get_text) for every token."""
    return a.vocab_texts() == b.vocab_texts()


def agreement_runs(draft_path: str, reqs: list) -> list[list[bool]]:
    """Per request (ngram_mod_replay.requests' rows), the draft's teacher-forced agreement with the
    reply: the prompt prefilled, then the prompt's last token and the reply verified in chunks
    (row j: the draft's argmax after the prompt and the reply's first j tokens)."""
    from adaspark_app.engine.backend import LlamaBackend

    longest = max(len(r[3]) + len(r[4]) for r in reqs)
    d = LlamaBackend(draft_path, n_ctx=max(512, longest + 16), n_threads=2)
    runs = []
    try:
        for _cat, _cid, _t, prompt, reply, _capped in reqs:
            d.seq_rm(0, 0, -1)
            if len(prompt) > 1:
                d.prefill(prompt[:-1], 0, argmax=False)
            rows = [prompt[-1]] + list(reply[:-1])
            picks: list[int] = []
            for i in range(0, len(rows), d.n_batch):
                chunk = rows[i:i + d.n_batch]
                start = len(prompt) - 1 + i
                out = d.verify(chunk, range(start, start + len(chunk)), [(0,)] * len(chunk))
                picks += [int(x) for x in out.argmax]
            runs.append([p == t for p, t in zip(picks, reply)])
    finally:
        d.close()
    return runs


def one_row_ratio(draft: str, target: str, reps: int = 9) -> float:
    """The draft's one-row step over the target's, 1-thread CPU time (verify_cost_cpu's child)."""
    from benchmarks.cost import verify_cost_cpu as v

    d = v.run_mode(draft, "off", 400, reps, 0)["thread_s"][1]
    t = v.run_mode(target, "off", 400, reps, 0)["thread_s"][1]
    return d / t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--set", required=True)
    ap.add_argument("--replies", required=True)
    ap.add_argument("--costs", default=None, help="the target's verify_cost_cpu JSON")
    ap.add_argument("--draft-cost", type=float, default=None,
                    help="the draft's one-row step over the target's (default: measured)")
    ap.add_argument("--max-k", type=int, default=8)
    args = ap.parse_args(argv)
    if args.max_k < 1 or (args.draft_cost is not None and args.draft_cost < 0):
        print("draft_model_bound: --max-k must be at least 1 and --draft-cost at least 0", file=sys.stderr)
        return 2
    for p in (args.target, args.draft, args.set, args.replies) + ((args.costs,) if args.costs else ()):
        if not Path(p).is_file():
            print(f"draft_model_bound: no such file: {p}", file=sys.stderr)
            return 2
    from adaspark_app import native

    native.activate()
    from adaspark_app.engine.backend import LlamaBackend
    from adaspark_app.errors import AdaSparkError
    from benchmarks.common import cost_fn, load_costs
    from benchmarks.oracle.ngram_mod_replay import requests

    try:
        t, d = LlamaBackend.vocab_only(args.target), LlamaBackend.vocab_only(args.draft)
        try:
            same = same_vocabulary(t, d)
        finally:
            t.close()
            d.close()
        if not same:
            print(f"draft_model_bound: {args.draft} has another vocabulary than {args.target}: it cannot draft for it",
                  file=sys.stderr)
            return 2
        reqs, _, _ = requests(args.target, args.set, args.replies)
    except (AdaSparkError, OSError, ValueError, KeyError) as e:
        print(f"draft_model_bound: {e}", file=sys.stderr)
        return 2
    if not reqs:
        print(f"draft_model_bound: no `ar` replies of {args.set} in {args.replies}", file=sys.stderr)
        return 2
    runs = agreement_runs(args.draft, reqs)
    c = args.draft_cost if args.draft_cost is not None else one_row_ratio(args.draft, args.target)
    table = load_costs(args.costs)
    cost = cost_fn(table)
    n = sum(len(r) for r in runs)
    right = sum(sum(r) for r in runs)
    print(f"# Draft-model bound: `{Path(args.draft).name}` drafting for `{Path(args.target).name}`\n")
    print(f"{len(runs)} replies, {n} tokens; the draft's argmax agrees with the target's reply on "
          f"{right} ({right / max(n, 1):.1%}), teacher-forced.")
    print(f"Draft step over target step: {c:.3f}; target verify over one row: "
          + ", ".join(f"{w} rows {table[w]:.2f}" for w in sorted(table)) + ".\n")
    print("| draft chain k | rows verified | speed over plain decode (bound) | the same agreement from a free draft |")
    print("|---|---|---|---|")
    free = dict(bound_table(runs, 0.0, cost, args.max_k))
    for k, s in bound_table(runs, c, cost, args.max_k):
        print(f"| {k} | {k + 1} | {s:.3f} | {free[k]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
