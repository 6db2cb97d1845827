"""Interleaved speed comparison of engines in one process: `ar`, a variant before a change, now.

Conversations run in rotating arm order, each pass over the script in turn; per-reply
decode-speed ratios against `ar`, geometric means with a 95% bootstrap interval over
conversations (the bench's statistics), replies identical to `ar`, and now / before with its
interval. Used by the before/after benchmarks (`class_precision.py`, `ambiguous_copies.py`).
"""

from __future__ import annotations

import math

import numpy as np

from adaspark_app.bench.stats import bootstrap_interval, geometric_mean
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.runner import load_script


def _ratio(speeds: dict, a: str, b: str) -> tuple[float, float, float]:
    by_conv: dict[str, list[float]] = {}
    for key in speeds[b]:
        by_conv.setdefault(key[0], []).append(math.log(np.mean(speeds[a][key]) / np.mean(speeds[b][key])))
    g = geometric_mean(math.exp(x) for v in by_conv.values() for x in v)
    lo, hi = bootstrap_interval(by_conv)
    return g, lo, hi


def compare(arms: dict[str, ChatEngine], script: str, passes: int, max_tokens: int,
            rounds: dict[str, list[dict]] | None = None) -> str:
    """Run `arms` ({"ar", "before", "now"} -> engine) interleaved; return the markdown table.
    ``rounds``: if given, each arm's rounds (RoundEvent.to_json, as --log-rounds writes them) are
    appended under its name. Closes the engines."""
    names = list(arms)
    convs = list(load_script(script))
    speeds: dict[str, dict] = {a: {} for a in names}
    tokens: dict[str, dict] = {a: {} for a in names}
    seconds = {a: 0.0 for a in names}
    for p in range(passes):
        for i, c in enumerate(convs):
            k = (i + p) % len(names)
            for a in names[k:] + names[:k]:
                eng, msgs = arms[a], []
                for t, u in enumerate(c.turns):
                    msgs.append({"role": "user", "content": u})
                    log = None if rounds is None else rounds.setdefault(a, []).append
                    r = eng.generate(c.id, msgs, max_tokens=max_tokens, turn=t,
                                     on_round=None if log is None else (lambda ev, log=log: log(ev.to_json())))
                    msgs.append({"role": "assistant", "content": r.text})
                    speeds[a].setdefault((c.id, t), []).append(r.n_tokens / max(r.decode_s, 1e-9))
                    tokens[a][(c.id, t)] = r.tokens
                    seconds[a] += r.decode_s
                eng.reset_conversation()
        print(f"pass {p + 1}/{passes} done", flush=True)
    for eng in arms.values():
        eng.close()
    lines = [f"`{script}`, {passes} pass{'es' if passes != 1 else ''}, {max_tokens} tokens\n",
             "| arm | against `ar` [95% interval] | identical to `ar` | decode seconds |", "|---|---|---|---|",
             f"| ar | - | - | {seconds['ar']:.2f} |"]
    for a in ("before", "now"):
        g, lo, hi = _ratio(speeds, a, "ar")
        same = sum(tokens[a][k] == tokens["ar"][k] for k in tokens["ar"])
        lines.append(f"| {a} | {g:.3f}x [{lo:.3f}, {hi:.3f}] | {same}/{len(tokens['ar'])} | {seconds[a]:.2f} |")
    g, lo, hi = _ratio(speeds, "now", "before")
    lines.append(f"\nnow / before: {g:.3f} [{lo:.3f}, {hi:.3f}]")
    return "\n".join(lines)
