"""N-gram fill (§3.3): an index of the request's own text and the chains it proposes.

The index holds the request's committed text (prompt and reply so far). From a starting point,
the anchor or a drafter pick, it follows a chain: the token that followed the most recent
earlier occurrence of the longest matching context, read on along that earlier passage (a
*copy*), or else the most frequent follower of the last ``NGRAM_FOLLOWER_CONTEXT`` (3) tokens (a
*follower*). The chain stops when nothing is proposed or after ``max_depth`` steps; the engine
passes ``NGRAM_MAX_DEPTH`` (32) minus the suffix length so no chain runs more than 32 tokens
below the anchor (Appendix B, Table 14).

An earlier passage "continues" the text only when it matches more than the follower context,
i.e. at least ``NGRAM_MIN_COPY`` = 4 tokens; a shorter match is exactly what the follower table
already covers, and for it the most frequent follower is the better guess than the most recent.

Lookups are hash maps from the last L tokens to the most recent position that followed them,
for a ladder of L from 4 to 32, plus a follower-count table of 3-grams. ``extend`` updates them
for the new tokens only (no rebuild per round); a lookup is at most one dict probe per ladder
length, and reading on along a passage is O(1) per step. Pure Python, no llama_cpp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from adaspark_app.learn.acceptance import EVIDENCE_EDGES  # SourcePrecision's classes are its buckets' bins
from adaspark_app.learn.constants import NGRAM_FOLLOWER_CONTEXT, NGRAM_MAX_DEPTH

# A copy must match more than the follower context (see the module docstring).
NGRAM_MIN_COPY = NGRAM_FOLLOWER_CONTEXT + 1
# Context lengths with a position map. The longest matching length on this ladder picks the
# passage; its true match length (the evidence) is then measured token by token up to the cap.
COPY_CONTEXTS: tuple[int, ...] = tuple(
    L for L in (4, 5, 6, 8, 12, 16, 24, 32) if NGRAM_MIN_COPY <= L <= NGRAM_MAX_DEPTH
) or (NGRAM_MIN_COPY,)
# Copy evidence (matched context length) is capped here: beyond 32 tokens of agreement the
# passage is as certain as the bucket scheme can express.
COPY_EVIDENCE_CAP = NGRAM_MAX_DEPTH

KIND_COPY = "copy"
KIND_FOLLOWER = "follower"
KIND_CODES = {KIND_COPY: 1, KIND_FOLLOWER: 2}  # the acceptance model's ng_kind codes


# SourcePrecision's evidence classes 0..COPY_EVIDENCE_CAP -> the acceptance model's evidence bin
_BIN_OF = np.maximum(np.searchsorted(EVIDENCE_EDGES, np.arange(COPY_EVIDENCE_CAP + 1), side="right") - 1, 0)
_BIN_MATRIX = np.eye(len(EVIDENCE_EDGES), dtype=np.int64)[_BIN_OF]  # (classes, bins) one-hot


@dataclass(frozen=True)
class NgramStep:
    """One proposed token of an n-gram chain.

    ``kind`` is ``"copy"`` (continues an earlier passage) or ``"follower"`` (the most frequent
    follower of the last 3 tokens). ``evidence`` is, for a copy, the length of the matched
    context (capped at ``COPY_EVIDENCE_CAP``); for a follower, its follower count. These feed
    the bucket of Eq. (6)'s n-gram terms.
    """

    token: int
    kind: str
    evidence: int


class NgramIndex:
    """Suffix index of one request's committed text (§3.3 "N-gram candidates").

    Maintained incrementally: ``extend`` with each round's committed tokens. ``chain`` proposes
    a continuation of (committed text + an uncommitted suffix); ``predict_next`` is the top-1
    proposal at the anchor, used to measure the source precision p_src of Eq. (6).
    """

    __slots__ = ("_tokens", "_pos", "_follow", "_best", "_first", "_ambiguous")

    def __init__(self, tokens: Sequence[int] = ()) -> None:
        self._tokens: list[int] = []
        # _pos[L][last L tokens] = index of the token that most recently followed them
        self._pos: dict[int, dict[tuple[int, ...], int]] = {L: {} for L in COPY_CONTEXTS}
        # _follow[3-gram][token] = how often token followed it; _best[3-gram] = (token, count)
        self._follow: dict[tuple[int, ...], dict[int, int]] = {}
        self._best: dict[tuple[int, ...], tuple[int, int]] = {}
        self._first: tuple[int, NgramStep | None] = (-1, None)  # (length, first step) cache
        # contexts of NGRAM_MIN_COPY tokens that earlier passages continued with 2+ different tokens
        self._ambiguous: set[tuple[int, ...]] = set()
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> list[int]:
        """The committed text indexed so far (a copy)."""
        return list(self._tokens)

    def extend(self, tokens: Sequence[int], precision: SourcePrecision | None = None) -> None:
        """Append committed tokens and index them incrementally.

        With ``precision`` given, each token is first predicted from the text before it and the
        outcome folded into that tracker (p_src, Eq. (6)), so ``extend(path, precision)`` after
        each round keeps p_src current with no extra bookkeeping in the engine.
        """
        toks = self._tokens
        pos = self._pos
        f = NGRAM_FOLLOWER_CONTEXT
        for t in tokens:
            t = int(t)
            if precision is not None:
                precision.observe(self.first_step(), t)
            i = len(toks)
            for L, table in pos.items():
                if i >= L:
                    key = tuple(toks[i - L : i])
                    if L == NGRAM_MIN_COPY:
                        q = table.get(key)
                        if q is not None and toks[q] != t:
                            self._ambiguous.add(key)
                    table[key] = i
            if i >= f:
                key = tuple(toks[i - f : i])
                counts = self._follow.get(key)
                if counts is None:
                    counts = self._follow[key] = {}
                c = counts.get(t, 0) + 1
                counts[t] = c
                best = self._best.get(key)
                # ties go to the most recent follower to reach the count
                if best is None or c >= best[1]:
                    self._best[key] = (t, c)
            toks.append(t)

    def chain(self, suffix: Sequence[int] = (), max_depth: int = NGRAM_MAX_DEPTH) -> list[NgramStep]:
        """Continue the text (committed + ``suffix``) for up to ``max_depth`` steps (§3.3).

        Each step proposes the token that followed the most recent earlier occurrence of the
        longest matching context (at least ``NGRAM_MIN_COPY`` tokens) and then reads on along
        that earlier passage; where no passage continues, the most frequent follower of the
        last 3 tokens; the chain stops when nothing is proposed. ``suffix`` holds uncommitted
        tokens (the drafter's picks down to some depth) that the chain starts after. The chain's
        own tokens count as text for the steps after them, so a passage may overlap itself.
        """
        toks = self._tokens
        n = len(toks)
        ext: list[int] = [int(t) for t in suffix]
        out: list[NgramStep] = []
        if max_depth <= 0:
            return out

        def get(i: int) -> int:
            return toks[i] if i < n else ext[i - n]

        def tail(L: int) -> tuple[int, ...]:
            total = n + len(ext)
            start = total - L
            if start >= n:
                return tuple(ext[start - n :])
            if not ext:
                return tuple(toks[start:])
            return tuple(toks[start:]) + tuple(ext)

        p = -1  # position of the next token of the passage being read on (-1: none)
        match = 0
        follow_ctx = NGRAM_FOLLOWER_CONTEXT
        while len(out) < max_depth:
            total = n + len(ext)
            if p >= 0:
                tok = get(p)
                out.append(NgramStep(tok, KIND_COPY, match))
                ext.append(tok)
                p += 1
                # the copied token extends the matched context by one
                match = min(match + 1, COPY_EVIDENCE_CAP)
                continue
            found = -1
            for L in COPY_CONTEXTS:
                if total < L:
                    break
                q = self._pos[L].get(tail(L))
                if q is None:
                    break  # no occurrence of L tokens: none of any longer context either
                found = q
            if found >= 0:
                # measure the true match (the ladder only bounds it from below)
                k = 0
                while k < COPY_EVIDENCE_CAP and found - 1 - k >= 0 and get(found - 1 - k) == get(total - 1 - k):
                    k += 1
                match = k
                p = found
                continue  # the read-on branch above emits the step
            if total < follow_ctx:
                break
            best = self._best.get(tail(follow_ctx))
            if best is None:
                break
            out.append(NgramStep(best[0], KIND_FOLLOWER, best[1]))
            ext.append(best[0])
        return out

    def first_step(self) -> NgramStep | None:
        """The first step of the chain from the end of the committed text (cached per length):
        the probe the draft gate reads before a round, and the prediction p_src is scored on."""
        n = len(self._tokens)
        if self._first[0] != n:
            steps = self.chain((), 1)
            self._first = (n, steps[0] if steps else None)
        return self._first[1]

    def anchor_ambiguous(self) -> bool:
        """Whether the last NGRAM_MIN_COPY committed tokens occurred before followed by two or more
        different tokens. A copy proposed there was picked among passages that part ways at this
        very point, so it is much less likely right than its matched length says: on the long
        pastes, copies matched on 8-15 tokens were right first 54% of the time here, against 96%
        elsewhere (benchmarks/results/ngram_policy_ceiling_longpaste.md)."""
        toks = self._tokens
        return len(toks) >= NGRAM_MIN_COPY and tuple(toks[-NGRAM_MIN_COPY:]) in self._ambiguous

    def predict_next(self) -> int | None:
        """The source's top-1 proposal at the anchor (the end of the committed text), or None.

        Used for the precision p_src of Eq. (6): compare it with the token actually committed.
        """
        step = self.first_step()
        return step.token if step is not None else None


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
    """

    __slots__ = ("hits", "trials", "_a", "_b", "class_hits", "class_trials")

    CLASS_PRIOR_WEIGHT = 16.0

    def __init__(self, prior_hits: float = 1.0, prior_misses: float = 1.0) -> None:
        self.hits = 0
        self.trials = 0
        self._a = float(prior_hits)
        self._b = float(prior_misses)
        # [kind code: 1 copy | 2 follower][evidence 0..COPY_EVIDENCE_CAP]
        self.class_hits = np.zeros((3, COPY_EVIDENCE_CAP + 1), dtype=np.int64)
        self.class_trials = np.zeros((3, COPY_EVIDENCE_CAP + 1), dtype=np.int64)

    def observe(self, predicted: NgramStep | None, actual: int) -> None:
        """Fold one committed token: ``predicted`` is ``first_step()`` taken before it (None: the
        index proposed nothing there, which is not counted)."""
        if predicted is None:
            return
        hit = int(predicted.token == int(actual))
        self.trials += 1
        self.hits += hit
        k = KIND_CODES[predicted.kind]
        e = min(max(int(predicted.evidence), 0), COPY_EVIDENCE_CAP)
        self.class_trials[k, e] += 1
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
        w = self.CLASS_PRIOR_WEIGHT
        ok = (kind == 1) | (kind == 2)
        k = np.where(ok, kind, 0)
        # per (kind, evidence bin): sums over the bin's evidence values, shrunk toward overall
        bh = self.class_hits @ _BIN_MATRIX
        bt = self.class_trials @ _BIN_MATRIX
        b = _BIN_OF[ev]
        prior = (bh[k, b] + w * overall) / (bt[k, b] + w)
        est = (self.class_hits[k, ev] + w * prior) / (self.class_trials[k, ev] + w)
        return np.where(ok, est, overall)

    def state_dict(self) -> dict:
        return {"hits": int(self.hits), "trials": int(self.trials),
                "class_hits": self.class_hits.tolist(), "class_trials": self.class_trials.tolist()}

    def load_state(self, state: dict) -> None:
        """Restore from ``state_dict``; raises ValueError on a malformed state."""
        try:
            hits, trials = int(state["hits"]), int(state["trials"])
            ch = np.asarray(state["class_hits"], dtype=np.int64)
            ct = np.asarray(state["class_trials"], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"n-gram precision state: malformed ({e})") from None
        if ch.shape != self.class_hits.shape or ct.shape != ch.shape or np.any(ch > ct) or hits > trials:
            raise ValueError("n-gram precision state: counts have the wrong shape or more hits than trials")
        self.hits, self.trials, self.class_hits, self.class_trials = hits, trials, ch, ct
