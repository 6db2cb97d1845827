"""p_src of Eq. (6): how often the n-gram source's first proposal is the token committed.

A learner of the committed text: it takes (proposal, committed token) pairs and returns
precisions, overall and per proposal class. The n-gram index (``engine.ngram.NgramIndex.extend``)
feeds it one pair per committed token; the acceptance model reads ``value`` and ``for_class``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np

from . import acceptance
from .acceptance import EVIDENCE_EDGES  # the per-class counts are shrunk toward the model's evidence bins
from .acceptance import CLASS_BIN, CandidateSet, contradicted
from .constants import CLASS_PRIOR_WEIGHT, COPY_EVIDENCE_CAP, PRECISION_HALF_LIFE
from .kinds import NgramKind
from .state import StateError, number, numbers, sequence, versioned

STATE_VERSION = 1  # of state_dict's layout (learn/state.py); b9fbe7f's had no "version"

# evidence classes 0..COPY_EVIDENCE_CAP -> the acceptance model's evidence bin
_BIN_OF = CLASS_BIN
_BIN_MATRIX = np.eye(len(EVIDENCE_EDGES), dtype=np.float64)[_BIN_OF]  # (classes, bins) one-hot
_DECAY = 0.5 ** (1.0 / PRECISION_HALF_LIFE)  # per counted token
_COPY, _FOLLOWER = int(NgramKind.COPY), int(NgramKind.FOLLOWER)  # ints: numpy compares an IntEnum slowly


class Proposal(Protocol):
    """What the tracker reads of a proposal (``engine.ngram.NgramStep``)."""

    token: int
    kind: NgramKind
    evidence: int


class SourcePrecision:
    """p_src of Eq. (6): the n-gram source's top-1 precision on the committed text.

    Counts, over committed tokens where the index proposed something, how often the proposal
    was the token committed; smoothed by a Beta(1, 1) prior, so it reads 0.5 before any
    evidence. Positions with no proposal are not counted: p_src prices proposals that exist.

    The same counts are also kept per proposal class, (kind, evidence) with evidence capped at
    ``COPY_EVIDENCE_CAP``: a copy whose matched context is 32 tokens long is right far more often
    than one that matched 4, and a chain node k steps below the anchor carries the evidence its
    proposal would have at the anchor once those k tokens are committed. So ``for_class`` is the
    precision of the index's first step at that class on this text: the measured price of a
    chain node given its parent, for a counter per committed token. Every committed token feeds
    one class, so classes fill fast; a sparse one is shrunk (``CLASS_PRIOR_WEIGHT`` pseudo-trials)
    toward its evidence bin's value (the acceptance model's bins), and the bin toward the
    overall value, so a class seen twice does not read 0 or 1.

    Every count fades with a half-life of PRECISION_HALF_LIFE counted tokens: the counts persist
    across requests, and lifetime counts would stop following the text being written (a store
    that served prose for weeks would price a code paste's copies by the prose).
    """

    __slots__ = ("hits", "trials", "_a", "_b", "class_hits", "class_trials")

    def __init__(self, prior_hits: float = 1.0, prior_misses: float = 1.0) -> None:
        self.hits = 0.0  # decayed counts (PRECISION_HALF_LIFE)
        self.trials = 0.0
        self._a = float(prior_hits)
        self._b = float(prior_misses)
        # [NgramKind code][evidence 0..COPY_EVIDENCE_CAP]
        self.class_hits = np.zeros((len(NgramKind), COPY_EVIDENCE_CAP + 1), dtype=np.float64)
        self.class_trials = np.zeros((len(NgramKind), COPY_EVIDENCE_CAP + 1), dtype=np.float64)

    def observe(self, predicted: Proposal | None, actual: int) -> None:
        """Fold one committed token: ``predicted`` is ``first_step()`` taken before it (None: the
        index proposed nothing there, which is not counted)."""
        self.observe_many(((predicted, actual),))

    def observe_many(self, outcomes: Iterable[tuple[Proposal | None, int]]) -> None:
        """Fold committed tokens in order, each (the prediction taken before it, the token): as
        ``observe`` one at a time, the class counts in one C call where it is built
        (``acceptance.PRICING``), else four numpy operations a token."""
        kinds: list[int] = []
        evidence: list[int] = []
        hits: list[int] = []
        for predicted, actual in outcomes:
            if predicted is None:
                continue
            hit = int(predicted.token == int(actual))
            self.trials = self.trials * _DECAY + 1.0
            self.hits = self.hits * _DECAY + hit
            kinds.append(int(predicted.kind))
            evidence.append(min(max(int(predicted.evidence), 0), COPY_EVIDENCE_CAP))
            hits.append(hit)
        if not kinds:
            return
        C = acceptance.PRICING
        if C is not None:
            C.observe_classes(self.class_hits, self.class_trials, kinds, evidence, hits, _DECAY,
                              self.class_hits.shape[1])
            return
        for k, e, hit in zip(kinds, evidence, hits):
            self.class_trials *= _DECAY
            self.class_hits *= _DECAY
            self.class_trials[k, e] += 1.0
            self.class_hits[k, e] += hit

    @property
    def value(self) -> float:
        """Posterior mean precision (hits + 1) / (trials + 2) under Beta(1, 1)."""
        return (self.hits + self._a) / (self.trials + self._a + self._b)

    def for_class(self, kind: np.ndarray, evidence: np.ndarray) -> np.ndarray:
        """Precision per proposal class: ``kind`` codes (1 copy, 2 follower; anything else reads
        the overall value) and evidence; shrunk toward the bin, the bin toward ``value``."""
        kind = np.asarray(kind, dtype=np.int64)
        ev = np.minimum(np.maximum(np.asarray(evidence, dtype=np.int64), 0), COPY_EVIDENCE_CAP)
        overall = self.value
        w = CLASS_PRIOR_WEIGHT
        ok = (kind == _COPY) | (kind == _FOLLOWER)
        k = np.where(ok, kind, 0)
        # per (kind, evidence bin): sums over the bin's evidence values, shrunk toward overall
        bh = self.class_hits @ _BIN_MATRIX
        bt = self.class_trials @ _BIN_MATRIX
        b = _BIN_OF[ev]
        prior = (bh[k, b] + w * overall) / (bt[k, b] + w)
        est = (self.class_hits[k, ev] + w * prior) / (self.class_trials[k, ev] + w)
        return np.where(ok, est, overall)

    def for_nodes(self, c: CandidateSet) -> np.ndarray:
        """Per candidate, the committed text's precision for the class of its n-gram proposal (its
        own, the one it agrees with, or the one contradicting it): ``CandidateSet.ng_prec``; the
        overall value for drafter candidates with none."""
        contra = contradicted(c)
        kind = np.where(contra, c.contra_kind, c.ng_kind)
        evidence = np.where(contra, c.contra_evidence, c.ng_evidence)
        return self.for_class(kind, evidence)

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "hits": float(self.hits), "trials": float(self.trials),
                "class_hits": self.class_hits.tolist(), "class_trials": self.class_trials.tolist()}

    def load_state(self, state: dict, where: str = "precision") -> None:
        """Restore from ``state_dict``; StateError (a ValueError naming the field) on a state of
        another version or a malformed one, and then nothing is changed."""
        s = versioned(state, where, STATE_VERSION, ("hits", "trials", "class_hits", "class_trials"))
        # decayed counts: numbers, not integers (states written before the decay held integers)
        hits, trials = number(s["hits"], f"{where}.hits", lo=0.0), number(s["trials"], f"{where}.trials", lo=0.0)
        if hits > trials * (1 + 1e-9):  # decayed sums of the same factors: equal up to rounding
            raise StateError(f"{where}.hits: {hits} hits in {trials} trials")
        rows, cols = self.class_hits.shape  # [NgramKind code][evidence 0..COPY_EVIDENCE_CAP]
        counts = {}
        for name in ("class_hits", "class_trials"):
            table = sequence(s[name], f"{where}.{name}", rows)
            counts[name] = np.array([numbers(r, f"{where}.{name}[{k}]", cols, lo=0.0) for k, r in enumerate(table)],
                                    dtype=np.float64)
        bad = np.argwhere(counts["class_hits"] > counts["class_trials"] * (1 + 1e-9))
        if bad.size:
            k, e = (int(x) for x in bad[0])
            raise StateError(f"{where}.class_hits[{k}][{e}]: more hits than trials")
        self.hits, self.trials = hits, trials
        self.class_hits, self.class_trials = counts["class_hits"], counts["class_trials"]
