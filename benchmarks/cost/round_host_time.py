"""Host time per round on real rounds: what a round costs besides the target's forward.

It times whole rounds of the engine on a real script: for each round, wall time less the verify (llama_decode and the
argmax), so it includes the n-gram index, the candidate tree, the acceptance model, the
scheduler and the KV bookkeeping. Rounds are grouped by kind:

- ``plain``: a one-token step that built no tree (every `ar` round; `adaspark` rounds the draft
  gate skipped or with nothing to propose);
- ``tree, width 1``: `adaspark` built and priced a tree, then the chooser verified the anchor alone;
- ``tree, wider``: a drafted round.

Engines run interleaved per conversation in one process. With ``--no-reuse`` a third engine runs
`adaspark` with the acceptance model's learning recomputing the round's design and estimates
instead of reusing the pricing (`AcceptanceModel._as_priced`), i.e. the code before that reuse.

    python -m benchmarks.cost.round_host_time SCRIPT.jsonl [--limit 10] [--max-tokens 128] [--no-reuse] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np

from adaspark_app import native
from adaspark_app.engine.chat_engine import ChatEngine
from adaspark_app.learn.acceptance import _design
from adaspark_app.runner import load_script
from benchmarks.common import emit_report

KINDS = ("plain", "tree, width 1", "tree, wider")


def _engine(arm: str, reuse: bool = True) -> ChatEngine:
    eng = ChatEngine(None, arm=arm, n_ctx=4096, n_threads=2)
    if not reuse:
        acc = eng.decoder.learners.acceptance

        def recompute(cands, context, p_src):
            acc._priced = None
            d = _design(cands, context, p_src)
            return d, acc._fitted(d, len(cands)), acc._head(d)

        acc._as_priced = recompute
    return eng


def _instrument(eng: ChatEngine, rec: dict[str, list[tuple[float, float]]]) -> None:
    dec = eng.decoder
    orig = dec.round

    def timed(budget=None):
        t0 = time.perf_counter()
        oc = orig(budget=budget)
        wall = time.perf_counter() - t0
        kind = "plain" if oc.priced_by == "none" else (
            "tree, width 1" if oc.width == 1 else "tree, wider")
        rec[kind].append((wall - oc.verify_s, wall))
        return oc

    dec.round = timed


def main() -> None:
    native.activate()  # the Q4_1 kernels, if built, before anything imports llama_cpp
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("script")
    ap.add_argument("--limit", type=int, default=10, help="conversations (first N)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--no-reuse", action="store_true", help="add an engine without the pricing reuse")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    arms = {"ar": _engine("ar"), "adaspark": _engine("adaspark")}
    if a.no_reuse:
        arms["adaspark, no reuse"] = _engine("adaspark", reuse=False)
    recs = {name: {k: [] for k in KINDS} for name in arms}
    for name, eng in arms.items():
        _instrument(eng, recs[name])
    names = list(arms)
    convs = list(load_script(a.script))[: a.limit]
    for i, c in enumerate(convs):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            eng, msgs = arms[name], []
            for t, u in enumerate(c.turns):
                msgs.append({"role": "user", "content": u})
                r = eng.generate(c.id, msgs, max_tokens=a.max_tokens, turn=t)
                msgs.append({"role": "assistant", "content": r.text})
            eng.reset_conversation()
        print(f"{i + 1}/{len(convs)} {c.id}", flush=True)
    for eng in arms.values():
        eng.close()
    cmd = f"python -m benchmarks.cost.round_host_time {a.script} --limit {a.limit} --max-tokens {a.max_tokens}"
    cmd += " --no-reuse" if a.no_reuse else ""
    lines = [f"# Host time per round on `{a.script}` (first {len(convs)} conversations, {a.max_tokens} tokens)", "",
             f"`{cmd}`", "",
             f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}. "
             "Host time = round wall time less the verify (llama_decode + argmax).", "",
             "| engine | round kind | rounds | median host us | mean host us | host share of the engine's round time |",
             "|---|---|---|---|---|---|"]
    for name in names:
        total_wall = sum(w for k in KINDS for _, w in recs[name][k])
        for k in KINDS:
            xs = recs[name][k]
            if not xs:
                continue
            host = np.array([h for h, _ in xs]) * 1e6
            lines.append(f"| {name} | {k} | {len(xs)} | {np.median(host):.0f} | {host.mean():.0f} | "
                         f"{host.sum() / 1e6 / total_wall:.2%} |")
        all_host = sum(h for k in KINDS for h, _ in recs[name][k])
        lines.append(f"| {name} | all | {sum(len(recs[name][k]) for k in KINDS)} | | | {all_host / total_wall:.2%} |")
    emit_report(lines, a.out)


if __name__ == "__main__":
    main()
