"""A round's candidates (Algorithm 1 lines 3-4), built from the draft sources (``proposers.py``).

``tree_candidates`` is the AdaSpark tree of §3.3: the drafter's block (its picks a spine, their
siblings leaves) and n-gram chains from the anchor and from each pick, merged so that a node both
sources propose is one node (agreed), and a drafter node whose parent's n-gram proposal differs
carries that proposal (contradicted). ``chain_candidates`` is the `chain:K` baseline's chain.
``candidate_set`` is the same tree as the arrays the acceptance model reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..learn import acceptance
from ..learn.acceptance import CandidateSet
from ..learn.constants import NGRAM_MAX_DEPTH, TOP_K, TREE_DRAFT_ROWS
from ..learn.precision import SourcePrecision
from .proposers import DrafterSource, NgramSource
from .tree import KIND_NGRAM, KIND_PICK, KIND_SIBLING, Candidates


@dataclass
class Sources:
    """The round's draft sources: the n-gram index always, a DSpark drafter when one is loaded."""

    ngram: NgramSource
    drafter: DrafterSource | None = None

    def drafter_fits(self, anchor_pos: int) -> bool:
        """A drafter whose block fits the context at this anchor."""
        return self.drafter is not None and self.drafter.fits(anchor_pos)


def chain_candidates(sources: Sources, k: int, anchor: int, anchor_pos: int) -> Candidates:
    """`chain:K`: the drafter's first K picks, or without a drafter the n-gram continuation from
    the anchor, up to K tokens (prompt lookup)."""
    cands = Candidates()
    par = -1
    if sources.drafter_fits(anchor_pos):
        block = sources.drafter.draft(anchor, anchor_pos, 1, k)
        for i in range(min(k, block.tokens.shape[0])):
            par = cands.add(par, int(block.tokens[i, 0]), KIND_PICK, sigma=float(block.share[i, 0]))
        return cands
    for st in sources.ngram.draft([], k):
        par = cands.add(par, st.token, KIND_NGRAM, ng_kind=int(st.kind), ng_evidence=st.evidence)
    return cands


def tree_candidates(sources: Sources, use_drafter: bool, anchor: int, anchor_pos: int) -> Candidates:
    """Drafter block (picks spine, siblings as leaves) and n-gram chains from the anchor and each pick."""
    cands = Candidates()
    picks: list[int] = []
    if use_drafter and sources.drafter_fits(anchor_pos):
        block = sources.drafter.draft(anchor, anchor_pos, TOP_K, TREE_DRAFT_ROWS)
        par = -1
        conf = block.conf
        for i in range(block.tokens.shape[0]):
            toks = block.tokens[i]
            share = block.share[i]
            h = float(conf[i]) if conf is not None else float("nan")
            sigma = float(share[0])
            sib_mass = float(share[1:].sum()) or 1.0
            pick = cands.add(par, int(toks[0]), KIND_PICK, h=h, sigma=sigma)
            for kk in range(1, len(toks)):
                if cands.child(par, int(toks[kk])) is None:
                    cands.add(par, int(toks[kk]), KIND_SIBLING, h=h, sigma=sigma, r=float(share[kk]) / sib_mass)
            picks.append(pick)
            par = pick
    # n-gram chains from the anchor and from each pick (§3.3)
    ngram = sources.ngram
    heads = [-1] + picks
    suffix: list[int] = []
    for depth0, head in enumerate(heads):
        if head >= 0:
            suffix.append(cands.token[head])
        # the anchor's chain runs to 63 tokens on a long copy (constants.LONG_COPY_DEPTH), so the
        # chooser may verify it whole; chains below a pick stay within NGRAM_MAX_DEPTH
        asked = ngram.anchor_depth() if head < 0 else NGRAM_MAX_DEPTH - depth0
        steps = ngram.draft(suffix, asked)
        if head < 0 and not picks:
            cands.chain_only = True
            if 0 < len(steps) < asked:
                cands.chain_end = len(steps) + 1  # the whole tree: the chain stopped by itself
        if head < 0 and not picks:
            cands.add_root_chain(steps)  # nothing to merge with: each step a new node under the last
            continue
        par = head
        for st in steps:
            kind = int(st.kind)
            existing = cands.child(par, st.token)
            if existing is not None:
                if cands.kind[existing] != KIND_NGRAM and not cands.agreed[existing]:
                    cands.agreed[existing] = True
                    cands.ng_kind[existing] = kind
                    cands.ng_evidence[existing] = st.evidence
                if cands.kind[existing] != KIND_NGRAM and existing not in picks:
                    break  # an agreed sibling is a leaf: the drafter scores nothing below it
                par = existing
                if existing in picks:
                    break  # the chain from that pick continues it
                continue
            # a different proposal under a parent with drafter children: contradiction
            for c in cands.children.get(par, {}).values():
                if cands.kind[c] != KIND_NGRAM and cands.contra_evidence[c] < 0:
                    cands.contra_evidence[c] = st.evidence
                    cands.contra_kind[c] = kind
            par = cands.add(par, st.token, KIND_NGRAM, ng_kind=kind, ng_evidence=st.evidence)
    return cands


def candidate_set(c: Candidates, precision: SourcePrecision | None = None) -> CandidateSet:
    """The candidates as the arrays the acceptance model reads (features per node); with
    ``precision``, each node's class precision too (``CandidateSet.ng_prec``, from
    ``SourcePrecision.for_nodes``). In C where it is built (``acceptance.PRICING``): one call fills
    the columns as rows of two blocks. Else numpy: the integer columns as rows of one array and
    the float columns of another, two conversions instead of thirteen (each costs microseconds on
    a round's few dozen nodes)."""
    C = acceptance.PRICING
    n = len(c)
    if C is not None and precision is not None:
        ints, floats, agreed = np.empty((9, n), dtype=np.int64), np.empty((4, n)), np.empty(n, dtype=np.bool_)
        C.columns(c.parent, c.kind, c.token, c.depth, c.ng_kind, c.ng_evidence, c.ng_above, c.contra_evidence,
                  c.contra_kind, c.h, c.sigma, c.r, c.agreed, precision.class_hits, precision.class_trials,
                  precision.value, ints, floats, agreed)
        return CandidateSet.from_blocks(ints, floats, agreed)
    ints = np.array((c.parent, c.kind, c.token, c.depth, c.ng_kind, c.ng_evidence, c.ng_above,
                     c.contra_evidence, c.contra_kind), dtype=np.int64).reshape(9, n)
    floats = np.array((c.h, c.sigma, c.r), dtype=np.float64).reshape(3, n)
    parent, kind, token, depth, ng_kind, ng_evidence, ng_above, contra_evidence, contra_kind = ints
    h, sigma, r = floats
    cset = CandidateSet(parent=parent, kind=kind, token=token, depth=depth, h=h, sigma=sigma, r=r,
                        ng_kind=ng_kind, ng_evidence=ng_evidence, ng_above=ng_above,
                        agreed=np.array(c.agreed, dtype=bool), contra_evidence=contra_evidence,
                        contra_kind=contra_kind)
    if precision is not None:
        cset.ng_prec = precision.for_nodes(cset)
    return cset
