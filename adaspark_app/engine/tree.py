"""The candidate tree of one round (§2.2, §3.1): best-first order, S(n), layout, seq ids, accept.

Candidates are indexed so that every parent precedes its children; index -1 is the anchor, the
last committed token, which is always row 0 of a verify. A verify of width n has n rows: the
anchor and the first n-1 candidates of the best-first order (Proposition 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..learn import acceptance
from ..learn.acceptance import CandidateSet
from ..learn.kinds import NgramKind, NodeKind, Source

if TYPE_CHECKING:
    from .ngram import NgramStep

# plain int codes: numpy compares an IntEnum member (and converts a list of them) several times
# slower than an int, and these codes fill and test the round's arrays
KIND_PICK, KIND_SIBLING, KIND_NGRAM = int(NodeKind.PICK), int(NodeKind.SIBLING), int(NodeKind.NGRAM)
_NG_NONE = int(NgramKind.NONE)
_AGREED, _NGRAM, _DRAFTER = Source.AGREED.value, Source.NGRAM.value, Source.DRAFTER.value  # an enum's .value is a property call


@dataclass
class Candidates:
    """One round's candidates with the features the acceptance model reads."""

    parent: list[int] = field(default_factory=list)
    token: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    agreed: list[bool] = field(default_factory=list)
    h: list[float] = field(default_factory=list)
    sigma: list[float] = field(default_factory=list)
    r: list[float] = field(default_factory=list)
    ng_kind: list[int] = field(default_factory=list)  # NgramKind codes
    ng_evidence: list[int] = field(default_factory=list)
    ng_above: list[int] = field(default_factory=list)
    contra_kind: list[int] = field(default_factory=list)
    contra_evidence: list[int] = field(default_factory=list)
    children: dict[int, dict[int, int]] = field(default_factory=dict)  # parent -> token -> index
    chain_only: bool = False  # the tree is the anchor's n-gram chain alone (no drafter node)
    # ... and the rows that verify it whole where nothing continues it (it stopped short of the depth
    # asked for: its passage ends, or no follower); else 0
    chain_end: int = 0

    def __len__(self) -> int:
        return len(self.token)

    def child(self, parent: int, token: int) -> int | None:
        return self.children.get(parent, {}).get(token)

    def add(self, parent: int, token: int, kind: int, *, h: float = float("nan"),
            sigma: float = float("nan"), r: float = float("nan"), ng_kind: int = _NG_NONE,
            ng_evidence: int = 0) -> int:
        """Append a candidate under `parent` (which must already exist); returns its index."""
        idx = len(self.token)
        depth = 1 if parent < 0 else self.depth[parent] + 1
        above = 0 if parent < 0 else self.ng_above[parent] + (1 if self.kind[parent] == KIND_NGRAM else 0)
        self.parent.append(parent)
        self.token.append(token)
        self.kind.append(kind)
        self.depth.append(depth)
        self.agreed.append(False)
        self.h.append(h)
        self.sigma.append(sigma)
        self.r.append(r)
        self.ng_kind.append(ng_kind)
        self.ng_evidence.append(ng_evidence)
        self.ng_above.append(above)
        self.contra_kind.append(0)
        self.contra_evidence.append(-1)
        self.children.setdefault(parent, {})[token] = idx
        return idx

    def add_root_chain(self, steps: list[NgramStep]) -> None:
        """Append an n-gram chain under the anchor of an empty tree, each step the child of the one
        before: what ``add`` gives one step at a time (the anchor's chain where no drafter node is
        there to merge with), in a few list extensions instead of a call per node (a long copy's
        chain is 63)."""
        assert not self.token, "a root chain starts an empty tree"
        m = len(steps)
        if m == 0:
            return
        nan = float("nan")
        idx = list(range(m))
        tokens = [st.token for st in steps]
        self.parent.extend(range(-1, m - 1))
        self.token.extend(tokens)
        self.kind.extend([KIND_NGRAM] * m)
        self.depth.extend(range(1, m + 1))
        self.agreed.extend([False] * m)
        self.h.extend([nan] * m)
        self.sigma.extend([nan] * m)
        self.r.extend([nan] * m)
        self.ng_kind.extend([int(st.kind) for st in steps])
        self.ng_evidence.extend([st.evidence for st in steps])
        self.ng_above.extend(idx)  # every node above is an n-gram node
        self.contra_kind.extend([0] * m)
        self.contra_evidence.extend([-1] * m)
        self.children.update({i - 1: {t: i} for i, t in zip(idx, tokens)})

    def source(self, i: int) -> str:
        """The row class by source (``Source``): a drafter candidate, an n-gram node, or one both proposed."""
        if self.agreed[i]:
            return _AGREED
        return _NGRAM if self.kind[i] == KIND_NGRAM else _DRAFTER


def best_first_order(Q: np.ndarray) -> np.ndarray:
    """Candidates by decreasing Q, ties toward the lower index (Proposition 1)."""
    idx = np.arange(len(Q))
    return np.lexsort((idx, -np.asarray(Q, dtype=np.float64)))


def path_products(q: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Q_j: the product of q along j's path from the anchor (parents precede children)."""
    Q: list[float] = []
    for qj, p in zip(np.asarray(q, dtype=np.float64).tolist(), np.asarray(parent).tolist()):
        Q.append(qj if p < 0 else Q[p] * qj)
    return np.array(Q, dtype=np.float64)


def committable(Q: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Q_j where the commit can keep node j, else 0: the value the cut leaves each node.

    The verify lays the tree out depth-first, each parent's children in best-first order, so the
    batch's first rows are the spine: the anchor's top child (highest Q, ties toward the lower
    index, as `best_first_order` ranks them), its top child, and so on. `cut_at_batch_front` keeps
    only the spine part of an accepted path; a node off the spine, even when accepted, commits
    nothing that the target's own bonus token at its parent's row would not (its token is that
    bonus), and nothing below it is kept. So of Eq. (1)'s terms only the spine's are tokens
    the round can commit. The spine of any prefix of the best-first order is the spine of the
    whole tree cut to that prefix (a parent's first child in the order is its top child).
    """
    Qs = np.asarray(Q, dtype=np.float64).tolist()
    parents = np.asarray(parent).tolist()
    top: dict[int, int] = {}
    for j, p in enumerate(parents):
        b = top.get(p)
        if b is None or Qs[j] > Qs[b]:
            top[p] = j
    kept: list[float] = []
    spine: list[bool] = []
    for j, p in enumerate(parents):  # parents precede children
        on = top.get(p) == j and (p < 0 or spine[p])
        spine.append(on)
        kept.append(Qs[j] if on else 0.0)
    return np.array(kept, dtype=np.float64)


def expected_accepted(Q: np.ndarray, order: np.ndarray, is_ngram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """S(n) for every width n in one pass (Eq. 1), split by source.

    Returns (S_drafter, S_ngram), each of length N+2 so that index n is the expected accepted
    tokens among the first n-1 nodes; index 0 and 1 are 0.
    """
    n = len(order)
    sd = np.zeros(n + 2)
    sn = np.zeros(n + 2)
    if n:
        qo = Q[order]
        ng = is_ngram[order]
        sd[2:] = np.cumsum(np.where(ng, 0.0, qo))
        sn[2:] = np.cumsum(np.where(ng, qo, 0.0))
    return sd, sn


def tree_values(q: np.ndarray, c: CandidateSet) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                           np.ndarray, np.ndarray]:
    """A priced tree's values: (Q, Q_commit, order, is_ng, S_drafter, S_ngram), i.e.
    ``path_products``, ``committable``, ``best_first_order`` of the committable Q, the n-gram rows
    (not agreed) and ``expected_accepted``; in one C call where it is built (``acceptance.PRICING``)."""
    C = acceptance.PRICING
    n = len(c)
    if C is None:
        Q = path_products(q, c.parent)
        Qc = committable(Q, c.parent)
        order = best_first_order(Qc)
        is_ng = (c.kind == KIND_NGRAM) & ~c.agreed
        return (Q, Qc, order, is_ng, *expected_accepted(Qc, order, is_ng))
    ints, _, agreed = c.blocks()
    out, order, is_ng = np.empty(4 * n + 4), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.bool_)
    C.tree_values(np.ascontiguousarray(q, dtype=np.float64), ints, agreed, n, out, order, is_ng)
    return out[:n], out[n:2 * n], order, is_ng, out[2 * n:3 * n + 2], out[3 * n + 2:]


@dataclass
class TreeLayout:
    """A verify's rows: node per row (-1 = anchor), depth, and the seq ids of each row."""

    nodes: list[int]
    depth: list[int]
    seq_ids: list[tuple[int, ...]]
    leaf_seqs: list[int]  # seq ids used for leaves (empty for a chain kept in seq 0)
    row_of: dict[int, int]


def layout(selected: list[int], cands: Candidates) -> TreeLayout:
    """Depth-first layout of the anchor and the selected nodes, with seq ids for tree attention.

    A chain (every node has at most one selected child) is kept in seq 0. A branching tree gets
    one seq per leaf (1..63); each row carries the seq ids of every leaf below it.
    """
    sel = set(selected)
    kids: dict[int, list[int]] = {}
    rank = {j: k for k, j in enumerate(selected)}
    for j in selected:
        kids.setdefault(cands.parent[j], []).append(j)
    for lst in kids.values():
        lst.sort(key=rank.__getitem__)
    nodes: list[int] = []
    depth: list[int] = []
    stack = [(-1, 0)]
    while stack:
        j, d = stack.pop()
        nodes.append(j)
        depth.append(d)
        for c in reversed(kids.get(j, [])):
            stack.append((c, d + 1))
    row_of = {j: r for r, j in enumerate(nodes)}
    chain = all(len(v) <= 1 for v in kids.values())
    if chain:
        return TreeLayout(nodes, depth, [(0,)] * len(nodes), [], row_of)
    leaves = [j for j in nodes if not kids.get(j)]
    seq_of_leaf = {leaf: s + 1 for s, leaf in enumerate(leaves)}
    below: dict[int, list[int]] = {j: [] for j in nodes}
    for leaf, s in seq_of_leaf.items():
        j = leaf
        while True:
            below[j].append(s)
            if j < 0:
                break
            j = cands.parent[j]
            if j not in sel and j >= 0:  # pragma: no cover - a prefix of the order is a tree
                raise AssertionError("selected nodes do not form a tree")
    seq_ids = [tuple(sorted(below[j])) for j in nodes]
    return TreeLayout(nodes, depth, seq_ids, sorted(seq_of_leaf.values()), row_of)


def accepted_path(lay: TreeLayout, cands: Candidates, argmax: np.ndarray) -> tuple[list[int], int, list[int]]:
    """The greedy accepted path and the bonus token.

    Walks from the anchor: a node is accepted when its token equals the target's argmax at its
    parent's row. Returns (accepted nodes, bonus token, rows of the path incl. the anchor row).
    """
    path: list[int] = []
    rows = [0]
    cur = -1
    while True:
        want = int(argmax[lay.row_of[cur]])
        nxt = None
        for c in cands.children.get(cur, {}).values():
            if c in lay.row_of and cands.token[c] == want:
                nxt = c
                break
        if nxt is None:
            return path, want, rows
        path.append(nxt)
        rows.append(lay.row_of[nxt])
        cur = nxt


def sampled_path(lay: TreeLayout, cands: Candidates, draw: Callable[[int, list[int]], int]
                 ) -> tuple[list[int], int, list[int], np.ndarray]:
    """The accepted path under sampling, and the bonus token: the walk of `accepted_path` with
    the target's draw in place of its argmax.

    At each node of the path (the anchor first), ``draw(row, path_tokens)`` draws the next token
    from the target's processed distribution at that row (its prefix: the committed tokens and
    ``path_tokens``); the walk descends to the child holding the draw and stops at the first node
    where no verified child does, emitting the draw as the bonus. With deterministic candidates
    this is exact: each emitted token is a draw from the target for its exact prefix.
    Returns (accepted nodes, bonus token, rows of the path incl. the anchor row, the draw per
    row: -1 for rows off the path).
    """
    draws = np.full(len(lay.nodes), -1, dtype=np.int64)
    path: list[int] = []
    tokens: list[int] = []
    rows = [0]
    cur = -1
    while True:
        row = lay.row_of[cur]
        want = int(draw(row, tokens))
        draws[row] = want
        nxt = cands.child(cur, want)
        if nxt is None or nxt not in lay.row_of:
            return path, want, rows, draws
        path.append(nxt)
        tokens.append(want)
        rows.append(lay.row_of[nxt])
        cur = nxt


def cut_at_batch_front(cands: Candidates, path: list[int], rows: list[int], bonus: int
                       ) -> tuple[list[int], list[int], int, bool]:
    """Keep only the part of an accepted path whose rows are the batch's first rows.

    llama.cpp's attention walks KV cells in slot order; a path through a later branch leaves its
    cells after rejected siblings' slots, which later tokens then fill, so the cells would no
    longer sit in position order and the softmax would sum in another order than plain decode's:
    replies would drift from `ar`. Cutting there stays lossless (the next token is the target's
    argmax at the last kept row: the token of the first dropped node) and costs the rest of that
    path. Returns (path, rows, bonus, whether it cut).
    """
    c = 0
    while c + 1 < len(rows) and rows[c + 1] == c + 1:
        c += 1
    if c >= len(path):
        return path, rows, bonus, False
    return path[:c], rows[:c + 1], cands.token[path[c]], True


def chain_ends_at(cands: Candidates, budget: int | None) -> int:
    """The rows that verify the tree whole where it is one n-gram chain that ends there: nothing
    continues the chain (``Candidates.chain_end``), or the reply's token budget ends inside it (a
    verify of ``budget`` rows commits the budget's last token); else 0. What a narrower verify
    leaves of such a chain needs a round of its own (``WidthScheduler._credit_chain_end``)."""
    if not cands.chain_only:
        return 0
    ends = cands.chain_end
    if budget is not None and 1 < budget <= len(cands) + 1 and (not ends or budget < ends):
        return budget
    return ends


def child_labels(cands: Candidates, lay: TreeLayout, argmax: np.ndarray, path: list[int]) -> np.ndarray:
    """Labels for every candidate of every accepted parent, placed or not (§3.3 Learning).

    1: it is the target's argmax at its parent's row; 0: it is not; -1: parent not accepted.
    Under sampling, pass the draws per row (`sampled_path`) as `argmax`: a candidate is then
    accepted when the draw equals it, the outcome the acceptance model must price.
    """
    labels = [-1] * len(cands)  # a list, then one array: numpy's per-element writes cost more
    token, children, row_of = cands.token, cands.children, lay.row_of
    for par in [-1] + path:
        want = int(argmax[row_of[par]])
        for c in children.get(par, {}).values():
            labels[c] = 1 if token[c] == want else 0
    return np.array(labels, dtype=np.int8)
