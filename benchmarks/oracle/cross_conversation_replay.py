"""Would an n-gram index over earlier conversations propose what the conversation's own does not?

AdaSpark's n-gram index holds the conversation's own text (the prompt with its history, then the
reply as it is committed). An index that also held every earlier conversation of the run (their
prompts and the model's replies) could propose a model's habitual phrasing a new conversation
has not used yet. This replay measures the most that could add, on the `ar` replies of a bench
run, in run order: at each position it follows the conversation's own chain and the chain of an
index over earlier conversations plus this one, counts the tokens each would have right in a
row, advances by the longer run (a plain step where neither is right), and reports the share of
reply tokens covered by the own index's runs and the extra share the earlier conversations add.
No timing: it is an upper bound on the tokens, not a speed.

    python -m benchmarks.oracle.cross_conversation_replay REPLIES.jsonl SET.jsonl --model GGUF [--arm adaspark:ar]
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from adaspark_app.engine.ngram import NgramIndex
from benchmarks.common import read_jsonl
from benchmarks.oracle.ngram_mod_replay import run_of

SEPARATOR = -1  # between conversations in the cross-conversation index: no context spans two


def _run(chain: list, reply: Sequence[int], i: int) -> int:
    """How many of a chain's proposed tokens (NgramSteps) the reply has, in a row from i."""
    return run_of([s.token for s in chain], list(reply), i)


def coverage(replies: list[tuple[list[int], list[int]]], depth: int = 32) -> dict[str, int]:
    """``replies``: (prompt tokens, reply tokens) in run order, a prompt holding its conversation's
    history. Returns the reply tokens, those the own index's runs cover, and those only the
    cross-conversation index's longer runs add."""
    earlier: list[int] = []
    total = own = extra = 0
    for prompt, reply in replies:
        mine, both = NgramIndex(list(prompt)), NgramIndex(earlier + [SEPARATOR] + list(prompt))
        i = 0
        while i < len(reply):
            a = _run(mine.chain((), depth), reply, i)
            b = _run(both.chain((), depth), reply, i)
            step = max(1, a, b)
            own += a if a >= b else 0
            extra += b if b > a else 0
            mine.extend(reply[i:i + step])
            both.extend(reply[i:i + step])
            i += step
        total += len(reply)
        earlier += [SEPARATOR] + list(prompt) + list(reply)
    return {"tokens": total, "own": own, "extra": extra}


def replies_in_order(rows: list[dict], convs: list[dict], tokenize: Callable[[str], list[int]],
                     arm: str) -> list[tuple[list[int], list[int]]]:
    """(prompt, reply) tokens of ``arm``'s replies in the set's order; a prompt is the
    conversation's user turns and earlier replies up to this turn (no template)."""
    order = {c["id"]: i for i, c in enumerate(convs)}
    turns = {c["id"]: c["turns"] for c in convs}
    mine = sorted((r for r in rows if r["arm"] == arm), key=lambda r: (order[r["conversation"]], r["turn"]))
    said: dict[str, list[list[int]]] = {}
    out = []
    for r in mine:
        history = said.setdefault(r["conversation"], [])
        prompt: list[int] = []
        for t in range(r["turn"] + 1):
            prompt += tokenize(turns[r["conversation"]][t])
            if t < r["turn"] and t < len(history):
                prompt += history[t]
        reply = tokenize(r["text"])
        history.append(reply)
        out.append((prompt, reply))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("replies")
    ap.add_argument("set")
    ap.add_argument("--model", required=True, help="the GGUF whose tokenizer the replies are counted in")
    ap.add_argument("--arm", default="adaspark:ar")
    args = ap.parse_args(argv)
    from llama_cpp import Llama

    llm = Llama(args.model, vocab_only=True, verbose=False)
    rows = read_jsonl(args.replies)
    convs = read_jsonl(args.set)
    pairs = replies_in_order(rows, convs, lambda s: llm.tokenize(s.encode(), add_bos=False, special=False), args.arm)
    c = coverage(pairs)
    n = max(c["tokens"], 1)
    print(f"`{args.replies}` ({args.arm}, {len(pairs)} replies, {c['tokens']} tokens): the conversation's own "
          f"index covers {c['own']} ({c['own'] / n:.1%}); earlier conversations add {c['extra']} ({c['extra'] / n:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
