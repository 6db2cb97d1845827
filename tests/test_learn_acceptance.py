"""The acceptance model of §3.3 (Eq. (6)) on synthetic rounds with known true probabilities.

The generator builds DSpark-shaped candidate trees (a spine of picks, K-1 siblings per position,
n-gram chains from the anchor and from picks, agreed and contradicted drafter candidates) with
features drawn at random, and draws each round's accepted path from a known true model of the
Eq. (6) family. The true model is written here independently of the module under test (its own
scores, buckets and softmax), so a wrong feature or bucket in the module shows up as a fit that
cannot reach the truth.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from adaspark_app.learn.acceptance import (
    KIND_NGRAM,
    KIND_PICK,
    KIND_SIBLING,
    AcceptanceModel,
    CandidateSet,
    ngram_bucket,
)
from adaspark_app.learn.constants import EXPLORATION_PERIOD, PRIOR_GATE, REQ_INTERCEPT_BAND

K = 8  # candidates per drafter position (pick + 7 siblings)
B = 7  # drafter block


# --------------------------------------------------------------------------------------------
# synthetic rounds
# --------------------------------------------------------------------------------------------
def _pow2_bin(v: np.ndarray, edges: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(np.shape(v), dtype=np.int64)
    for i, e in enumerate(edges):
        out = np.where(np.asarray(v) >= e, i, out)
    return out


EV_EDGES = (1, 2, 4, 8, 16, 32)
ABOVE_EDGES = (0, 1, 2, 4, 8, 16)


def _logit(p):
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


class TrueModel:
    """A known member of the Eq. (6) family; its q are the probabilities labels are drawn from.

    The defaults make the confidence head over-confident (a1 < 1) and the share informative
    (a2 > 0), so the head-based estimate is miscalibrated while the fitted model can match.
    ``ngram_w`` overrides the n-gram bucket weight as a function (kind, evidence bin, above bin).
    """

    def __init__(self, a=(0.3, 0.6, 0.9, -0.6, 0.9, 0.2, -0.2), ctx_d=-0.15, ctx_n=0.2, depth=-0.05,
                 ngram_copy=(-1.0, 0.3, -0.1), ngram_follower=(-1.4, 0.25), agreed=(0.8, 0.4),
                 contra_pick=(-0.2, -0.15), contra_sib=-0.4, ngram_w=None):
        self.a = a
        self.ctx_d, self.ctx_n, self.depth = ctx_d, ctx_n, depth
        self.ngram_copy, self.ngram_follower = ngram_copy, ngram_follower
        self.agreed, self.contra_pick, self.contra_sib = agreed, contra_pick, contra_sib
        self.ngram_w = ngram_w
        self._cache: dict[int, tuple] = {}

    def _static(self, c: CandidateSet) -> tuple:
        """The part of every score that does not depend on context, p_src or b_req (cached)."""
        hit = self._cache.get(id(c))
        if hit is not None and hit[0] is c:
            return hit[1]
        a = self.a
        lh = np.where(np.isnan(c.h), 0.0, _logit(np.nan_to_num(c.h, nan=0.5)))
        ls = np.where(np.isnan(c.sigma), 0.0, _logit(np.nan_to_num(c.sigma, nan=0.5)))
        lr = np.log(np.nan_to_num(c.r, nan=1.0))
        pick = c.kind == KIND_PICK
        ng = c.kind == KIND_NGRAM
        ev = _pow2_bin(c.ng_evidence, EV_EDGES)
        above = _pow2_bin(c.ng_above, ABOVE_EDGES)
        if self.ngram_w is not None:
            w_ng = np.array([self.ngram_w(k, e, b) for k, e, b in zip(c.ng_kind, ev, above)], dtype=float)
        else:
            w_ng = np.where(c.ng_kind == 1, self.ngram_copy[0] + self.ngram_copy[1] * ev + self.ngram_copy[2] * above,
                            self.ngram_follower[0] + self.ngram_follower[1] * ev)
        s_draft = np.where(pick, a[0] + a[1] * lh + a[2] * ls, a[3] + a[4] * lr + a[5] * lh + a[6] * ls)
        s_draft = s_draft + self.depth * (c.depth - 1)
        agreed = ~ng & c.agreed
        contra = ~ng & ~c.agreed & (c.contra_evidence >= 0)
        cev = _pow2_bin(c.contra_evidence, EV_EDGES)
        s_draft = s_draft + np.where(agreed, np.where(pick, self.agreed[0], self.agreed[1]), 0.0)
        s_draft = s_draft + np.where(contra, np.where(pick, self.contra_pick[0] + self.contra_pick[1] * cev,
                                                      self.contra_sib), 0.0)
        static = (np.where(ng, w_ng, s_draft), ng, agreed.astype(float) - contra.astype(float))
        self._cache[id(c)] = (c, static)
        return static

    def q(self, c: CandidateSet, context: int, p_src: float, b_req: float = 0.0) -> np.ndarray:
        static, ng, cross = self._static(c)
        x = math.log2(1 + context / 1024) - 1.0
        lp = float(_logit(p_src))
        s = static + np.where(ng, lp + self.ctx_n * x, self.ctx_d * x) + cross * max(0.0, lp) + b_req
        e = np.exp(s)
        denom = np.ones(len(c) + 1)
        np.add.at(denom, c.parent + 1, e)
        return e / denom[c.parent + 1]


def make_round(rng: np.random.Generator, p_ngram: float = 0.6, max_chain: int = 10,
               ngram_only: bool = False, no_head: bool = False, siblings: bool = True) -> CandidateSet:
    """One round's candidate tree, DSpark-shaped (§2.2) with n-gram chains (§3.3)."""
    cols: dict[str, list] = {k: [] for k in ("parent", "kind", "token", "depth", "h", "sigma", "r", "ng_kind",
                                              "ng_evidence", "ng_above", "agreed", "contra_evidence", "contra_kind")}

    def add(parent, kind, depth, h=np.nan, sigma=np.nan, r=np.nan, ng_kind=0, ng_evidence=0, ng_above=0,
            agreed=False, contra_evidence=-1, contra_kind=0) -> int:
        for k, v in (("parent", parent), ("kind", kind), ("token", len(cols["parent"])), ("depth", depth),
                     ("h", h), ("sigma", sigma), ("r", r), ("ng_kind", ng_kind), ("ng_evidence", ng_evidence),
                     ("ng_above", ng_above), ("agreed", agreed), ("contra_evidence", contra_evidence),
                     ("contra_kind", contra_kind)):
            cols[k].append(v)
        return len(cols["parent"]) - 1

    def proposal():
        kind = int(rng.integers(1, 3))
        ev = int(rng.integers(4, 33)) if kind == 1 else int(rng.integers(1, 20))
        return kind, ev

    def chain(parent, depth, kind, ev):
        for i in range(int(rng.integers(1, max_chain + 1))):
            parent = add(parent, KIND_NGRAM, depth + i, ng_kind=kind, ng_evidence=min(ev + i, 32) if kind == 1 else ev,
                         ng_above=i)

    if ngram_only:
        chain(-1, 1, *proposal())
    else:
        parent = -1
        for d in range(1, B + 1):
            h = np.nan if no_head else float(rng.uniform(0.05, 0.95))
            sg = float(rng.beta(2.0, 1.5))
            r = np.maximum(rng.dirichlet(np.full(K - 1, 0.5)), 1e-6)
            r = r / r.sum()
            prop, where = None, None
            if rng.random() < p_ngram:
                prop = proposal()
                u = rng.random()
                where = "pick" if u < 0.5 else ("sib" if u < 0.6 else "new")
            agree_sib = int(rng.integers(K - 1)) if where == "sib" else -1

            def cross(is_agreed):
                if prop is None:
                    return {}
                if is_agreed:
                    return dict(agreed=True, ng_kind=prop[0], ng_evidence=prop[1])
                return dict(contra_evidence=prop[1], contra_kind=prop[0])

            pick = add(parent, KIND_PICK, d, h=h, sigma=sg, **cross(where == "pick"))
            for k in range(K - 1 if siblings else 0):
                add(parent, KIND_SIBLING, d, h=h, sigma=sg, r=float(r[k]), **cross(k == agree_sib))
            if where == "new":
                chain(parent, d, *prop)
            parent = pick
    return CandidateSet(**{k: np.array(v) for k, v in cols.items()})


def sample_labels(rng: np.random.Generator, c: CandidateSet, q: np.ndarray) -> np.ndarray:
    """Draw the accepted path from the true q (§2.2) and label every child of every accepted
    parent, placed or not: 1 if it was the target's argmax at its parent's row."""
    labels = np.full(len(c), -1)
    parent = -1
    while True:
        ch = np.flatnonzero(c.parent == parent)
        if ch.size == 0:
            break
        labels[ch] = 0
        k = int(np.searchsorted(np.cumsum(q[ch]), rng.random(), side="right"))
        if k >= ch.size:  # "none": the target's argmax was none of them
            break
        labels[ch[k]] = 1
        parent = int(ch[k])
    return labels


def _log_loss(q: np.ndarray, y: np.ndarray) -> float:
    q = np.clip(q, 1e-7, 1 - 1e-7)
    return float(-(y * np.log(q) + (1 - y) * np.log1p(-q)).sum())


def simulate(model: AcceptanceModel, truth: TrueModel, rng: np.random.Generator, requests: int,
             rounds_per_request: int, score_from: int, pool: list[CandidateSet] | None = None,
             **round_kw) -> dict[str, float]:
    """Serve ``requests`` synthetic requests; from request ``score_from`` on, score the fitted,
    head-based and true q on each round's labels before the model learns from them."""
    st = dict(fit=0.0, head=0.0, true=0.0, sum_q=0.0, sum_y=0.0, nodes=0, fitted_rounds=0, rounds=0)
    for req in range(requests):
        model.begin_request()
        b_true = float(rng.normal(0.0, 0.2))
        p_src = float(rng.uniform(0.3, 0.8))
        context = int(rng.integers(100, 4000))
        for _ in range(rounds_per_request):
            c = pool[int(rng.integers(len(pool)))] if pool else make_round(rng, **round_kw)
            qt = truth.q(c, context, p_src, b_true)
            labels = sample_labels(rng, c, qt)
            if req >= score_from:
                qf, qh = model.q_both(c, context, p_src)
                lab = labels >= 0
                y = (labels[lab] == 1).astype(float)
                st["fit"] += _log_loss(qf[lab], y)
                st["head"] += _log_loss(qh[lab], y)
                st["true"] += _log_loss(qt[lab], y)
                st["sum_q"] += float(qf[lab].sum())
                st["sum_y"] += float(y.sum())
                st["nodes"] += int(lab.sum())
                st["rounds"] += 1
                st["fitted_rounds"] += model.priced_by == "fitted"
            model.learn(c, context, p_src, labels)
            context += int(rng.integers(2, 9))
    return st


@pytest.fixture(scope="module")
def pool() -> list[CandidateSet]:
    rng = np.random.default_rng(7)
    return [make_round(rng) for _ in range(1500)]


@pytest.fixture(scope="module")
def trained(pool) -> tuple[AcceptanceModel, dict[str, float]]:
    """A model served 30 requests of 250 rounds from the prior, scored on the last 8 (each round
    before learning from it)."""
    model = AcceptanceModel()
    st = simulate(model, TrueModel(), np.random.default_rng(11), requests=30, rounds_per_request=250,
                  score_from=22, pool=pool)
    return model, st


_ABSENT = dict(parent=-1, kind=0, depth=1, h=np.nan, sigma=np.nan, r=np.nan, ng_kind=0, ng_evidence=0, ng_above=0,
               agreed=False, contra_evidence=-1, contra_kind=0)


def _round_with(pick_kw: dict | None = None, ngram_node: dict | None = None, h=0.6, sigma=0.6) -> CandidateSet:
    """Anchor -> one pick and 7 siblings (shares summing to 1), optionally an n-gram node."""
    r = np.array([0.4, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03])
    rows = [dict(parent=-1, kind=KIND_PICK, depth=1, h=h, sigma=sigma, r=np.nan, **(pick_kw or {}))]
    rows += [dict(parent=-1, kind=KIND_SIBLING, depth=1, h=h, sigma=sigma, r=float(x)) for x in r]
    if ngram_node is not None:
        rows.append(dict(parent=-1, kind=KIND_NGRAM, depth=1, h=np.nan, sigma=np.nan, r=np.nan, **ngram_node))
    keys = sorted({k for row in rows for k in row})
    cols = {k: [row.get(k, _ABSENT[k]) for row in rows] for k in keys}
    cols["token"] = list(range(len(rows)))
    return CandidateSet(**{k: np.array(v) for k, v in cols.items()})


def _ngram_chain(evidence: tuple[int, ...], kind: int = 1) -> CandidateSet:
    """An n-gram-only tree: one chain from the anchor (no drafter)."""
    n = len(evidence)
    return CandidateSet(parent=np.arange(n) - 1, kind=np.full(n, KIND_NGRAM), token=np.arange(n),
                        depth=np.arange(1, n + 1), ng_kind=np.full(n, kind), ng_evidence=np.array(evidence),
                        ng_above=np.arange(n))


# --------------------------------------------------------------------------------------------
# the prior and the gate
# --------------------------------------------------------------------------------------------
def test_prior_prices_pick_at_its_head_and_lone_ngram_at_p_src():
    """Guards the prior derived from the features' definitions (pick ln2 + logit h, sibling
    log r, buckets 0): an empty model prices a pick at h, splits 1 - h evenly between the
    siblings (by share) and none, and prices a lone n-gram node at p_src."""
    model = AcceptanceModel()
    c = _round_with(h=0.7)
    qf, _ = model.q_both(c, context=500, p_src=0.6)
    assert qf[0] == pytest.approx(0.7, abs=1e-9)
    r = c.r[1:]
    np.testing.assert_allclose(qf[1:], r * 0.3 / 2, atol=1e-9)
    chain = _ngram_chain((8,))
    qn, qh = model.q_both(chain, context=500, p_src=0.6)
    assert qn[0] == pytest.approx(0.6, abs=1e-9)
    assert qh[0] == pytest.approx(0.6, abs=1e-9)  # head-based estimate of an n-gram node: p_src


def test_class_precision_prices_each_chain_node_in_both_estimates():
    """Guards ng_prec (a chain node's proposal-class precision): under the prior the fitted model
    and the head-based estimate both price each node of a chain at its own class precision; a
    node without one (nan) reads p_src, and without ng_prec both price every node at p_src."""
    model = AcceptanceModel()
    chain = _ngram_chain((5, 6, 7))
    prec = np.array([0.6, 0.9, np.nan])
    chain.ng_prec = prec
    qf, qh = model.q_both(chain, context=500, p_src=0.7)
    np.testing.assert_allclose(qf, [0.6, 0.9, 0.7], atol=1e-9)
    np.testing.assert_allclose(qh, [0.6, 0.9, 0.7], atol=1e-9)
    qs, qsh = model.q_both(_ngram_chain((5, 6, 7)), context=500, p_src=0.7)
    np.testing.assert_allclose(qs, 0.7, atol=1e-9)
    np.testing.assert_allclose(qsh, 0.7, atol=1e-9)


def test_coefficients_stay_at_prior_until_the_gate_opens():
    """Guards the 3 sqrt(m) gate: identical rounds give identical gradients, which exceed three
    standard errors only from the 10th update (k |g| > 3 sqrt(k) |g| iff k > 9). Before that every
    coefficient is the prior and q equals the prior's q exactly; at the 10th round they leave."""
    assert PRIOR_GATE == 3.0  # the update count below is derived for the paper's 3 sqrt(m)
    model = AcceptanceModel()
    prior = model.coefficients()
    c = _round_with(h=0.7)
    labels = np.zeros(len(c), dtype=int)  # the pick never accepted: the prior over-prices it
    q0, _ = model.q_both(c, 500, 0.6)
    for k in range(1, 10):
        model.learn(c, 500, 0.6, labels)
        assert model.coefficients() == prior, f"left the prior after {k} updates"
    model.begin_request()
    np.testing.assert_array_equal(model.q_both(c, 500, 0.6)[0], q0)
    model.learn(c, 500, 0.6, labels)
    after = model.coefficients()
    assert after["a0"] < prior["a0"]  # the pick's intercept moved down, toward the evidence
    assert model.gate_open()["a0"]
    model.begin_request()
    assert model.q_both(c, 500, 0.6)[0][0] < q0[0]


# --------------------------------------------------------------------------------------------
# fitting a known truth
# --------------------------------------------------------------------------------------------
def test_fitted_model_is_calibrated_and_near_the_true_log_loss(trained):
    """Guards Eq. (6)'s features, buckets and the online fit: after 5,500 rounds from the prior
    the fitted q, scored on fresh rounds before learning, is calibrated within 3% (pooled) and
    its log loss within 2% of the true model's."""
    _, st = trained
    calib = st["sum_q"] / st["sum_y"]
    assert abs(calib - 1.0) <= 0.03, calib
    assert st["fit"] / st["true"] <= 1.02, st["fit"] / st["true"]


def test_fitted_beats_miscalibrated_head_and_guard_hands_it_pricing(trained):
    """Guards the guard: with an over-confident head the fitted model's log loss is clearly
    lower than the head-based estimate's (even with its per-request offset), the guard's
    decayed losses say so, and the fitted model prices the tree."""
    model, st = trained
    assert st["fit"] < 0.9 * st["head"], (st["fit"], st["head"])
    fit_loss, head_loss = model.guard_losses()
    assert fit_loss < head_loss
    assert model.priced_by == "fitted"
    assert st["fitted_rounds"] == st["rounds"]
    c = make_round(np.random.default_rng(3))
    q, by = model.q(c, 1000, 0.5)
    assert by == "fitted"
    np.testing.assert_array_equal(q, model.q_both(c, 1000, 0.5)[0])


def test_guard_keeps_the_head_while_the_fitted_model_is_worse():
    """Guards the other side of the guard: on chains of lone picks accepted with probability
    exactly h, the prior (2h / (1 + h) for a lone pick) over-prices every pick, so the head-based
    estimate has the lower decayed loss and keeps pricing the tree."""
    truth = TrueModel(a=(0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0), ctx_d=0.0, depth=0.0)
    model = AcceptanceModel()
    rng = np.random.default_rng(5)
    for _ in range(60):
        c = make_round(rng, p_ngram=0.0, siblings=False)
        model.learn(c, 800, 0.5, sample_labels(rng, c, truth.q(c, 800, 0.5)))
    fit_loss, head_loss = model.guard_losses()
    assert head_loss < fit_loss
    assert model.priced_by == "head"
    c = make_round(rng, p_ngram=0.0, siblings=False)
    q, by = model.q(c, 800, 0.5)
    assert by == "head"
    np.testing.assert_array_equal(q, model.q_both(c, 800, 0.5)[1])


def test_guard_scores_a_round_before_either_estimate_learns_from_it():
    """Guards the order of Algorithm 1 line 17: the first round's guard losses are the log
    losses of the q both estimates gave before that round's update."""
    model = AcceptanceModel()
    rng = np.random.default_rng(8)
    c = make_round(rng)
    labels = sample_labels(rng, c, TrueModel().q(c, 700, 0.6))
    qf, qh = model.q_both(c, 700, 0.6)
    model.learn(c, 700, 0.6, labels)
    lab = labels >= 0
    y = (labels[lab] == 1).astype(float)
    fit_loss, head_loss = model.guard_losses()
    req_fit, req_head, nodes = model.request_log_loss()
    assert nodes == lab.sum()
    assert req_fit == pytest.approx(_log_loss(qf[lab], y) / nodes, rel=1e-12)
    assert req_head == pytest.approx(_log_loss(qh[lab], y) / nodes, rel=1e-12)
    # the guard's sums decay per labelled parent (half-life 256), so within one round they
    # differ from the plain mean by well under 1%
    assert fit_loss == pytest.approx(req_fit, rel=1e-2)
    assert head_loss == pytest.approx(req_head, rel=1e-2)


def test_request_intercept_stays_in_band_and_resets_per_request():
    """Guards b_req: AdaGrad drives it toward a request whose candidates are never accepted,
    it never leaves +-2, and begin_request restarts it (and the head offset) at 0."""
    model = AcceptanceModel()
    c = _round_with(h=0.9, sigma=0.9)
    rejected = np.zeros(len(c), dtype=int)
    seen = []
    for _ in range(400):
        model.learn(c, 500, 0.6, rejected)
        seen.append(model.request_intercept)
        assert abs(model.head_offset) <= 2.0
    assert min(seen) >= -REQ_INTERCEPT_BAND
    assert seen[-1] == pytest.approx(-REQ_INTERCEPT_BAND)
    assert model.head_offset < -1.0
    accepted = rejected.copy()
    accepted[0] = 1
    for _ in range(400):
        model.learn(c, 500, 0.6, accepted)
        assert abs(model.request_intercept) <= REQ_INTERCEPT_BAND
    model.begin_request()
    assert model.request_intercept == 0.0 and model.head_offset == 0.0
    q_reset = model.q_both(c, 500, 0.6)[0]
    fresh = AcceptanceModel()
    fresh.load_state(model.state_dict())
    np.testing.assert_array_equal(fresh.q_both(c, 500, 0.6)[0], q_reset)


# --------------------------------------------------------------------------------------------
# exploration
# --------------------------------------------------------------------------------------------
def test_exploration_every_16th_round_picks_least_labelled_frontier_bucket():
    """Guards Algorithm 1 line 12: only every 16th tree round with n-gram candidates explores;
    it picks an unplaced n-gram node whose parent is placed (never one below an unplaced node),
    from the bucket with the fewest labels."""
    model = AcceptanceModel()
    # anchor -> pick 0, sibling 1, n-gram 2 (copy 32, bucket A), n-gram 3 (follower 2, bucket B);
    # n-gram 4 (follower 9) hangs below node 3.
    c = CandidateSet(parent=[-1, -1, -1, -1, 3], kind=[KIND_PICK, KIND_SIBLING, KIND_NGRAM, KIND_NGRAM, KIND_NGRAM],
                     token=[10, 11, 12, 13, 14], depth=[1, 1, 1, 1, 2], h=[0.6, 0.6, np.nan, np.nan, np.nan],
                     sigma=[0.7, 0.7, np.nan, np.nan, np.nan], r=[np.nan, 1.0, np.nan, np.nan, np.nan],
                     ng_kind=[0, 0, 1, 2, 2], ng_evidence=[0, 0, 32, 2, 9], ng_above=[0, 0, 0, 0, 1],
                     contra_evidence=[32, 32, -1, -1, -1], contra_kind=[1, 1, 0, 0, 0])
    labels = np.array([0, 0, 0, 0, -1])  # the anchor's children labelled: buckets A and B once each
    for _ in range(3):
        model.learn(c, 300, 0.5, labels)
    # label bucket A twice more: rounds in which a lone copy node of the same bucket is labelled
    only_a = CandidateSet(parent=[-1], kind=[KIND_NGRAM], token=[12], depth=[1], ng_kind=[1], ng_evidence=[32],
                          ng_above=[0])
    for _ in range(2):
        model.learn(only_a, 300, 0.5, np.array([0]))
    counts = model.bucket_labels(c)
    assert counts[2] == 5 and counts[3] == 3 and counts[4] == 0
    placed = np.array([True, True, False, False, False])
    for i in range(1, EXPLORATION_PERIOD):
        assert model.exploration_pick(c, placed, i) is None
    # node 4's bucket has no labels at all, but its parent (node 3) is not placed
    assert model.exploration_pick(c, placed, EXPLORATION_PERIOD) == 3
    assert model.exploration_pick(c, placed, 2 * EXPLORATION_PERIOD) == 3
    # once node 3 keeps its row, node 4 is on the frontier and its unlabelled bucket wins
    placed[3] = True
    assert model.exploration_pick(c, placed, EXPLORATION_PERIOD) == 4
    # no unplaced n-gram frontier node: nothing to explore
    assert model.exploration_pick(c, np.ones(5, dtype=bool), EXPLORATION_PERIOD) is None
    drafter_only = CandidateSet(parent=[-1, -1], kind=[KIND_PICK, KIND_SIBLING], token=[1, 2], depth=[1, 1])
    assert model.exploration_pick(drafter_only, np.zeros(2, dtype=bool), EXPLORATION_PERIOD) is None


def _serve_ngram_chains(explore: bool, rounds: int = 2400) -> tuple[AcceptanceModel, CandidateSet]:
    """A toy engine on n-gram-only chains: it places the nodes whose Q is at least 0.5 and
    lets exploration take one extra row; a node is verified only if placed."""
    truth = TrueModel(ctx_n=0.0, ngram_w=lambda k, e, b: -1.0 if b == 0 else 3.0)  # deep nodes almost sure
    model = AcceptanceModel()
    rng = np.random.default_rng(21)
    c = _ngram_chain((8, 9, 10, 11))
    p_src = 0.45
    ngram_rounds = 0
    for i in range(rounds):
        if i % 200 == 0:
            model.begin_request()
        q, _ = model.q(c, 600, p_src)
        Q = np.cumprod(q)  # a chain: Q is the product down the path
        placed = Q >= 0.5
        ngram_rounds += 1
        pick = model.exploration_pick(c, placed, ngram_rounds) if explore else None
        if pick is not None:
            placed[pick] = True
        qt = truth.q(c, 600, p_src)
        labels = np.full(len(c), -1)
        for j in range(len(c)):  # the chain: node j is labelled iff its parent was accepted
            if c.parent[j] >= 0 and not (placed[c.parent[j]] and labels[c.parent[j]] == 1):
                break
            labels[j] = int(rng.random() < qt[j])
            if labels[j] == 0:
                break
        model.learn(c, 600, p_src, labels)
    model.begin_request()
    return model, c


def test_underpriced_ngram_bucket_is_explored_and_corrected():
    """Guards why exploration exists (§3.3 "Exploration"): a bucket below an n-gram node that is
    never placed gets no labels and stays at its prior; with exploration every 16th round its
    parent is verified now and then, the bucket is labelled and its price moves toward the
    truth (about 0.96 against the prior's p_src = 0.45)."""
    without, c = _serve_ngram_chains(explore=False)
    deep_bucket = f"ngram[{int(ngram_bucket(c.ng_kind[1:2], c.ng_evidence[1:2], c.ng_above[1:2])[0])}]"
    assert without.bucket_labels(c)[1] == 0
    assert without.coefficients()[deep_bucket] == 0.0
    assert without.q_both(c, 600, 0.45)[0][1] < 0.5
    with_x, _ = _serve_ngram_chains(explore=True)
    assert with_x.bucket_labels(c)[1] >= 20
    assert with_x.coefficients()[deep_bucket] > 1.0
    assert with_x.q_both(c, 600, 0.45)[0][1] > 0.75


# --------------------------------------------------------------------------------------------
# the cross-source terms, sources without a head or without a drafter
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["prior", "trained"])
def test_agreed_candidate_priced_above_either_source_alone(which, trained):
    """Guards the agreed term: a pick the n-gram also proposed is priced above the same pick
    without an n-gram proposal and above the n-gram node alone, before and after learning."""
    model = AcceptanceModel() if which == "prior" else trained[0]
    model.begin_request()
    p_src = 0.7
    agreed = _round_with(pick_kw=dict(agreed=True, ng_kind=1, ng_evidence=16), h=0.6, sigma=0.6)
    alone = _round_with(h=0.6, sigma=0.6)
    ngram_alone = _ngram_chain((16,))
    qa = model.q_both(agreed, 1000, p_src)[0][0]
    qd = model.q_both(alone, 1000, p_src)[0][0]
    qn = model.q_both(ngram_alone, 1000, p_src)[0][0]
    assert qa > qd and qa > qn, (qa, qd, qn)


def test_cross_source_terms_at_the_prior_follow_logit_p_src_floored_at_zero():
    """Guards the agreed and contradicted terms' fixed parts: agreement adds and contradiction
    subtracts max(0, logit p_src) to a drafter candidate's score, so a weak source (p_src < 0.5)
    neither lifts nor sinks the drafter's candidates."""
    model = AcceptanceModel()
    alone = _round_with(h=0.6, sigma=0.6)
    agreed = _round_with(pick_kw=dict(agreed=True, ng_kind=1, ng_evidence=16), h=0.6, sigma=0.6)
    contra = _round_with(pick_kw=dict(contra_evidence=16, contra_kind=1), h=0.6, sigma=0.6)

    def pick_score(c, p_src):  # the pick's score, recovered from q and the fixed sibling mass
        q = model.q_both(c, 1024, p_src)[0]
        none = 1.0 - q.sum()
        return math.log(q[0] / none)

    base = pick_score(alone, 0.8)
    assert pick_score(agreed, 0.8) - base == pytest.approx(math.log(4.0), abs=1e-6)  # logit 0.8 = ln 4
    assert pick_score(contra, 0.8) - base == pytest.approx(-math.log(4.0), abs=1e-6)
    assert pick_score(agreed, 0.3) == pytest.approx(pick_score(alone, 0.3), abs=1e-9)
    assert pick_score(contra, 0.3) == pytest.approx(pick_score(alone, 0.3), abs=1e-9)


def test_ngram_only_trees_are_priced_and_learned():
    """Guards the no-drafter case: n-gram-only trees are priced by the n-gram terms, the bucket
    weights learn the truth, and the fitted model beats p_src alone and takes over pricing."""
    rng = np.random.default_rng(9)
    pool = [make_round(rng, ngram_only=True) for _ in range(400)]
    # long copies are near certain, lone followers rarely right: p_src alone cannot tell them apart
    truth = TrueModel(ngram_w=lambda k, e, b: (-2.0 + 0.8 * e - 0.2 * b) if k == 1 else (-2.0 + 0.4 * e))
    model = AcceptanceModel()
    st = simulate(model, truth, np.random.default_rng(4), requests=8, rounds_per_request=200, score_from=5, pool=pool)
    assert st["fit"] < 0.95 * st["head"], (st["fit"], st["head"])
    assert abs(st["sum_q"] / st["sum_y"] - 1.0) < 0.05
    assert model.priced_by == "fitted"
    q, _ = model.q(_ngram_chain((4, 5, 6)), 900, 0.5)
    assert np.all(np.isfinite(q)) and np.all((q > 0) & (q < 1))


def test_missing_confidence_head_uses_neutral_value():
    """Guards the no-head case: with h = nan the fitted model uses logit h = 0 (a1 and a5 get no
    gradient and stay at the prior), the head-based estimate prices a pick by its share sigma,
    and learning still fits the share terms."""
    model = AcceptanceModel()
    c = _round_with(h=np.nan, sigma=0.8)
    qf, qh = model.q_both(c, 500, 0.5)
    assert qh[0] == pytest.approx(0.8)
    assert qf[0] == pytest.approx(2.0 / (1.0 + 2.0 + 1.0))  # ln 2 + logit 0.5, siblings' shares sum to 1
    truth = TrueModel()
    st = simulate(model, truth, np.random.default_rng(6), requests=4, rounds_per_request=200, score_from=0,
                  no_head=True)
    assert np.isfinite(st["fit"])
    co = model.coefficients()
    assert co["a1"] == 1.0 and co["a5"] == 0.0
    assert not model.gate_open()["a1"] and not model.gate_open()["a5"]
    assert co["a2"] > 0.3  # the share's coefficient learned from the no-head rounds


# --------------------------------------------------------------------------------------------
# persistence
# --------------------------------------------------------------------------------------------
def test_state_dict_round_trip_gives_identical_q(trained, pool):
    """Guards persistence: a JSON round trip of state_dict restores a model whose q (fitted and
    head-based), guard and later learning are identical to the original's."""
    model, _ = trained
    model.begin_request()
    rng = np.random.default_rng(13)
    for c in pool[:5]:
        model.learn(c, 1500, 0.6, sample_labels(rng, c, TrueModel().q(c, 1500, 0.6)))
    text = json.dumps(model.state_dict())
    assert text == json.dumps(json.loads(text))
    clone = AcceptanceModel()
    clone.load_state(json.loads(text))
    for c in pool[5:25]:
        a, b = model.q_both(c, 1500, 0.6), clone.q_both(c, 1500, 0.6)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    assert clone.priced_by == model.priced_by and clone.guard_losses() == model.guard_losses()
    labels = sample_labels(rng, pool[30], TrueModel().q(pool[30], 1500, 0.6))
    model.learn(pool[30], 1500, 0.6, labels)
    clone.learn(pool[30], 1500, 0.6, labels)
    assert json.dumps(model.state_dict()) == json.dumps(clone.state_dict())


def test_load_state_rejects_a_foreign_layout():
    """Guards the store against silently loading coefficients of another layout."""
    state = AcceptanceModel().state_dict()
    state["layout"] = dict(state["layout"], coefficients=3)
    with pytest.raises(ValueError):
        AcceptanceModel().load_state(state)
    with pytest.raises(ValueError):
        AcceptanceModel().load_state({"version": 99})


def test_learning_after_pricing_equals_learning_alone(pool):
    """learn reuses the design and estimates q_both computed for the same round; the result must
    be exactly what learning from scratch gives, also when the pricing no longer applies: another
    context or p_src, another candidate set, or a request restarted (b_req back to 0) between."""
    rng = np.random.default_rng(29)
    priced, plain = AcceptanceModel(), AcceptanceModel()
    for i, c in enumerate(pool[:60]):
        if i % 20 == 0:
            priced.begin_request()
            plain.begin_request()
        ctx, p = 700 + 9 * i, 0.4 + 0.005 * i
        labels = sample_labels(rng, c, TrueModel().q(c, ctx, p))
        mode = i % 5
        if mode == 0:
            priced.q(c, ctx, p)  # the round's usual order: price, then learn
        elif mode == 1:
            priced.q(c, ctx + 1, p)  # priced at another context
        elif mode == 2:
            priced.q(c, ctx, p + 0.1)  # priced with another p_src
        elif mode == 3:
            priced.q(pool[60 + i], ctx, p)  # priced another candidate set
        else:
            priced.q(c, ctx, p)
            priced.begin_request()  # b_req restarted after pricing
            plain.begin_request()
        priced.learn(c, ctx, p, labels)
        plain.learn(c, ctx, p, labels)
        assert json.dumps(priced.state_dict()) == json.dumps(plain.state_dict()), (i, mode)


def test_deferred_learning_keeps_its_own_rounds_pricing(pool):
    """`deferred` (the decoder's learning during the next forward, on a GPU) runs after the next
    round has been priced, and must learn from its own round's candidates, context and p_src,
    never the pricing left last: the state equals learning right after pricing."""
    rng = np.random.default_rng(31)
    now, later = AcceptanceModel(), AcceptanceModel()
    for i in range(30):
        c, nxt = pool[i], pool[i + 1]
        ctx, p = 600 + 11 * i, 0.45 + 0.004 * i
        labels = sample_labels(rng, c, TrueModel().q(c, ctx, p))
        now.q(c, ctx, p)
        now.learn(c, ctx, p, labels)
        later.q(c, ctx, p)
        pending = later.deferred(c, ctx, p, labels)
        later.q(nxt, ctx + 1, p + 0.01)  # the next round is priced before the forward runs `pending`
        pending()
        assert json.dumps(later.state_dict()) == json.dumps(now.state_dict()), i
