"""Calibration of the acceptance model node by node, on real rounds of a fresh store.

The bench's calibration (expected over accepted draft tokens, over priced tree rounds) mixes two
things: whether each node's price q is right given its parent was accepted, and how an error
compounds down a chain (a 30-node copy priced at 0.955 a node expects 15 tokens, at 0.99 it
expects 26). This script runs one `adaspark` engine over a script on a fresh store (the
patched kernels active, as the CLI runs) and records every labelled candidate of every tree
round, the labels the acceptance model learns from, with the q of the estimate that priced the
round, and every tree round's expected and accepted draft tokens. It reports:

- per node: mean priced q against the share accepted, by proposal class (n-gram copies by the
  acceptance model's evidence bins, followers by count, drafter picks and siblings) and by
  quarter of the run (a fresh store's first replies price from few counts);
- per node, by depth in the tree (where nodes recorded one): a price a few points low at every
  depth compounds down a chain, so a long copy is priced at a fraction of what it accepts;
- per n-gram class: where a copy's price starts, the committed text's precision for the class
  (``SourcePrecision.for_class``: the index's first step, shrunk toward its bin) and the first
  step's own share right, beside the share of the class's chain nodes accepted: a price low
  because the class is shrunk toward rarer-right classes, or because a chain node is right more
  often than a first step of its class;
- per tree round: expected over accepted, by conversation in run order (the bench's rule:
  priced rounds of more than one row, measurement rounds left out).

With ``--scripted CURVE`` the rounds are a GPU's (``benchmarks/cost/scripted_target.py``): the
bundled model's real `ar` replies replayed, each forward at the curve's modeled time and
overlapped, so the trees are as wide as cheap rows make them (``benchmarks/speed/modeled_gpu.py``).

    python -m benchmarks.cold_start.node_calibration SCRIPT.jsonl [--model GGUF] [--drafter PATH]
        [--max-tokens 128] [--scripted 1:6.6,16:8.3,32:9.3,64:11.8] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from adaspark_app.bench.runner import CalibrationTally
from adaspark_app.learn.acceptance import EVIDENCE_EDGES, _bins
from adaspark_app.learn.kinds import NgramKind, NodeKind

DEPTH_BINS = (1, 2, 4, 8, 16)  # depth in the tree: 1, 2-3, 4-7, 8-15, 16+


def node_class(kind: int, ng_kind: int, evidence: int) -> str:
    """The report's class of a candidate: drafter pick or sibling, or an n-gram proposal's kind
    and evidence bin (copies by matched length, followers by count)."""
    if kind == NodeKind.PICK:
        return "drafter pick"
    if kind == NodeKind.SIBLING:
        return "drafter sibling"
    edges = EVIDENCE_EDGES
    i = int(_bins(np.array([evidence]), edges)[0])  # the acceptance model's own evidence bin
    lo, hi = int(edges[i]), (int(edges[i + 1]) - 1 if i + 1 < len(edges) else None)
    span = f"{lo}" if hi == lo else (f"{lo}+" if hi is None else f"{lo}-{hi}")
    return f"copy, matched {span}" if ng_kind == NgramKind.COPY else f"follower, count {span}"


def _row(items: list[dict], priced: str = "q") -> str:
    """nodes | mean price (``priced``: q, or the class precision) | share accepted | their ratio."""
    q = float(np.mean([n[priced] for n in items]))
    y = float(np.mean([n["y"] for n in items]))
    return f"{len(items)} | {q:.3f} | {y:.3f} | {q / y if y > 0 else float('nan'):.3f}"


def summarise(nodes: list[dict], rounds: list[dict]) -> str:
    """Markdown tables from recorded nodes ({"cls", "q", "y"}) and tree rounds ({"conversation",
    "expected", "accepted"}), both in run order."""
    out = ["## Per node: priced q against the share accepted (parent accepted)", "",
           "| class | nodes | mean q | accepted | q / accepted |", "|---|---|---|---|---|"]
    by_cls: dict[str, list[dict]] = defaultdict(list)
    for n in nodes:
        by_cls[n["cls"]].append(n)
    for cls in sorted(by_cls):
        out.append(f"| {cls} | {_row(by_cls[cls])} |")
    if nodes:
        out.append(f"| all | {_row(nodes)} |")
        out += ["", "| quarter of the run | nodes | mean q | accepted | q / accepted |", "|---|---|---|---|---|"]
        n = len(nodes)
        for k in range(4):
            part = nodes[k * n // 4:(k + 1) * n // 4]
            if part:
                out.append(f"| {k + 1} | {_row(part)} |")
    ng = [n for n in nodes if "prec" in n and n["cls"].startswith(("copy", "follower"))]
    if ng:
        out += ["", "## Per n-gram class: the class precision the price starts from, against the share accepted", "",
                "| class | nodes | class precision | accepted | class precision / accepted | first step right |",
                "|---|---|---|---|---|---|"]
        by_ng: dict[str, list[dict]] = defaultdict(list)
        for n in ng:
            by_ng[n["cls"]].append(n)
        for cls in sorted(by_ng):
            raw = [n["first"] for n in by_ng[cls] if n.get("first") is not None]
            first = f"{float(np.mean(raw)):.3f}" if raw else "-"
            out.append(f"| {cls} | {_row(by_ng[cls], 'prec')} | {first} |")
    deep = [n for n in nodes if "depth" in n]
    if deep:
        out += ["", "| depth | nodes | mean q | accepted | q / accepted |", "|---|---|---|---|---|"]
        by_depth: dict[int, list[dict]] = defaultdict(list)
        for n in deep:
            by_depth[min(int(n["depth"]), DEPTH_BINS[-1])].append(n)
        for lo, hi in zip(DEPTH_BINS, (*DEPTH_BINS[1:], None)):
            part = [n for d, ns in by_depth.items() if d >= lo and (hi is None or d < hi) for n in ns]
            if part:
                span = f"{lo}+" if hi is None else (f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}")
                out.append(f"| {span} | {_row(part)} |")
    out += ["", "## Per tree round: expected over accepted draft tokens, by conversation in run order", "",
            "| # | conversation | rounds | expected | accepted | expected / accepted |", "|---|---|---|---|---|---|"]
    order: list[str] = []
    by_conv: dict[str, list[dict]] = defaultdict(list)
    for r in rounds:
        if r["conversation"] not in by_conv:
            order.append(r["conversation"])
        by_conv[r["conversation"]].append(r)
    for i, c in enumerate(order):
        e = sum(r["expected"] for r in by_conv[c])
        a = sum(r["accepted"] for r in by_conv[c])
        out.append(f"| {i + 1} | {c} | {len(by_conv[c])} | {e:.1f} | {a} | {e / a if a else float('nan'):.3f} |")
    e = sum(r["expected"] for r in rounds)
    a = sum(r["accepted"] for r in rounds)
    out.append(f"| | all | {len(rounds)} | {e:.1f} | {a} | {e / a if a else float('nan'):.3f} |")
    return "\n".join(out) + "\n"


def record(engine: Any, convs: list, max_tokens: int, scripted: tuple[Any, list] | None = None
           ) -> tuple[list[dict], list[dict]]:
    """Run ``convs`` through ``engine`` (runner.run_conversation), recording labelled nodes through
    a wrapper on the decoder's acceptance model, and priced tree rounds from the engine's round
    events by the bench's rule (``CalibrationTally.counts``). ``scripted``: (a ScriptedTarget on
    the engine's backend, the conversations' reference replies), each turn expecting its reply."""
    from adaspark_app.runner import run_conversation
    from benchmarks.cost.scripted_target import replay_conversation

    acc = engine.decoder.learners.acceptance
    nodes: list[dict] = []
    rounds: list[dict] = []
    current = [""]
    acc_learn, acc_deferred = acc.learn, acc.deferred

    precision = engine.decoder.learners.precision

    def first_step_share(kind: int, evidence: int) -> float | None:
        """The share of the index's first steps of this class that were right, unshrunk (decayed
        counts), or None before one."""
        e = min(max(evidence, 0), precision.class_trials.shape[1] - 1)
        trials = float(precision.class_trials[kind, e])
        return float(precision.class_hits[kind, e]) / trials if trials > 0 else None

    def note(cands, context, p_src, labels) -> None:
        fit, head = acc.q_both(cands, context, p_src)  # what q() priced this round (cached)
        q = fit if acc.priced_by == "fitted" else head
        lab = np.asarray(labels)
        for j in np.flatnonzero(lab >= 0):
            kind, ng_kind, evidence = int(cands.kind[j]), int(cands.ng_kind[j]), int(cands.ng_evidence[j])
            node = {"cls": node_class(kind, ng_kind, evidence), "q": float(q[j]), "y": int(lab[j] == 1),
                    "conversation": current[0], "depth": int(cands.depth[j])}
            if kind == NodeKind.NGRAM:
                node.update(prec=float(cands.ng_prec[j]), first=first_step_share(ng_kind, evidence))
            nodes.append(node)

    def learn_nodes(cands, context, p_src, labels, priced=None):
        if priced is None:  # learnt at once (the CPU); a deferred round was noted when deferred
            note(cands, context, p_src, labels)
        return acc_learn(cands, context, p_src, labels, priced=priced)

    def deferred_nodes(cands, context, p_src, labels):
        # where the forward overlaps the host the round learns during the next forward, after the
        # next round's pricing: its own pricing is read now, as ``deferred`` keeps it (and the
        # labels made now, where the decoder leaves their making to the next forward too)
        labels = labels() if callable(labels) else labels
        note(cands, context, p_src, labels)
        return acc_deferred(cands, context, p_src, labels)

    def on_round(ev) -> None:
        if CalibrationTally.counts(ev):
            rounds.append({"conversation": current[0], "expected": float(ev.expected_accepted),
                           "accepted": int(ev.accepted)})

    acc.learn, acc.deferred = learn_nodes, deferred_nodes
    for i, conv in enumerate(convs):
        current[0] = conv.id
        if scripted is None:
            run_conversation(engine, conv, max_tokens, on_round=on_round)
        else:
            target, refs = scripted
            replay_conversation(engine, target, conv, refs[i], max_tokens, on_round=on_round)
        engine.reset_conversation()
    return nodes, rounds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("script")
    ap.add_argument("--model")
    ap.add_argument("--drafter")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--scripted", metavar="CURVE", default=None,
                    help="replay the bundled model's `ar` replies with each forward at CURVE (ROWS:MS,...), overlapped")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.scripted is not None and (args.model or args.drafter):
        sys.stderr.write("node_calibration: error: --scripted replays the bundled model's replies, without a drafter\n")
        return 2
    from adaspark_app import native

    native.activate()  # the patched kernels, as the CLI has them, before llama_cpp loads
    from adaspark_app.engine.chat_engine import ChatEngine
    from adaspark_app.errors import AdaSparkError
    from adaspark_app.runner import load_script
    from adaspark_app.store import Store
    from benchmarks.cost.scripted_target import ScriptedTarget, parse_curve, reference_replies

    try:
        curve = parse_curve(args.scripted) if args.scripted is not None else None
        convs = list(load_script(args.script))
        refs = reference_replies(convs, args.max_tokens) if curve is not None else None
        with tempfile.TemporaryDirectory(prefix="adaspark-calib-") as tmp, \
                Store.open(str(Path(tmp) / "fresh.db")) as store, \
                ChatEngine(args.model, args.drafter, store=store, arm="adaspark") as engine:
            scripted = (ScriptedTarget(engine.backend, curve, overlap=True), refs) if curve is not None else None
            nodes, rounds = record(engine, convs, args.max_tokens, scripted)
    except (AdaSparkError, ValueError) as err:  # a bad script, model, drafter or curve: one line, exit 2, as the CLI
        sys.stderr.write(f"node_calibration: error: {err}\n")
        return 2
    how = f", the forward replayed at {args.scripted} (rows:ms), overlapped" if curve is not None else ""
    text = (f"# Node calibration: `{args.script}`, model `{args.model or 'bundled'}`, "
            f"drafter `{args.drafter or 'none'}`, {args.max_tokens} tokens, fresh store{how}\n\n" + summarise(nodes, rounds))
    if args.out:
        Path(args.out).write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
