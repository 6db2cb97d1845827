"""Acceptance model of §3.3: Eq. (6), fitted online, guarded by the head-based estimate.

For one round, every candidate ``j`` gets ``q_j = P(j accepted | parent accepted)``. The
candidates of one parent and an explicit *none* outcome share one softmax (Eq. (6))::

    q_j = exp(s_j) / (1 + sum_{i in cand(parent)} exp(s_i))

    pick:    s = a0 + a1 logit h + a2 logit sigma                 + psi + b_req
    sibling: s = a3 + a4 log r   + a5 logit h + a6 logit sigma    + psi + b_req
    n-gram:  s = logit p_src + w_bucket                           + psi + b_req
    agreed drafter candidate:       + max(0, logit p_src) + w_agreed[bucket, pick|sibling]
    contradicted drafter candidate: - max(0, logit p_src) + w_contra[kind, evidence, pick|sibling]

``psi`` is the context term ``c_src * (log2(1 + context / ACC_CONTEXT_UNIT) - 1)`` (one coefficient
for the drafter's candidates, one for the n-gram's; zero at 1,024 tokens) plus, for drafter
candidates, a depth term (one weight per depth 2..ACC_DEPTH_MAX; depth 1 is the reference, absorbed
by a0 and a3). An n-gram *bucket* is (kind: copy | follower, evidence bin, bin of the number of
n-gram nodes above on the path); evidence is the copy's matched length or the follower's count,
binned by powers of two (1, 2-3, 4-7, 8-15, 16-31, 32+), as is the count above (0, 1, 2-3, ...,
16+). The agreed bucket is the n-gram proposal's bucket crossed with pick | sibling; the
contradiction bucket is the proposal's (kind, evidence bin) crossed with pick | sibling. A drafter
candidate flagged both agreed and contradicted is treated as agreed.

Learning (§3.3 "Learning"). The prior is derived from the features' definitions: a0 = ln 2,
a1 = 1, a4 = 1 and every other coefficient and bucket weight 0, so with the K-1 siblings' shares
summing to one a pick prices exactly at its head h and the siblings split the rest with *none*
(and a lone n-gram node at p_src). Each coordinate learns its deviation from the prior by
FTRL-Proximal (rate ACC_FTRL_ALPHA, or NGRAM_BUCKET_ALPHA for every bucket weight; stabiliser
ACC_FTRL_BETA; L2 ACC_L2; squared gradients capped at ACC_SQGRAD_CAP, which floors the rate). One
update is one round: the gradient of the round's log loss, summed over every labelled parent's
multinomial (Eq. (6)). A coordinate stays exactly at its prior until its gradients, summed over
the m updates that touched it, exceed PRIOR_GATE standard errors (see "Deviations"); its FTRL
state starts at that moment. The per-request intercept b_req learns by AdaGrad
(REQ_INTERCEPT_RATE, clamp +-REQ_INTERCEPT_BAND, squared-gradient cap REQ_INTERCEPT_SQGRAD_CAP)
and restarts at 0 with each request.

Guard. The head-based estimate prices each node on its own: a pick by its confidence head h, a
sibling by its share of the top-K softmax mass ``r * (1 - sigma)``, an n-gram node by its class
precision ``ng_prec`` where given (else p_src; see "Class precision"), all
shifted by a per-request logit offset learned by AdaGrad (HEAD_OFFSET_RATE, clamp
+-HEAD_OFFSET_BAND; Table 14 gives it no squared-gradient cap). Before either learns from a
round, both are scored on its labels by the binary log loss of every labelled node; sums of loss
and of nodes decay by half every GUARD_HALF_LIFE labelled parents, and the fitted model prices
the tree only while its decayed loss per node is strictly the lower.

Class precision. Eq. (6) scores an n-gram node from logit p_src, the source's top-1 precision
on the committed text. A candidate may also carry ``ng_prec``: the precision the index's first
step has had on this text for the class of its n-gram proposal, (kind, evidence)
(``engine.ngram.SourcePrecision.for_class``). A chain node k steps below the anchor carries the
evidence it would have at the anchor once its k parents are committed, so its class precision is
the measured chance it is right given its parent was: a long copy's deep nodes price near 1
from the text itself, where one p_src for every node prices a 30-node copy like its first guess.
Where given, ``ng_prec`` takes p_src's place in the fitted model's fixed terms (the n-gram score,
and the agreed and contradicted terms, which then use the precision of the proposal that agrees
or contradicts), and the bucket weights learn deviations from it. The head-based estimate takes
it too (a deviation: the paper's prices every n-gram node at the one p_src). On
Qwen2.5-Coder-1.5B, where the guard keeps the head-based estimate for most of a fresh store's
first replies, p_src was 0.95-0.97 (mostly long copies, right) and priced a one-count
follower's chain of 31 nodes at 18 accepted tokens; that class had been right 74-81% of the
time, and those chains accepted nothing in four of six wide rounds. The guard still compares
the fitted model with a baseline that has no learned coefficient.

Missing confidence head. When the drafter has no confidence head (``h`` is nan) the fitted model
uses the neutral value h = 0.5 (logit h = 0), so a1 and a5 learn nothing from such candidates and
keep their meaning for a drafter that has a head; the head-based estimate then prices a pick by
its share sigma instead. With no drafter (n-gram-only trees) only the n-gram terms are used.

Deviations from the paper, with the reason:
- The gate is |sum of gradients| > PRIOR_GATE * sqrt(sum of squared gradients), which is the
  paper's 3 sqrt(m) when each update's gradient has unit size. Taken literally in absolute units,
  3 sqrt(m) is a 3-sigma test only for unit-variance gradients; a bucket weight's gradients are
  much smaller, and on synthetic rounds most n-gram buckets then never left the prior (fitted log
  loss stuck ~3% above the true model's instead of ~1%).
- FTRL's (z, n) start when the gate opens instead of accumulating from the first update: z
  accumulated with the coefficient pinned at the prior holds linearised gradients all taken at
  the prior, and the weight would overshoot when the gate opens late.
- The persistent coefficients' gradient is taken without b_req (b_req only shifts the prices). A
  gradient through b_req lets the faster per-request intercept absorb each request's share of a
  persistent error, so the coefficients learn it slowly and every request restarts mispriced; on
  synthetic rounds the pooled calibration was ~2% off that way, ~0.5% this way.
- psi's context coefficient is kept per source (drafter, n-gram): longer texts repeat more, so the
  n-gram's acceptance moves with context differently from the drafter's. The context feature is
  centred at 1,024 tokens so that it does not act as a second intercept.
- Binning (powers of two), the depth cap 16 and the context unit 1,024 are not in Table 14; they
  are chosen by hand here and are local constants below.

Pure numpy: no I/O, no timing; ``state_dict``/``load_state`` for the store.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from adaspark_app.learn.constants import (
    ABOVE_EDGES as _ABOVE_EDGES,
    ACC_CONTEXT_UNIT,
    CLASS_PRIOR_WEIGHT,
    COPY_EVIDENCE_CAP,
    ACC_DEPTH_MAX,
    EVIDENCE_EDGES as _EVIDENCE_EDGES,
    ACC_FTRL_ALPHA,
    ACC_FTRL_BETA,
    ACC_L2,
    ACC_SQGRAD_CAP,
    EXPLORATION_PERIOD,
    GUARD_HALF_LIFE,
    HEAD_OFFSET_BAND,
    HEAD_OFFSET_RATE,
    NGRAM_BUCKET_ALPHA,
    PRIOR_GATE,
    REQ_INTERCEPT_BAND,
    REQ_INTERCEPT_RATE,
    REQ_INTERCEPT_SQGRAD_CAP,
)

from adaspark_app.learn.kinds import NgramKind, NodeKind
from adaspark_app.native import pricing as _pricing_build
from adaspark_app.learn.state import (
    StateError,
    boolean,
    fields as state_fields,  # `fields` is dataclasses'
    integer,
    integers,
    number,
    numbers,
    sequence,
    versioned,
)

# plain int codes (numpy compares an IntEnum member several times slower than an int)
KIND_PICK, KIND_SIBLING, KIND_NGRAM = int(NodeKind.PICK), int(NodeKind.SIBLING), int(NodeKind.NGRAM)
NG_NONE, NG_COPY, NG_FOLLOWER = int(NgramKind.NONE), int(NgramKind.COPY), int(NgramKind.FOLLOWER)  # ng_kind / contra_kind codes

EVIDENCE_EDGES = np.array(_EVIDENCE_EDGES)  # evidence bins: 1, 2-3, 4-7, 8-15, 16-31, 32+
ABOVE_EDGES = np.array(_ABOVE_EDGES)  # n-gram nodes above: 0, 1, 2-3, 4-7, 8-15, 16+
_EPS = 1e-4  # probabilities are clipped to [eps, 1-eps] before a logit
_LOSS_EPS = 1e-7

STATE_VERSION = 1  # of state_dict's layout (learn/state.py): unchanged since b9fbe7f


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.minimum(np.maximum(p, _EPS), 1.0 - _EPS)
    return np.log(p) - np.log1p(-p)


def _fill(x: np.ndarray, value: float) -> np.ndarray:
    """x with nan replaced by value (np.nan_to_num is slow on small arrays)."""
    return np.where(np.isnan(x), value, x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


@dataclass
class CandidateSet:
    """One round's candidates: every parent's children, placed in the tree or not (Eq. (6)).

    Index order must put every parent before its children (Proposition 1). Columns other than
    ``parent``, ``kind``, ``token`` and ``depth`` may be omitted and take their "absent" value.

    - ``parent``: index of the parent candidate, -1 for the anchor.
    - ``kind``: KIND_PICK | KIND_SIBLING | KIND_NGRAM.
    - ``depth``: 1 for a child of the anchor.
    - ``h``: confidence head at the position (nan if the drafter has none, and for n-gram nodes).
    - ``sigma``: the pick's share of the top-K softmax mass at the position (nan for n-gram).
    - ``r``: a sibling's share of the siblings' total (nan otherwise).
    - ``ng_kind``/``ng_evidence``: for n-gram nodes and agreed drafter nodes, the n-gram
      proposal's kind (NG_COPY | NG_FOLLOWER) and evidence (copy length or follower count).
    - ``ng_above``: number of n-gram nodes above on the path.
    - ``ng_prec``: the committed text's precision for the class of the candidate's n-gram
      proposal (its own, or the one agreeing with or contradicting it); nan: use p_src.
    - ``agreed``: a drafter candidate the n-gram also proposed.
    - ``contra_evidence``/``contra_kind``: for a drafter candidate whose parent has a different
      n-gram proposal, that proposal's evidence (>= 0 marks a contradiction; -1 if none) and kind.
    """

    parent: np.ndarray
    kind: np.ndarray
    token: np.ndarray
    depth: np.ndarray
    h: np.ndarray | None = None
    sigma: np.ndarray | None = None
    r: np.ndarray | None = None
    ng_kind: np.ndarray | None = None
    ng_evidence: np.ndarray | None = None
    ng_above: np.ndarray | None = None
    ng_prec: np.ndarray | None = None
    agreed: np.ndarray | None = None
    contra_evidence: np.ndarray | None = None
    contra_kind: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.parent = _column(self.parent, np.int64)
        n = self.parent.shape[0]
        for name in ("kind", "token", "depth"):
            setattr(self, name, _column(getattr(self, name), np.int64))
        for name, (dtype, fill) in _OPTIONAL_COLUMNS.items():
            v = getattr(self, name)
            setattr(self, name, np.full(n, fill, dtype=dtype) if v is None else _column(v, dtype))
        for name in _COLUMNS:
            if getattr(self, name).shape[0] != n:
                raise ValueError(f"CandidateSet column {name!r} has {getattr(self, name).shape[0]} rows, expected {n}")
        if n and (np.any(self.parent >= np.arange(n)) or np.any(self.parent < -1)):
            raise ValueError("CandidateSet: every parent must precede its children (parent index < own index)")
        if n and np.any(self.kind.view(np.uint64) > KIND_NGRAM):
            raise ValueError("CandidateSet: kind must be 0 (pick), 1 (sibling) or 2 (n-gram)")

    def __len__(self) -> int:
        return int(self.parent.shape[0])

    def __setattr__(self, name: str, value) -> None:
        # a column assigned anew is no longer a row of the blocks the C pricing reads
        if name in _COLUMN_SET:
            self.__dict__.pop("_blocks", None)
        object.__setattr__(self, name, value)

    @classmethod
    def from_blocks(cls, ints: np.ndarray, floats: np.ndarray, agreed: np.ndarray) -> CandidateSet:
        """A candidate set whose columns are rows of two blocks, as the C pricing fills them and
        reads them (``INT_COLUMNS`` in ``ints``, ``FLOAT_COLUMNS`` in ``floats``), already checked
        there: no copy, no second check."""
        c = cls.__new__(cls)
        c.__dict__.update(zip(INT_COLUMNS, ints))
        c.__dict__.update(zip(FLOAT_COLUMNS, floats))
        c.__dict__.update(agreed=agreed, _blocks=(ints, floats, agreed))
        return c

    def blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ints, floats, agreed): the columns as ``from_blocks`` lays them out, for the C pricing;
        the blocks themselves while no column was assigned anew, else packed afresh."""
        b = self.__dict__.get("_blocks")
        if b is not None:
            return b
        ints = np.array([getattr(self, name) for name in INT_COLUMNS], dtype=np.int64).reshape(len(INT_COLUMNS), -1)
        floats = np.array([getattr(self, name) for name in FLOAT_COLUMNS], dtype=np.float64).reshape(
            len(FLOAT_COLUMNS), -1)
        return ints, floats, np.ascontiguousarray(self.agreed, dtype=np.bool_)


#: The C pricing's column blocks (pricing.c), in its order: ints, then floats (agreed apart).
INT_COLUMNS = ("parent", "kind", "token", "depth", "ng_kind", "ng_evidence", "ng_above", "contra_evidence",
               "contra_kind")
FLOAT_COLUMNS = ("h", "sigma", "r", "ng_prec")
_COLUMN_SET = frozenset((*INT_COLUMNS, *FLOAT_COLUMNS, "agreed"))


def _column(v, dtype: type) -> np.ndarray:
    """A 1-D array of `dtype` (an array that already is one is kept as it is)."""
    if type(v) is np.ndarray and v.dtype == dtype and v.ndim == 1:
        return v
    return np.asarray(v, dtype=dtype).reshape(-1)


# The optional columns: dtype and "absent" value
_OPTIONAL_COLUMNS: dict[str, tuple[type, float]] = {
    "h": (np.float64, np.nan),
    "sigma": (np.float64, np.nan),
    "r": (np.float64, np.nan),
    "ng_kind": (np.int64, 0),
    "ng_evidence": (np.int64, 0),
    "ng_above": (np.int64, 0),
    "ng_prec": (np.float64, np.nan),
    "agreed": (np.bool_, False),
    "contra_evidence": (np.int64, -1),
    "contra_kind": (np.int64, 0),
}
_COLUMNS = tuple(f.name for f in fields(CandidateSet))


class _Layout:
    """Coordinates of the coefficient vector (names kept for state_dict and debugging)."""

    N_EV = len(EVIDENCE_EDGES)
    N_ABOVE = len(ABOVE_EDGES)
    N_NG_BUCKETS = 2 * N_EV * N_ABOVE  # kind x evidence x above
    N_AGREED = N_NG_BUCKETS * 2  # x pick|sibling
    N_CONTRA = 2 * N_EV * 2  # kind x evidence x pick|sibling

    def __init__(self) -> None:
        names = [f"a{i}" for i in range(7)] + ["ctx_drafter", "ctx_ngram"]
        self.DEPTH0 = len(names)
        names += [f"depth{d}" for d in range(2, ACC_DEPTH_MAX + 1)]
        self.NG0 = len(names)
        names += [f"ngram[{b}]" for b in range(self.N_NG_BUCKETS)]
        self.AG0 = len(names)
        names += [f"agreed[{b}]" for b in range(self.N_AGREED)]
        self.CO0 = len(names)
        names += [f"contra[{b}]" for b in range(self.N_CONTRA)]
        self.names = names
        self.size = len(names)
        prior = np.zeros(self.size)
        prior[0] = math.log(2.0)  # a0: pick scores ln 2 + logit h ...
        prior[1] = 1.0  # a1
        prior[4] = 1.0  # a4: sibling scores log r
        self.prior = prior
        alpha = np.full(self.size, ACC_FTRL_ALPHA)
        alpha[self.NG0 :] = NGRAM_BUCKET_ALPHA  # every bucket weight: n-gram, agreed, contradiction
        self.alpha = alpha

    def signature(self) -> dict[str, int]:
        return {
            "coefficients": self.size,
            "depth_max": ACC_DEPTH_MAX,
            "evidence_bins": self.N_EV,
            "above_bins": self.N_ABOVE,
        }


_LAYOUT = _Layout()
_A0, _A1, _A2, _A3, _A4, _A5, _A6, _CTX_D, _CTX_N = range(9)


def _bins(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(np.searchsorted(edges, values, side="right") - 1, 0), len(edges) - 1)


@dataclass
class _Design:
    """Sparse design of one round: per candidate, 7 (coordinate, value) slots and a fixed offset."""

    idx: np.ndarray  # (N, 7) coordinate
    val: np.ndarray  # (N, 7) feature value (0 = slot unused)
    fixed: np.ndarray  # (N,) logit p_src terms that carry no coefficient
    group: np.ndarray  # (N,) parent + 1, 0 = the anchor
    head_base: np.ndarray  # (N,) the head-based estimate before the per-request offset
    bucket: np.ndarray  # (N,) the n-gram bucket of each candidate's proposal (``ngram_bucket``)


def contradicted(c: CandidateSet) -> np.ndarray:
    """Drafter candidates whose parent's n-gram proposal is a different token: the candidates
    the contradicted terms of Eq. (6) price, by the contradicting proposal's class."""
    drafter = (c.kind == KIND_PICK) | (c.kind == KIND_SIBLING)
    return drafter & ~c.agreed & (c.contra_evidence >= 0)


# Per node kind (pick, sibling, n-gram): the coordinates of slots 0-4 (an n-gram node's slot 0 adds
# its bucket to NG0), and whether slots 1-2 (the drafter's logit h and logit sigma) carry a value
_KIND_IDX = np.array([[_A0, _A1, _A2, _A4, _CTX_D, 0, 0],
                      [_A3, _A5, _A6, _A4, _CTX_D, 0, 0],
                      [_LAYOUT.NG0, _A5, _A6, _A4, _CTX_N, 0, 0]], dtype=np.int64)
_EV_BIN = _bins(np.arange(EVIDENCE_EDGES[-1] + 1), EVIDENCE_EDGES)  # evidence 0..32 -> bin (32+ the last)
_AB_BIN = _bins(np.arange(ABOVE_EDGES[-1] + 1), ABOVE_EDGES)  # n-gram nodes above 0..16 -> bin


#: a proposal class's evidence 0..COPY_EVIDENCE_CAP -> its evidence bin (precision.py shrinks toward it)
CLASS_BIN = _bins(np.arange(COPY_EVIDENCE_CAP + 1), EVIDENCE_EDGES)


def _native_pricing():
    """The C twin of this module's pricing and of the tree's values (``native/pricing.py``),
    given this module's tables; None where the numpy code runs."""
    mod = _pricing_build.load()
    if mod is not None:
        L = _LAYOUT
        mod.configure(_KIND_IDX.ravel().tolist(), _EV_BIN.tolist(), _AB_BIN.tolist(), CLASS_BIN.tolist(),
                      L.N_EV, L.N_ABOVE, L.DEPTH0, L.AG0, L.CO0, ACC_DEPTH_MAX, L.size, len(EVIDENCE_EDGES),
                      float(CLASS_PRIOR_WEIGHT))
    return mod


#: The C pricing in use (``engine/candidates.py`` and ``engine/tree.py`` read it too), or None:
#: the numpy code. Tests set it to None to run the reference.
PRICING = _native_pricing()


def context_feature(context: int) -> float:
    """psi's context term: log2(1 + |x| / ACC_CONTEXT_UNIT) - 1 (0 at 1,024 tokens)."""
    return math.log2(1.0 + max(int(context), 0) / ACC_CONTEXT_UNIT) - 1.0


def _ev_bin(evidence: np.ndarray) -> np.ndarray:
    """``_bins(evidence, EVIDENCE_EDGES)`` by table: below 1 the first bin, 32 and above the last."""
    return _EV_BIN[np.minimum(np.maximum(evidence, 0), EVIDENCE_EDGES[-1])]


def ngram_bucket(ng_kind: np.ndarray, ng_evidence: np.ndarray, ng_above: np.ndarray) -> np.ndarray:
    """Bucket index (0..71) of an n-gram proposal: kind x evidence bin x n-gram-nodes-above bin."""
    k = np.minimum(np.maximum(np.asarray(ng_kind) - 1, 0), 1)
    ab = _AB_BIN[np.minimum(np.maximum(np.asarray(ng_above), 0), ABOVE_EDGES[-1])]
    return (k * _Layout.N_EV + _ev_bin(np.asarray(ng_evidence))) * _Layout.N_ABOVE + ab


def _design(c: CandidateSet, context: int, p_src: float) -> _Design:
    """The round's design in few array operations: each costs microseconds of overhead on a tree of
    ~32 nodes, and the round's host time is the issue (`benchmarks/cost/round_host_time.py`)."""
    L = _LAYOUT
    n = len(c)
    kind = c.kind
    pick = kind == KIND_PICK
    sib = kind == KIND_SIBLING
    ng = kind == KIND_NGRAM
    drafter = pick | sib

    # h, sigma and the class precision with their absent values filled (h, sigma 0.5: logit 0;
    # the precision p_src), their logits in one pass; r filled with 1
    p_one = float(p_src) if p_src == p_src else 0.5
    raw = np.array((c.h, c.sigma, c.ng_prec, c.r))
    filled = np.where(np.isnan(raw), np.array(((0.5,), (0.5,), (p_one,), (1.0,))), raw)
    lg = _logit(filled[:3])
    lh, ls, lp = lg
    sigma, p_node, r = filled[1], filled[2], filled[3]
    lr = np.log(np.minimum(np.maximum(r, 1e-6), 1.0))
    x_ctx = context_feature(context)
    lp_pos = np.maximum(lp, 0.0)

    bucket = ngram_bucket(c.ng_kind, c.ng_evidence, c.ng_above)

    idx = _KIND_IDX[kind]  # slots 0-4 by kind; 5-6 below
    idx[:, 0] += np.where(ng, bucket, 0)  # an n-gram node's bucket weight
    val = np.zeros((n, 7))
    val[:, 0] = 1.0  # the source's intercept (a0, a3, or the n-gram bucket weight)
    val[:, 1:3] = np.where(drafter[:, None], lg[:2].T, 0.0)  # logit h (a1 | a5), logit sigma (a2 | a6)
    val[:, 3] = np.where(sib, lr, 0.0)  # log r (a4, siblings)
    val[:, 4] = x_ctx  # psi's context term
    # slot 5: psi's depth term (drafter candidates, depth >= 2)
    d = np.minimum(np.maximum(c.depth, 1), ACC_DEPTH_MAX)
    deep = d >= 2
    idx[:, 5] = np.where(deep, L.DEPTH0 + d - 2, 0)
    val[:, 5] = drafter & deep
    # slot 6: agreed / contradicted bucket weights
    agreed = drafter & c.agreed
    contra = contradicted(c)
    ps = sib.astype(np.int64)
    ag_idx = L.AG0 + bucket * 2 + ps
    ck = np.minimum(np.maximum(c.contra_kind - 1, 0), 1)
    co_idx = L.CO0 + (ck * L.N_EV + _ev_bin(c.contra_evidence)) * 2 + ps
    idx[:, 6] = np.where(agreed, ag_idx, np.where(contra, co_idx, 0))
    val[:, 6] = agreed | contra

    fixed = np.where(ng, lp, 0.0) + np.where(agreed, lp_pos, 0.0) - np.where(contra, lp_pos, 0.0)

    # head-based estimate: pick -> h (sigma when there is no head), sibling -> r * (1 - sigma),
    # n-gram -> its class precision (p_src where there is none)
    h_pick = np.where(np.isnan(c.h), sigma, c.h)
    sib_share = r * (1.0 - sigma)
    head_base = np.where(pick, h_pick, np.where(sib, sib_share, p_node))
    return _Design(idx=idx, val=val, fixed=fixed, group=c.parent + 1, head_base=head_base, bucket=bucket)


def _softmax_with_none(s: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Eq. (6): q_j = exp(s_j) / (1 + sum over j's siblings-in-parent of exp(s_i))."""
    if s.size == 0:
        return s.copy()
    m = np.zeros(n_groups)  # includes the "none" score 0
    np.maximum.at(m, group, s)
    e = np.exp(s - m[group])
    denom = np.exp(-m)
    np.add.at(denom, group, e)
    return e / denom[group]


class AcceptanceModel:
    """The acceptance model of §3.3 (Eq. (6)) with its guard and exploration.

    Call ``begin_request`` at the start of each request; per round call ``q`` (or ``q_both``)
    before choosing the tree, ``exploration_pick`` when laying it out, and ``learn`` with the
    verify's labels. Coefficients, bucket label counts and the guard persist across requests
    (``state_dict``); the request intercept and the head offset restart with each request.
    """

    def __init__(self) -> None:
        L = _LAYOUT
        self._z = np.zeros(L.size)
        self._n = np.zeros(L.size)
        self._gsum = np.zeros(L.size)  # gate: sum of gradients while at the prior
        self._m = np.zeros(L.size)  # updates (rounds) that touched the coordinate
        self._g2sum = np.zeros(L.size)  # gate: squared gradients while at the prior
        self._open = np.zeros(L.size, dtype=bool)
        self._w: np.ndarray | None = None  # _weights() of the state above
        self._bucket_labels = np.zeros(L.N_NG_BUCKETS, dtype=np.int64)
        self._guard_fit = 0.0  # decayed summed log loss, fitted
        self._guard_head = 0.0  # ... head-based
        self._guard_nodes = 0.0  # decayed labelled nodes
        self._parents = 0  # labelled parents seen (all requests)
        self._rounds = 0
        self.begin_request()

    # ----- per request ---------------------------------------------------------------------
    def begin_request(self) -> None:
        """Restart the per-request intercept b_req and the head estimate's offset (§3.3)."""
        self._priced: tuple | None = None  # q_both's last pricing, reused by learn (_as_priced)
        self._b_req = 0.0
        self._b_req_g2 = 0.0
        self._offset = 0.0
        self._offset_g2 = 0.0
        self._req_fit = 0.0
        self._req_head = 0.0
        self._req_nodes = 0

    @property
    def request_intercept(self) -> float:
        """b_req of Eq. (6), in [-REQ_INTERCEPT_BAND, REQ_INTERCEPT_BAND]."""
        return self._b_req

    @property
    def head_offset(self) -> float:
        """The head-based estimate's per-request logit offset, in [-HEAD_OFFSET_BAND, HEAD_OFFSET_BAND]."""
        return self._offset

    # ----- coefficients --------------------------------------------------------------------
    def _weights(self) -> np.ndarray:
        """The coefficients (read-only: kept until the FTRL state changes, in ``learn`` or ``load_state``)."""
        if self._w is None:
            L = _LAYOUT
            dev = -self._z / ((ACC_FTRL_BETA + np.sqrt(self._n)) / L.alpha + ACC_L2)
            self._w = L.prior + np.where(self._open, dev, 0.0)
        return self._w

    def coefficients(self) -> dict[str, float]:
        """Current coefficient per named coordinate (a0..a6, ctx_*, depth*, ngram[b], ...)."""
        return {name: float(w) for name, w in zip(_LAYOUT.names, self._weights())}

    def gate_open(self) -> dict[str, bool]:
        """Per coordinate: has its gate opened (it left the prior; see the module docstring)?"""
        return {name: bool(o) for name, o in zip(_LAYOUT.names, self._open)}

    # ----- pricing -------------------------------------------------------------------------
    def _scores(self, d: _Design, w: np.ndarray, b_req: float) -> np.ndarray:
        return (w[d.idx] * d.val).sum(axis=1) + d.fixed + b_req

    def _fitted(self, d: _Design, n: int, b_req: float | None = None) -> np.ndarray:
        b = self._b_req if b_req is None else b_req
        return _softmax_with_none(self._scores(d, self._weights(), b), d.group, n + 1)

    def _head(self, d: _Design) -> np.ndarray:
        return _sigmoid(_logit(d.head_base) + self._offset)

    def q_both(self, cands: CandidateSet, context: int, p_src: float) -> tuple[np.ndarray, np.ndarray]:
        """(fitted q by Eq. (6), head-based q) per candidate, both conditional on the parent."""
        n = len(cands)
        if n == 0:
            return np.zeros(0), np.zeros(0)
        d, fitted, head = self._estimates(cands, context, p_src)
        self._priced = (cands, int(context), float(p_src), d, fitted, head)
        return fitted, head

    def _estimates(self, cands: CandidateSet, context: int, p_src: float) -> tuple[_Design, np.ndarray, np.ndarray]:
        """The round's design and both estimates: in C where it is built (``PRICING``), else numpy."""
        C = PRICING
        if C is None:
            d = _design(cands, context, p_src)
            return d, self._fitted(d, len(cands)), self._head(d)
        n = len(cands)
        ints, floats, agreed = cands.blocks()
        idx, val = np.empty((n, 7), dtype=np.int64), np.empty((n, 7))
        per, bucket = np.empty((4, n)), np.empty(n, dtype=np.int64)  # per: fixed, head_base, fitted, head
        C.eq6(ints, floats, agreed, n, context_feature(context), float(p_src), self._weights(), self._b_req,
              self._offset, idx, val, per, bucket)
        d = _Design(idx=idx, val=val, fixed=per[0], group=ints[0] + 1, head_base=per[1], bucket=bucket)
        return d, per[2], per[3]

    def _as_priced(self, cands: CandidateSet, context: int, p_src: float) -> tuple[_Design, np.ndarray, np.ndarray]:
        """The design and both estimates of ``cands`` as ``q_both`` last priced them, if it priced
        this very candidate set at this context and p_src and nothing has learned since (the
        round's usual order: price, verify, learn); else computed afresh."""
        pr = self._priced
        self._priced = None
        if pr is not None and pr[0] is cands and pr[1] == int(context) and (
                pr[2] == float(p_src) or (pr[2] != pr[2] and p_src != p_src)):
            return pr[3], pr[4], pr[5]
        return self._estimates(cands, context, p_src)

    def q(self, cands: CandidateSet, context: int, p_src: float) -> tuple[np.ndarray, str]:
        """q per candidate (Algorithm 1 line 5) from whichever estimate the guard prefers.

        Returns (q, "fitted" | "head"). ``context`` is the committed length |x|; ``p_src`` the
        n-gram source's precision (``SourcePrecision.value``; any value if there are no n-gram
        candidates).
        """
        fitted, head = self.q_both(cands, context, p_src)
        by = self.priced_by
        return (fitted if by == "fitted" else head), by

    @property
    def priced_by(self) -> str:
        """Which estimate prices the tree: ``"fitted"`` while the fitted model's decayed log loss
        is strictly the lower (the guard, §3.3), else ``"head"`` (also before any label)."""
        if self._guard_nodes > 0 and self._guard_fit < self._guard_head:
            return "fitted"
        return "head"

    def guard_losses(self) -> tuple[float, float]:
        """Decayed (fitted, head-based) log loss per labelled node.

        Each labelled node's binary log loss is summed per labelled parent; sums and node counts
        decay by half every GUARD_HALF_LIFE labelled parents; the ratio is returned. Both are
        scored on a round's labels before either learns from them. (nan, nan) before any label.
        """
        if self._guard_nodes <= 0:
            return math.nan, math.nan
        return self._guard_fit / self._guard_nodes, self._guard_head / self._guard_nodes

    def request_log_loss(self) -> tuple[float, float, int]:
        """This request's (fitted, head-based) log loss per labelled node, undecayed, and the
        number of labelled nodes; scored before learning, as in Table 2 / Figure 4."""
        if self._req_nodes == 0:
            return math.nan, math.nan, 0
        return self._req_fit / self._req_nodes, self._req_head / self._req_nodes, self._req_nodes

    # ----- learning ------------------------------------------------------------------------
    def deferred(self, cands: CandidateSet, context: int, p_src: float,
                 labels: np.ndarray | Callable[[], np.ndarray]) -> Callable[[], None]:
        """``learn`` on these labels, to run later (during the next round's forward, on a device that
        computes it while the host goes on): it keeps the round's pricing, which the next
        round's ``q_both`` replaces. ``labels`` may be a function that makes them then."""
        priced = self._as_priced(cands, context, p_src)
        make = labels if callable(labels) else lambda: labels
        return lambda: self.learn(cands, context, p_src, make(), priced=priced)

    def learn(self, cands: CandidateSet, context: int, p_src: float, labels: np.ndarray,
              priced: tuple[_Design, np.ndarray, np.ndarray] | None = None) -> None:
        """Fold one round's labels (Algorithm 1 line 17): guard first, then learn.

        ``labels`` per candidate: -1 unlabelled (parent not accepted or not verified), 1 = it was
        the target's argmax at its parent's row, 0 = it was not. Every candidate of every accepted
        parent must be labelled, placed in the tree or not, so a labelled parent's children are
        exactly its labelled candidates. Both estimates are scored on these labels with the
        round's q before either learns; then the coefficients (FTRL-Proximal on the deviation from
        the prior, behind the 3 sqrt(m) gate; one update per round), b_req and the head offset
        (AdaGrad) are updated, and the n-gram buckets' label counts (for exploration).
        ``priced``: the round's design and estimates (``deferred``), else ``q_both``'s last.
        """
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        n = len(cands)
        if labels.shape[0] != n:
            raise ValueError(f"labels has {labels.shape[0]} rows, the candidate set {n}")
        self._rounds += 1
        lab = labels >= 0
        if not lab.any():
            return
        d, q_fit, q_head = priced if priced is not None else self._as_priced(cands, context, p_src)

        sel = np.flatnonzero(lab)
        y = (labels[sel] == 1).astype(np.float64)
        grp_raw = d.group[sel]
        # the labelled parents in index order (path order), and each label's parent among them
        # (np.unique's sorted values and inverse, without its sort: groups are small integers)
        present = np.zeros(n + 1, dtype=bool)
        present[grp_raw] = True
        g = (np.cumsum(present) - 1)[grp_raw]
        P = int(np.count_nonzero(present))

        # --- guard: score both on this round's labels before either learns -----------------
        def node_loss(qs: np.ndarray) -> np.ndarray:
            qs = np.minimum(np.maximum(qs, _LOSS_EPS), 1.0 - _LOSS_EPS)
            return -(y * np.log(qs) + (1.0 - y) * np.log1p(-qs))

        lf = np.bincount(g, weights=node_loss(q_fit[sel]), minlength=P)
        lh = np.bincount(g, weights=node_loss(q_head[sel]), minlength=P)
        cnt = np.bincount(g, minlength=P).astype(np.float64)
        decay = 2.0 ** (-1.0 / GUARD_HALF_LIFE)
        wts = decay ** np.arange(P - 1, -1, -1, dtype=np.float64)
        keep = decay**P
        self._guard_fit = self._guard_fit * keep + float(wts @ lf)
        self._guard_head = self._guard_head * keep + float(wts @ lh)
        self._guard_nodes = self._guard_nodes * keep + float(wts @ cnt)
        self._req_fit += float(lf.sum())
        self._req_head += float(lh.sum())
        self._req_nodes += int(sel.shape[0])
        self._parents += P

        # --- FTRL-Proximal on the deviation from the prior: one update per round ------------
        L = _LAYOUT
        # The persistent coefficients learn the model without b_req: b_req restarts with every
        # request and learns faster, so a gradient taken through it would let b_req soak up each
        # request's share of a persistent error and leave the coefficients starved of it.
        q_pop = self._fitted(d, n, 0.0) if self._b_req != 0.0 else q_fit
        resid_pop = q_pop[sel] - y  # d(round's multinomial log loss)/d s_j, summed per coordinate
        idx = d.idx[sel].ravel()
        vals = d.val[sel]
        grad = np.bincount(idx, weights=(resid_pop[:, None] * vals).ravel(), minlength=L.size)
        upd = np.bincount(idx, weights=(vals != 0).ravel().astype(np.float64), minlength=L.size) > 0
        grad2 = grad * grad

        closed = upd & ~self._open
        self._m[upd] += 1.0
        self._gsum[closed] += grad[closed]
        self._g2sum[closed] += grad2[closed]
        # the gate: |sum g| > PRIOR_GATE * sqrt(sum g^2), i.e. 3 sqrt(m) in units of the gradient
        # (the 1e-9 keeps rounding from deciding a tie: "exceeds" is strict)
        opening = closed & (np.abs(self._gsum) > PRIOR_GATE * np.sqrt(self._g2sum) * (1.0 + 1e-9))
        self._z[opening] = 0.0  # FTRL starts from the prior when the gate opens
        self._n[opening] = 0.0
        self._open |= opening
        if opening.any():
            self._w = None

        ftrl = upd & self._open
        if ftrl.any():
            w_dev = self._weights() - L.prior
            n_old = self._n[ftrl]
            n_new = np.minimum(n_old + grad2[ftrl], ACC_SQGRAD_CAP)
            sig = (np.sqrt(n_new) - np.sqrt(n_old)) / L.alpha[ftrl]
            self._z[ftrl] += grad[ftrl] - sig * w_dev[ftrl]
            self._n[ftrl] = n_new
        self._w = None

        # --- per-request intercept b_req (AdaGrad, capped squared gradients, clamped) --------
        g_req = float((q_fit[sel] - y).sum())
        self._b_req_g2 = min(self._b_req_g2 + g_req * g_req, REQ_INTERCEPT_SQGRAD_CAP)
        if self._b_req_g2 > 0:
            self._b_req -= REQ_INTERCEPT_RATE * g_req / math.sqrt(self._b_req_g2)
            self._b_req = min(max(self._b_req, -REQ_INTERCEPT_BAND), REQ_INTERCEPT_BAND)

        # --- head-based estimate's per-request offset (AdaGrad, clamped) --------------------
        g_off = float((q_head[sel] - y).sum())
        self._offset_g2 += g_off * g_off
        if self._offset_g2 > 0:
            self._offset -= HEAD_OFFSET_RATE * g_off / math.sqrt(self._offset_g2)
            self._offset = min(max(self._offset, -HEAD_OFFSET_BAND), HEAD_OFFSET_BAND)

        # --- label counts per n-gram bucket (for exploration) --------------------------------
        ng_sel = sel[cands.kind[sel] == KIND_NGRAM]
        if ng_sel.size:
            self._bucket_labels += np.bincount(d.bucket[ng_sel], minlength=L.N_NG_BUCKETS)
        self._weights()  # for the next round's pricing: here, where a GPU's forward hides the work

    # ----- exploration ---------------------------------------------------------------------
    def bucket_labels(self, cands: CandidateSet) -> np.ndarray:
        """Labels seen so far for each candidate's n-gram bucket (-1 for drafter candidates)."""
        b = ngram_bucket(cands.ng_kind, cands.ng_evidence, cands.ng_above)
        return np.where(cands.kind == KIND_NGRAM, self._bucket_labels[b], -1)

    @staticmethod
    def explores_at(round_index: int) -> bool:
        """Whether the ``round_index``-th tree round with n-gram candidates explores (line 12)."""
        return round_index > 0 and round_index % EXPLORATION_PERIOD == 0

    def exploration_pick(self, cands: CandidateSet, placed: np.ndarray, round_index: int) -> int | None:
        """Algorithm 1 line 12: every EXPLORATION_PERIOD-th tree round with n-gram candidates,
        the candidate that takes the tree's last row.

        ``round_index`` is the 1-based count of tree rounds that had n-gram candidates, this one
        included; exploration happens when it is a multiple of 16. ``placed`` marks the nodes
        that keep their rows (the tree without its last row). Returns the index of an unplaced
        n-gram node whose parent is the anchor or placed, from the bucket with the fewest
        labels (ties: the lowest index), or None.
        """
        if not self.explores_at(round_index) or len(cands) == 0:
            return None
        placed = np.asarray(placed, dtype=bool).reshape(-1)
        if placed.shape[0] != len(cands):
            raise ValueError(f"placed has {placed.shape[0]} rows, the candidate set {len(cands)}")
        parent_placed = np.where(cands.parent < 0, True, placed[np.maximum(cands.parent, 0)])
        frontier = np.flatnonzero((cands.kind == KIND_NGRAM) & ~placed & parent_placed)
        if frontier.size == 0:
            return None
        counts = self.bucket_labels(cands)[frontier]
        return int(frontier[int(np.argmin(counts))])  # argmin keeps the first (lowest index) on ties

    # ----- persistence ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """JSON-serialisable state: coefficients' FTRL and gate state, bucket label counts, the
        guard, and the current request's intercept and offset. Keys in a fixed order."""

        def fl(a: np.ndarray) -> list[float]:
            return [float(x) for x in a]

        return {
            "version": STATE_VERSION,
            "layout": _LAYOUT.signature(),
            "ftrl": {
                "z": fl(self._z),
                "n": fl(self._n),
                "gate_sum": fl(self._gsum),
                "gate_sum_sq": fl(self._g2sum),
                "updates": fl(self._m),
                "open": [bool(x) for x in self._open],
            },
            "bucket_labels": [int(x) for x in self._bucket_labels],
            "guard": {
                "fitted": float(self._guard_fit),
                "head": float(self._guard_head),
                "nodes": float(self._guard_nodes),
            },
            "counters": {"parents": int(self._parents), "rounds": int(self._rounds)},
            "request": {
                "b_req": float(self._b_req),
                "b_req_g2": float(self._b_req_g2),
                "offset": float(self._offset),
                "offset_g2": float(self._offset_g2),
                "fitted": float(self._req_fit),
                "head": float(self._req_head),
                "nodes": int(self._req_nodes),
            },
        }

    def load_state(self, state: dict, where: str = "acceptance") -> None:
        """Restore from ``state_dict``; StateError (a ValueError naming the field) on a state of
        another version or coefficient layout, or a malformed one, and then nothing is changed."""
        s = versioned(state, where, STATE_VERSION, ("layout", "ftrl", "bucket_labels", "guard", "counters", "request"))
        if s["layout"] != _LAYOUT.signature():
            raise StateError(f"{where}.layout: the coefficient layout differs from this version's "
                             f"({_LAYOUT.signature()})")
        L = _LAYOUT
        f = state_fields(s["ftrl"], f"{where}.ftrl", ("z", "n", "gate_sum", "gate_sum_sq", "updates", "open"))

        def vec(name: str, **bounds: float) -> np.ndarray:
            return np.array(numbers(f[name], f"{where}.ftrl.{name}", L.size, **bounds), dtype=np.float64)

        z, gs = vec("z"), vec("gate_sum")
        n, g2, m = vec("n", lo=0.0), vec("gate_sum_sq", lo=0.0), vec("updates", lo=0.0)  # sums of squares, counts
        op = np.array([boolean(x, f"{where}.ftrl.open[{i}]")
                       for i, x in enumerate(sequence(f["open"], f"{where}.ftrl.open", L.size))], dtype=bool)
        bl = np.array(integers(s["bucket_labels"], f"{where}.bucket_labels", L.N_NG_BUCKETS), dtype=np.int64)
        gd = state_fields(s["guard"], f"{where}.guard", ("fitted", "head", "nodes"))
        guard = [number(gd[k], f"{where}.guard.{k}", lo=0.0) for k in ("fitted", "head", "nodes")]  # decayed sums
        ctr = state_fields(s["counters"], f"{where}.counters", ("parents", "rounds"))
        parents, rounds = (integer(ctr[k], f"{where}.counters.{k}") for k in ("parents", "rounds"))
        rq = state_fields(s["request"], f"{where}.request",
                    ("b_req", "b_req_g2", "offset", "offset_g2", "fitted", "head", "nodes"))
        b_req = number(rq["b_req"], f"{where}.request.b_req", lo=-REQ_INTERCEPT_BAND, hi=REQ_INTERCEPT_BAND)
        offset = number(rq["offset"], f"{where}.request.offset", lo=-HEAD_OFFSET_BAND, hi=HEAD_OFFSET_BAND)
        req = [number(rq[k], f"{where}.request.{k}", lo=0.0) for k in ("b_req_g2", "offset_g2", "fitted", "head")]
        req_nodes = integer(rq["nodes"], f"{where}.request.nodes")
        self._z, self._n, self._gsum, self._g2sum, self._m, self._open = z, n, gs, g2, m, op
        self._w = None
        self._bucket_labels = bl
        self._guard_fit, self._guard_head, self._guard_nodes = guard
        self._parents, self._rounds = parents, rounds
        self.begin_request()
        self._b_req, self._offset = b_req, offset
        self._b_req_g2, self._offset_g2, self._req_fit, self._req_head = req
        self._req_nodes = req_nodes
