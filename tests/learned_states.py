"""Learned states made by exercising the learners on seeded synthetic data (no model).

``exercise(seed)`` runs the width scheduler through the round simulator (``learn_sim``), with
draft and drafter gates over several context bands and probe classes, the acceptance model over
synthetic candidate trees, and the n-gram precision over a text that repeats itself. It uses only
calls that commit b9fbe7f has too, so the same file, run against that commit's tree, wrote
``tests/data/learned_state_b9fbe7f.json.gz`` (the previous layout; see tests/data/README.md)::

    git archive b9fbe7f | tar -x -C /tmp/old && cp tests/learned_states.py /tmp/old/tests/
    ADASPARK_STOCK_KERNELS=1 PYTHONPATH=/tmp/old python3 /tmp/old/tests/learned_states.py \\
        | gzip -9 -n > tests/data/learned_state_b9fbe7f.json.gz
    ADASPARK_STOCK_KERNELS=1 PYTHONPATH=/tmp/old python3 /tmp/old/tests/learned_states.py views \\
        | gzip -9 -n > tests/data/learned_state_b9fbe7f.views.json.gz

``views`` is what the learners compute from that state (prices, gains, gates, coefficients,
precision), so a migrated state can be checked against what b9fbe7f itself computed from it.
"""

from __future__ import annotations

import functools
import json
import sys

import numpy as np
from benchmarks.sim.learn_sim import Acceptance, Machine, accepted_flags, build_tree, cpu_linear, s_arrays, simulate

from adaspark_app.engine.ngram import NgramIndex
from adaspark_app.learn.acceptance import KIND_NGRAM, KIND_PICK, KIND_SIBLING, AcceptanceModel, CandidateSet

try:
    from adaspark_app.learn.precision import SourcePrecision
except ImportError:  # b9fbe7f kept it in the n-gram module
    from adaspark_app.engine.ngram import SourcePrecision  # type: ignore[no-redef]

REQUESTS = [(300, 60), (900, 60), (2500, 40)]  # (start context, rounds): three context bands


def candidate_round(rng: np.random.Generator) -> CandidateSet:
    """A drafter chain of 4 picks with 3 siblings each, and an n-gram chain from the anchor on
    every other round (copies and followers, some agreeing with the pick)."""
    cols: dict[str, list] = {k: [] for k in ("parent", "kind", "token", "depth", "h", "sigma", "r", "ng_kind",
                                              "ng_evidence", "ng_above", "agreed", "contra_evidence", "contra_kind")}

    def add(parent: int, kind: int, depth: int, **kw) -> int:
        row = dict(h=np.nan, sigma=np.nan, r=np.nan, ng_kind=0, ng_evidence=0, ng_above=0, agreed=False,
                   contra_evidence=-1, contra_kind=0)
        row.update(kw, parent=parent, kind=kind, token=len(cols["parent"]), depth=depth)
        for k in cols:
            cols[k].append(row[k])
        return len(cols["parent"]) - 1

    parent = -1
    for d in range(1, 5):
        h, sg = float(rng.uniform(0.1, 0.9)), float(rng.uniform(0.2, 0.9))
        agreed = bool(rng.random() < 0.3)
        extra = dict(agreed=True, ng_kind=1, ng_evidence=int(rng.integers(4, 33))) if agreed else {}
        pick = add(parent, KIND_PICK, d, h=h, sigma=sg, **extra)
        for r in (0.6, 0.3, 0.1):
            add(parent, KIND_SIBLING, d, h=h, sigma=sg, r=r)
        parent = pick
    if rng.random() < 0.5:
        kind, ev = int(rng.integers(1, 3)), int(rng.integers(1, 33))
        p = -1
        for i in range(int(rng.integers(1, 6))):
            p = add(p, KIND_NGRAM, 1 + i, ng_kind=kind, ng_evidence=min(ev + i, 32), ng_above=i)
    return CandidateSet(**{k: np.array(v) for k, v in cols.items()})


def labels_for(rng: np.random.Generator, c: CandidateSet, q: np.ndarray) -> np.ndarray:
    """Walk one accepted path (each parent's children drawn by q, the rest of the mass: none) and
    label every child of every accepted parent."""
    labels = np.full(len(c), -1, dtype=np.int64)
    node = -1
    while True:
        kids = np.flatnonzero(c.parent == node)
        if kids.size == 0:
            return labels
        labels[kids] = 0
        u, acc, nxt = rng.random(), 0.0, None
        for k in kids:
            acc += 0.8 * float(q[k])  # the target accepts a little less than priced: a gate opens
            if u < acc:
                nxt = int(k)
                break
        if nxt is None:
            return labels
        labels[nxt] = 1
        node = nxt


def exercise(seed: int = 0):
    """(scheduler, acceptance model, precision) after a few hundred synthetic rounds."""
    rng = np.random.default_rng(seed)
    sched = simulate(Machine(cpu_linear), Acceptance(pick=0.7, ngram_share=0.3), REQUESTS, rng=rng).scheduler
    for ctx in (300, 900, 2500):  # draft and drafter gates of several bands and probe classes
        for probe in (0, 1, 3):
            for _ in range(12):
                if sched.wants_draft(ctx, probe):
                    with_drafter = sched.wants_drafter(ctx, probe)
                    sched.observe_drafter(ctx, probe, with_drafter, int(rng.integers(1, 5)),
                                          float(rng.uniform(0.01, 0.05)))
    acc = AcceptanceModel()
    for req in range(3):
        acc.begin_request()
        for _ in range(60):
            c = candidate_round(rng)
            q, _ = acc.q(c, int(rng.integers(100, 3000)), 0.6)
            acc.learn(c, 1000 + req, 0.6, labels_for(rng, c, q))
    precision = SourcePrecision()
    passage = [int(t) for t in rng.integers(100, 400, 80)]
    NgramIndex([]).extend(passage + passage[:50] + passage[10:60], precision)
    return sched, acc, precision


@functools.lru_cache(maxsize=None)
def _state_text(seed: int) -> str:
    sched, acc, precision = exercise(seed)
    return json.dumps({"scheduler": sched.state_dict(), "acceptance": acc.state_dict(),
                       "precision": precision.state_dict()})


def learned_state(seed: int = 0) -> dict:
    """The engine's learned state (``Decoder.state_dict``'s layout) after ``exercise(seed)``, as
    JSON data (a new copy each call; made once per seed)."""
    return json.loads(_state_text(seed))


VIEW_CONTEXTS = (100, 300, 900, 2500, 6000)


def reloaded(*learners):
    """Fresh learners of the same classes loaded from these learners' state (through JSON)."""
    out = []
    for x in learners:
        y = type(x)()
        y.load_state(json.loads(json.dumps(x.state_dict())))
        out.append(y)
    return out


def views(sched, acc, precision) -> dict:
    """What the learners compute from their state, through calls b9fbe7f has too: a state
    migrated from b9fbe7f must compute exactly what it computed there."""
    return {
        "prices": [[c, sorted([int(w), float(t)] for w, t in sched.price_table(c).items())] for c in VIEW_CONTEXTS],
        "cold_start": list(sched.cold_start_progress()),
        "gains": [[c, list(sched.gains.at(c))] for c in VIEW_CONTEXTS],
        "rates": [[c, sched.rate.rate(c), sched.rate.achieved(c)] for c in VIEW_CONTEXTS],
        "incumbent": sched.chooser.incumbent,
        "draft_gates": [[b, p, g.adv, g.cost, g.rounds, g.skip_left, g.backoff] for (b, p), g in sorted(sched.gates.items())],
        "drafter_gates": [[b, p, g.mean(False), g.mean(True), g.drafter_wins(), g.skip_left]
                          for (b, p), g in sorted(sched.drafter_gates.items())],
        "coefficients": sorted(acc.coefficients().items()),
        "priced_by": acc.priced_by,
        "guard": list(acc.guard_losses()),
        "precision": [precision.value,
                      [float(x) for x in precision.for_class(np.array([0, 1, 1, 2, 2]), np.array([0, 4, 32, 1, 9]))]],
    }


def run_round(sched, acc, precision, rng: np.random.Generator) -> None:
    """A few synthetic rounds through every learner's round-time calls, at three contexts and
    random probe classes; raises on any failure and checks what comes out is usable."""
    # every stored gate is used: a round at a context of its band, with its probe class
    keys = sorted(set(sched.gates) | set(sched.drafter_gates)) + [(1, 0), (9, 2), (13, 5)]
    for band, probe in keys * 2:
        ctx = 2 ** (band - 1) if band > 0 else 0
        if sched.wants_draft(ctx, probe):
            with_drafter = sched.wants_drafter(ctx, probe)
            tree = build_tree(rng, Acceptance(ngram_share=0.5), max_nodes=63)
            s_d, s_n = s_arrays(tree)
            plan = sched.plan(ctx, s_d, s_n, 0.003)
            assert plan.width >= 1 and all(np.isfinite(t) and t > 0 for t in plan.offered.values()), plan
            w = min(plan.width, len(tree.Q_pred) + 1)
            flags = accepted_flags(tree, w)
            sched.observe(plan, ctx, 0.01 * w, 0.003, int(flags.sum()) + 1, False, tree.Q_pred[: w - 1],
                          tree.src[: w - 1], flags)
            sched.observe_drafter(ctx, probe, with_drafter, int(flags.sum()) + 1, 0.02)
        else:
            sched.observe_plain(ctx, 0.01, False)
    sched.end_request()
    assert all(np.isfinite(g) for g in sched.gains.at(1000))
    c = candidate_round(rng)
    q, _ = acc.q(c, 1000, precision.value)
    assert np.all(np.isfinite(q)) and np.all((q >= 0.0) & (q <= 1.0)), q
    acc.learn(c, 1000, precision.value, labels_for(rng, c, q))
    acc.begin_request()
    p = precision.for_class(np.array([0, 1, 2, 1]), np.array([0, 4, 3, 40]))
    assert np.all(np.isfinite(p)) and 0.0 <= precision.value <= 1.0
    NgramIndex([]).extend([5, 6, 7, 5, 6, 7, 5, 6], precision)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "state"
    doc = learned_state(0) if what == "state" else views(*reloaded(*exercise(0)))
    sys.stdout.write(json.dumps(doc, sort_keys=True, indent=1) + "\n")
