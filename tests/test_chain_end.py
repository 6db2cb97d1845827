"""The chain-end credit (``WidthScheduler._credit_chain_end``): a tree that is one n-gram chain
nothing continues is verified whole where the round the rest would need costs more than the rows.

Pure parts: the candidates built from a real n-gram index, the decoder's price step and the
scheduler's plan on a GPU-like price table. The engine on the bundled model is checked by the
speed benchmarks (``benchmarks/speed/modeled_gpu.py``), which compare the two rules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from adaspark_app.engine.candidates import Sources, tree_candidates
from adaspark_app.engine.ngram import NgramStep
from adaspark_app.engine.proposers import NgramSource
from adaspark_app.engine.tree import KIND_NGRAM, Candidates
from adaspark_app.learn.chooser import WidthChooser
from adaspark_app.learn.constants import BAND_MIN_ROUNDS, NGRAM_MAX_DEPTH
from adaspark_app.learn.kinds import NgramKind
from adaspark_app.learn.precision import SourcePrecision
from adaspark_app.learn.scheduler import WidthScheduler

STOP = 0  # the control token no chain proposes


def _source(text: list[int]) -> Sources:
    src = NgramSource(lambda t: t == STOP, SourcePrecision())
    src.begin(text)
    return Sources(src)


def test_a_chain_that_stops_by_itself_marks_the_rows_that_verify_it_whole():
    passage = list(range(100, 112))  # 12 tokens, then the stop token: the passage ends there
    text = [5, 6] + passage + [STOP] + [7, 8] + passage[:5]
    cands = tree_candidates(_source(text), False, text[-1], len(text) - 1)
    # the copy reads on from passage[5] to the passage's end: 7 tokens, and nothing after the stop
    assert cands.token == passage[5:] and cands.chain_only
    assert cands.chain_end == len(passage[5:]) + 1


def test_a_chain_cut_at_the_depth_asked_for_has_no_end():
    passage = list(range(100, 100 + NGRAM_MAX_DEPTH + 20))  # runs on past the chain's depth
    text = passage + [7, 8] + passage[:6]
    cands = tree_candidates(_source(text), False, text[-1], len(text) - 1)
    assert len(cands) == NGRAM_MAX_DEPTH and cands.chain_only
    assert cands.chain_end == 0


# A GPU-like price table (seconds): a 32-row verify costs 1.4 one-row steps.
_GPU_PRICES = {1: 6.6e-3, 2: 6.7e-3, 4: 6.95e-3, 8: 7.4e-3, 16: 8.3e-3, 32: 9.3e-3}
_D = 0.5e-3


def _scheduler(monkeypatch, credit: bool = True) -> WidthScheduler:
    """A scheduler whose prices are the table above (as the cost model offers them: up to the
    limit) and whose band rate is the plain step's."""
    sched = WidthScheduler()
    sched.credits_chain_end = credit
    monkeypatch.setattr(sched.cost, "prices", lambda context, limit=None, bounds=False: {
        w: t for w, t in _GPU_PRICES.items() if limit is None or w <= limit})
    monkeypatch.setattr(sched.cost, "next_measurement", lambda available: None)
    for _ in range(BAND_MIN_ROUNDS):
        sched.rate.observe(300, 1.0, _GPU_PRICES[1], _GPU_PRICES[1])
    return sched


def _chain(nodes: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """(s_drafter, s_ngram) of a chain of `nodes` n-gram nodes, each right with q given its parent."""
    s = np.concatenate([[0.0, 0.0], np.cumsum(np.cumprod(np.full(nodes, q)))])
    return np.zeros_like(s), s


def test_a_chain_that_ends_inside_a_class_is_verified_whole(monkeypatch):
    """20 nodes, each right with 0.95 given its parent: the widest class inside the tree is 16 rows,
    the best rate of the widths inside it. Stopped there, the chain's last 4 nodes and the token after it need a
    round of their own (D + T(8)) when the 16th node is accepted (Q = 0.44), so the 32-row class,
    which verifies the chain's 21 rows, scores higher. Without an end (the chain continues past
    the tree, or the rule off) the round takes 16 rows."""
    s_d, s_n = _chain(20, 0.95)
    e = lambda n: WidthChooser.expected_tokens(n, s_d, s_n, (1.0, 1.0, 1.0, 1.0))
    # the round's own best rate, the 32-row class's offered too (an n-gram tree beats the band)
    rho = max(e(n) / (_D + t) for n, t in _GPU_PRICES.items())
    whole = e(21) - rho * (_D + _GPU_PRICES[32])
    q16 = e(17) - e(16)
    stopped = e(21) - rho * q16 * (_D + _GPU_PRICES[8]) - rho * (_D + _GPU_PRICES[16])
    assert whole - stopped > 0.04 * e(16)  # beyond the chooser's margin: a real case of the rule

    for ends_at, credit, want in ((0, True, 16), (21, False, 16), (21, True, 32)):
        sched = _scheduler(monkeypatch, credit)
        sched.plan(300, s_d, s_n, _D, may_measure=False)  # the incumbent: 16, the widest offered
        plan = sched.plan(300, s_d, s_n, _D, may_measure=False, ends_at=ends_at)
        assert plan.width == want, (ends_at, credit, plan.values)
        assert (32 in plan.offered) == (want == 32)
        if want == 32:  # the trace's V(n) are the scores the rule compared
            assert plan.values[32] == pytest.approx(whole) and plan.values[16] == pytest.approx(stopped)


def test_a_chain_that_is_seldom_right_to_its_end_is_not_verified_whole(monkeypatch):
    """The same 20 nodes right with 0.6 given their parents: the 16th is accepted with Q = 0.0003,
    so the round a narrow width leaves almost never happens and the credit changes nothing."""
    s_d, s_n = _chain(20, 0.6)
    sched = _scheduler(monkeypatch)
    without = _scheduler(monkeypatch, credit=False)
    for sch in (sched, without):
        sch.plan(300, s_d, s_n, _D, may_measure=False)
    a = sched.plan(300, s_d, s_n, _D, may_measure=False, ends_at=21)
    b = without.plan(300, s_d, s_n, _D, may_measure=False, ends_at=21)
    assert a.width == b.width < 16


def test_an_end_that_is_not_the_trees_whole_width_is_ignored(monkeypatch):
    """``ends_at`` applies where it is the tree's whole width; any other value is ignored."""
    s_d, s_n = _chain(20, 0.95)
    sched = _scheduler(monkeypatch)
    sched.plan(300, s_d, s_n, _D, may_measure=False)
    plan = sched.plan(300, s_d, s_n, _D, may_measure=False, ends_at=12)  # not the tree's 21 rows
    assert plan.width == 16 and 32 not in plan.offered


def test_the_tree_ends_where_the_chain_or_the_reply_does():
    from adaspark_app.engine.tree import chain_ends_at

    passage = list(range(100, 112))
    text = [5, 6] + passage + [STOP] + [7, 8] + passage[:5]
    ended = tree_candidates(_source(text), False, text[-1], len(text) - 1)  # 7 nodes, then nothing
    long = list(range(100, 100 + NGRAM_MAX_DEPTH + 20))
    text2 = long + [7, 8] + long[:6]
    running = tree_candidates(_source(text2), False, text2[-1], len(text2) - 1)  # 32 nodes, going on
    assert chain_ends_at(ended, None) == 8 and chain_ends_at(ended, 100) == 8
    assert chain_ends_at(ended, 5) == 5  # the reply's last 5 tokens: 4 nodes and the bonus
    assert chain_ends_at(running, None) == 0 and chain_ends_at(running, 100) == 0
    assert chain_ends_at(running, 20) == 20 and chain_ends_at(running, 33) == 33
    assert chain_ends_at(running, 1) == 0  # a budget of one token is a plain step's
    running.chain_only = False  # a drafter's tree: the rule does not apply
    assert chain_ends_at(running, 20) == 0


def test_the_anchors_chain_is_the_tree_that_adding_its_steps_one_by_one_gives():
    """``add_root_chain`` (the anchor's chain in one go) against ``Candidates.add`` step by step:
    every column and the child map, on a copy that runs into followers, backoff guesses included."""
    text = [5, 6, 9, 1, 2, 7, 5, 6, 9, 8, 3, 5, 6, 9, 8, 4, 2, 7]  # a backoff guess, a follower, then a copy of itself
    src = _source(text).ngram
    steps = src.draft([], NGRAM_MAX_DEPTH)
    assert {NgramKind.COPY, NgramKind.FOLLOWER} <= {st.kind for st in steps} and len(steps) == NGRAM_MAX_DEPTH
    one_by_one = Candidates()
    par = -1
    for st in steps:
        par = one_by_one.add(par, st.token, KIND_NGRAM, ng_kind=int(st.kind), ng_evidence=st.evidence)
    built = tree_candidates(Sources(src), False, text[-1], len(text) - 1)
    columns = [f.name for f in dataclasses.fields(Candidates) if f.name not in ("chain_only", "chain_end")]
    for name in columns:
        assert repr(getattr(built, name)) == repr(getattr(one_by_one, name)), name
    mixed = [NgramStep(3, NgramKind.COPY, 4), NgramStep(9, NgramKind.FOLLOWER, 2), NgramStep(3, NgramKind.FOLLOWER, 0)]
    a, b = Candidates(), Candidates()
    a.add_root_chain(mixed)
    par = -1
    for st in mixed:
        par = b.add(par, st.token, KIND_NGRAM, ng_kind=int(st.kind), ng_evidence=st.evidence)
    for name in columns:
        assert repr(getattr(a, name)) == repr(getattr(b, name)), name
