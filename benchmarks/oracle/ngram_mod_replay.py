"""Replay `ar` replies through AdaSpark's n-gram index and llama.cpp's ngram-mod rule, priced by a
target's verify costs (no timing: counts of rounds, rows and accepted tokens only).

llama.cpp's ngram-mod (common/ngram-mod.cpp, common/speculative.cpp, defaults in common/common.h:
n_match 24, n_max 64, n_min 48), exactly:

- a hash table of 4M slots maps the hash of 24 consecutive tokens to the token that followed
  them (the latest writer wins, collisions overwrite); the whole prompt is added when a request
  begins, and generated text in chunks: only when more than 32 new tokens have come since the last
  addition (so the reply's last 24-55 tokens are not yet in the table);
- each round it looks up the last 24 tokens (the anchor last), appends the token found, slides the
  window by one and looks up again, up to 64 tokens; if the chain breaks before 48 tokens it drafts
  nothing (a plain step), else it drafts the chain (48-64 tokens) and verifies all of it (49-65 rows);
- 5 rounds in a row with under a quarter of the draft accepted reset the table (re-filled from the
  whole text at the next draft, so on one sequence it changes nothing; not modelled).

This replay keys the table by the 24 tokens themselves (no collisions), per request.

Policies, each as speed over plain decode (tokens / sum of verify cost over one-row step, plus a
drafted round's host time D):
- oracle: our chain (up to 63 tokens) verified exactly as far as it is right, at the best width;
- ngram-mod: the rule above;
- ours, logged: the widths AdaSpark's own run chose on these replies (from the bench's replies
  file: rounds per width, tokens), priced by the same table (the "before");
- bucket, 31-token chains: the best fixed width per (kind, evidence) bucket of the anchor's
  proposal, found on these replies (in-sample: the chooser's best case), with chains cut at 31
  tokens as the engine had them (the before's ceiling);
- + floor on every firing: the same, but wherever ngram-mod's rule fires (engine/ngram.py
  long_copy_rows) the whole 63-token chain is verified;
- bucket, 63-token chains on long copies: the engine now (engine/ngram.py anchor_depth): where
  the rule fires the anchor's chain runs to 63 tokens, so the bucket widths may reach 64;
- + confirmed floor (after): the same bucket widths, and the floor where it is confirmed
  (learn.width.long_copy_floor: the round before accepted a draft of >= 24 tokens whole).

    python -m benchmarks.oracle.ngram_mod_replay --model ~/.cache/adaspark/targets/qwen0.5b.gguf \
        --set SET.jsonl --replies REPLIES.jsonl [--costs verify_cost.json] [--overhead 0.0] [--extra-scale 1.0]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from adaspark_app.engine.backend import LlamaBackend
from adaspark_app.engine.ngram import NgramIndex, long_copy_rows
from adaspark_app.learn.constants import LONG_COPY_CONFIRM, LONG_COPY_DEPTH
from adaspark_app.engine.template import chat_template_for
from benchmarks.common import cost_fn, load_costs, read_jsonl
from benchmarks.oracle.ngram_policy_ceiling import ebin  # the same evidence bins

MOD_MATCH, MOD_MAX, MOD_MIN, MOD_CHUNK = 24, 64, 48, 32  # ngram-mod's defaults (common.h)
# Categories grouped as paste-and-ask (long pastes, pasted code); every other one (ShareGPT chats,
# "sharegpt"; MT-Bench) is multi-turn chat. (A prefix test on "sharegpt" put the chats there too.)
PASTE_CATEGORIES = ("sharegpt-long", "sharegpt-code")


def group_of(category: str) -> str:
    """The table's group for a conversation's category: paste-and-ask or multi-turn chat."""
    return "paste-and-ask" if category in PASTE_CATEGORIES else "multi-turn chat"


def scale_extra(table: dict[int, float], factor: float) -> dict[int, float]:
    """The table with each width's cost above one row scaled: 1 + factor x (cost - 1). A what-if:
    how cheap would verifies have to be (0: a verify of any width costs one step)."""
    if factor < 0:
        raise ValueError("the scale of the extra rows' cost cannot be negative")
    return {w: 1.0 + factor * (c - 1.0) for w, c in table.items()}


def requests(model: str, set_path: str, replies_path: str):
    """(category, conversation, prompt tokens, reply tokens) per `ar` turn, AdaSpark's logged
    rows per turn ((conversation, turn) -> reply row), and the vocabulary's stop test for the
    n-gram chains (``LlamaBackend.is_control``, as the decoder passes it)."""
    b = LlamaBackend.vocab_only(model)
    tpl = chat_template_for(b)
    rows = read_jsonl(replies_path)
    # `adaspark bench` names the arm "ar"; benchmarks/speed/run_peers.py, "adaspark:ar"
    ar = {(r["conversation"], r["turn"]): r for r in rows if r["arm"] in ("ar", "adaspark:ar")}
    ada = {(r["conversation"], r["turn"]): r for r in rows if r["arm"] == "adaspark"}
    out = []
    for c in read_jsonl(set_path):
        msgs = []
        for t, u in enumerate(c["turns"]):
            r = ar.get((c["id"], t))
            if r is None:
                break
            msgs.append({"role": "user", "content": u})
            prompt = b.tokenize(tpl.render(msgs, add_generation_prompt=True), add_special=False, parse_special=True)
            reply = b.tokenize(r["text"], add_special=False, parse_special=False)
            out.append((c.get("category", "?"), c["id"], t, prompt, reply, bool(r.get("capped"))))
            msgs.append({"role": "assistant", "content": r["text"]})
    return out, ada, b.is_control


class ModTable:
    """ngram-mod's table for one request, keyed exactly (see the module docstring)."""

    def __init__(self, prompt: list[int]) -> None:
        self.map: dict[tuple[int, ...], int] = {}
        self.i_last = 0
        n = MOD_MATCH
        if len(prompt) >= n:
            for i in range(len(prompt) - n):
                self.map[tuple(prompt[i:i + n])] = prompt[i + n]
            self.i_last = len(prompt) - n

    def draft(self, text: list[int]) -> list[int]:
        """The draft after ``text`` (its last token is the anchor, id_last); [] when none."""
        n = MOD_MATCH
        cached = text[:-1]  # the server's prompt: the tokens before the sampled one
        cur = len(cached)
        if cur < n:
            return []
        if self.i_last + MOD_CHUNK < cur:
            for i in range(self.i_last, cur - n):
                self.map[tuple(cached[i:i + n])] = cached[i + n]
            self.i_last = cur - n
        win = list(text[-n:])
        out: list[int] = []
        for i in range(MOD_MAX):
            tok = self.map.get(tuple(win[i:i + n]))
            if tok is None:
                if i < MOD_MIN:
                    return []
                break
            out.append(tok)
            win.append(tok)
        return out


def run_of(chain: list[int], reply: list[int], pos: int) -> int:
    k = 0
    while k < len(chain) and pos + k < len(reply) and chain[k] == reply[pos + k]:
        k += 1
    return k


def positions(prompt: list[int], reply: list[int], stop=None):
    """Per position of the reply: the anchor proposal's (kind, evidence), our chain (63 deep, ending
    before a ``stop`` token as the decoder's does), the long-copy rows our rule verifies (0: none),
    and ngram-mod's draft."""
    idx = NgramIndex(prompt, stop=stop)
    mod = ModTable(prompt)
    text = list(prompt)
    seq = []
    for pos in range(len(reply)):
        steps = idx.chain([], LONG_COPY_DEPTH)
        first = steps[0] if steps else None
        toks = [s.token for s in steps]
        seq.append((first.kind if first else None, first.evidence if first else 0, toks,
                    long_copy_rows(steps), mod.draft(text)))
        idx.extend([reply[pos]])
        text.append(reply[pos])
    return seq


def oracle_width(chain: list[int], reply: list[int], pos: int, cost: Callable[[int], float], d: float,
                 capped: bool) -> int:
    """The oracle's width at ``pos``: it knows how far ``chain`` runs along the reply and picks the
    width of the best tokens per cost (a drafted round pays ``d`` more), up to 64 rows; a reply cut at
    max_tokens (``capped``) verifies no more rows than tokens are left."""
    run = run_of(chain, reply, pos)
    widths = range(1, 65) if not capped else range(1, min(64, len(reply) - pos) + 1)
    return max(widths, key=lambda w: (min(run, w - 1) + 1) / (cost(w) + (d if w > 1 else 0.0)))


def simulate(seq, reply, choose, cost, d: float, capped: bool) -> tuple[float, int, int, int]:
    """Speed over plain, rounds drafted, rows verified, tokens accepted from drafts. A reply cut
    at max_tokens (``capped``) clamps each verify to the tokens left, as the engine's budget does
    (the decoder's select; llama-server likewise caps a draft by the tokens left to predict):
    without it a copy that runs past the cut looks wrong where the reply merely ends."""
    pos, t, drafted, rows, acc = 0, 0.0, 0, 0, 0
    prev = 0  # tokens the previous round accepted from its draft
    while pos < len(seq):
        w, chain = choose(seq[pos], reply, pos, prev)
        w = max(1, min(w, len(chain) + 1))
        if capped:
            w = min(w, len(seq) - pos)
        if w == 1:
            t += 1.0
            pos += 1
            prev = 0
            continue
        r = run_of(chain[:w - 1], reply, pos)
        prev = r if r == w - 1 else 0  # only a draft accepted whole confirms the copy
        t += cost(w) + d
        drafted, rows, acc = drafted + 1, rows + w, acc + r
        pos += min(r + 1, len(seq) - pos)
    return len(seq) / t, drafted, rows, acc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--set", required=True)
    ap.add_argument("--replies", required=True)
    ap.add_argument("--costs", default=None)
    ap.add_argument("--overhead", type=float, default=0.0, help="a drafted round's host time D over a one-row step")
    ap.add_argument("--extra-scale", type=float, default=1.0,
                    help="what-if: each width's cost above one row times this (0.5: half as dear; 0: free)")
    a = ap.parse_args()
    if a.extra_scale < 0:
        print("ngram_mod_replay: --extra-scale cannot be negative", file=sys.stderr)
        sys.exit(2)
    cost = cost_fn(scale_extra(load_costs(a.costs), a.extra_scale))
    d = a.overhead
    reqs, ada, stop = requests(a.model, a.set, a.replies)
    data = [(cat, cid, t, reply, positions(prompt, reply, stop), capped)
            for cat, cid, t, prompt, reply, capped in reqs]
    capped_now = [False]  # whether the reply being simulated was cut at max_tokens (the oracle's budget)

    def oracle(p, reply, pos, prev):
        return oracle_width(p[2], reply, pos, cost, d, capped_now[0]), p[2]

    def ngram_mod(p, reply, pos, prev):
        return len(p[4]) + 1, p[4]

    def bucket_policy(pol, floor, depth: int = 31):
        def choose(p, reply, pos, prev):
            kind, ev, chain, long_rows, _ = p
            if floor and long_rows and (floor is True or prev >= floor):
                return long_rows, chain
            # the engine follows only a long copy (the rule fires) past 31 tokens
            return (1 if kind is None else pol.get((kind, ebin(ev)), 1)), chain[:depth if long_rows else 31]
        return choose

    def geo(choose, subset):
        sp = []
        for _, _, _, r, s, capped in subset:
            capped_now[0] = capped
            sp.append(simulate(s, r, choose, cost, d, capped)[0])
        return math.exp(float(np.mean(np.log(sp))))

    def search(subset, floor: bool, depth: int = 31):
        keys = sorted({(p[0], ebin(p[1])) for *_, s, _ in subset for p in s if p[0] is not None}, key=str)
        pol = {k: 1 for k in keys}
        grid = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) + ((48, 64) if depth > 31 else ())
        for _ in range(2):
            for k in keys:
                pol[k] = max(grid, key=lambda w: (pol.__setitem__(k, w), geo(bucket_policy(pol, floor, depth), subset))[1])
        return pol

    groups = defaultdict(list)
    for row in data:
        groups[group_of(row[0])].append(row)
        groups[row[0]].append(row)
    print(f"# n-gram replay: `{a.replies}` ({len(data)} replies), costs {a.costs or 'issue 19 Qwen-0.5B'}"
          + (f" with the cost above one row x {a.extra_scale:g}" if a.extra_scale != 1.0 else "") + f", D = {d}\n")
    print("Speed over plain decode (geometric mean over replies), priced by verify costs; share = gain over the oracle's gain.\n")
    print("| set | replies | oracle | ngram-mod | share | ours logged (before) | share "
          "| bucket, 31-token chains (before's ceiling) | share | + floor on every firing | share "
          "| bucket, 63-token chains on long copies | share | + confirmed floor (after) | share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, sub in sorted(groups.items(), key=lambda kv: (kv[0] not in ("paste-and-ask", "multi-turn chat"), kv[0])):
        o = geo(oracle, sub)
        m = geo(ngram_mod, sub)
        logged = []
        for _, cid, t, reply, _, _ in sub:
            r = ada.get((cid, t))
            if r is None:
                continue
            tt = sum(cnt * (1.0 if int(w) == 1 else cost(int(w)) + d) for w, cnt in r["widths"].items())
            logged.append(r["n_tokens"] / tt)
        lg = math.exp(float(np.mean(np.log(logged)))) if logged else float("nan")
        before = geo(bucket_policy(search(sub, False), False), sub)
        every = geo(bucket_policy(search(sub, True), True), sub)
        deep_pol = search(sub, False, LONG_COPY_DEPTH)
        deep = geo(bucket_policy(deep_pol, False, LONG_COPY_DEPTH), sub)
        # the floor on top of the same bucket widths: what it adds to a chooser that is unchanged
        after = geo(bucket_policy(deep_pol, LONG_COPY_CONFIRM, LONG_COPY_DEPTH), sub)

        def share(x):
            return f"{(x - 1) / (o - 1):.0%}" if o > 1 else "-"
        print(f"| {name} | {len(sub)} | {o:.3f} | {m:.3f} | {share(m)} | {lg:.3f} | {share(lg)} | "
              f"{before:.3f} | {share(before)} | {every:.3f} | {share(every)} | {deep:.3f} | {share(deep)} | {after:.3f} | {share(after)} |")
    # where ngram-mod drafts: how its draft compares with our chain
    for name, sub in (("paste-and-ask", groups["paste-and-ask"]), ("multi-turn chat", groups["multi-turn chat"])):
        tot = [0, 0, 0]
        for *_, reply, s, capped in sub:
            _, dr, rw, ac = simulate(s, reply, ngram_mod, cost, d, capped)
            tot = [tot[0] + dr, tot[1] + rw, tot[2] + ac]
        print(f"ngram-mod on {name}: {tot[0]} drafted rounds, {tot[1] - tot[0]} draft tokens, {tot[2]} accepted "
              f"({tot[2] / max(tot[1] - tot[0], 1):.0%})")
    n_mod = mod_ok = ours_len = mod_len = ours_ok = long_fire = long_ok = 0
    for *_, reply, s, _ in data:
        for pos, p in enumerate(s):
            if p[3]:
                long_fire += 1
                long_ok += run_of(p[2][:p[3] - 1], reply, pos)
            if p[4]:
                n_mod += 1
                mod_len += len(p[4])
                mod_ok += run_of(p[4], reply, pos)
                ours_len += min(len(p[2]), 31)
                ours_ok += run_of(p[2][:31], reply, pos)
    print(f"\nPositions where ngram-mod drafts: {n_mod}; its drafts {mod_len} tokens, {mod_ok} right "
          f"({mod_ok / max(mod_len, 1):.0%}); our 31-token chain there {ours_len} tokens, {ours_ok} right.")
    print(f"Positions where our long-copy rule fires: {long_fire}; tokens right in its verify: {long_ok} "
          f"({long_ok / max(long_fire, 1):.1f} per firing).")


if __name__ == "__main__":
    main()
