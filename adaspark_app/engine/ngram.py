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

Long copies (issue 19). llama.cpp's ngram-mod drafts only when the last ``LONG_COPY_MATCH`` (24)
tokens occurred before and the text after them chains on for at least ``LONG_COPY_MIN`` (48)
tokens, and then verifies the whole chain (up to 64 tokens). In the replay of Qwen-0.5B's replies
(benchmarks/oracle/ngram_mod_replay.py) its drafts were all right on repeated chat text and about half
right on pastes. Chains here used to stop 32 tokens below the anchor, so no verify could reach
ngram-mod's. ``long_copy_rows`` names the rounds where its rule fires; the engine then follows the
anchor's chain to ``LONG_COPY_DEPTH`` tokens, so Eq. (7) may choose up to 64 rows, and once the copy
is confirmed verifies all of it (``learn.width.long_copy_floor``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from adaspark_app.learn.constants import (COPY_CONTEXT_LADDER, COPY_EVIDENCE_CAP, LONG_COPY_DEPTH, LONG_COPY_MATCH,
                                          LONG_COPY_MIN, NGRAM_FOLLOWER_CONTEXT, NGRAM_MAX_DEPTH)
from adaspark_app.learn.kinds import NgramKind
from adaspark_app.learn.precision import SourcePrecision

# A copy must match more than the follower context (see the module docstring).
NGRAM_MIN_COPY = NGRAM_FOLLOWER_CONTEXT + 1
# Context lengths with a position map. The longest matching length on this ladder picks the
# passage; its true match length (the evidence) is then measured token by token up to the cap.
COPY_CONTEXTS: tuple[int, ...] = tuple(
    L for L in COPY_CONTEXT_LADDER if NGRAM_MIN_COPY <= L <= NGRAM_MAX_DEPTH
) or (NGRAM_MIN_COPY,)
# ngram-mod's rule (llama.cpp common/common.h defaults n_match 24, n_min 48, n_max 64): a copy
# matched on at least LONG_COPY_MATCH tokens whose passage runs on LONG_COPY_MIN more is verified
# whole, up to LONG_COPY_DEPTH tokens (learn/constants.py); LONG_COPY_CONFIRM is the width floor's
# (learn/width.py).


def starts_long_copy(step: "NgramStep | None") -> bool:
    """Whether a chain's first step could start ngram-mod's draft: a copy matched on at least
    LONG_COPY_MATCH tokens."""
    return step is not None and step.kind == NgramKind.COPY and step.evidence >= LONG_COPY_MATCH


def long_copy_rows(steps: Sequence["NgramStep"]) -> int:
    """Rows ngram-mod's rule verifies for the anchor's chain ``steps``: 1 + the chain's leading
    copy steps when the first is a copy matched on >= LONG_COPY_MATCH tokens and they number at
    least LONG_COPY_MIN (capped at LONG_COPY_DEPTH); else 0 (the rule does not fire)."""
    if not steps or not starts_long_copy(steps[0]):
        return 0
    k = 0
    for st in steps[:LONG_COPY_DEPTH]:
        if st.kind != NgramKind.COPY:
            break
        k += 1
    return 1 + k if k >= LONG_COPY_MIN else 0


class NgramStep(NamedTuple):
    """One proposed token of an n-gram chain (a named tuple: a chain makes dozens a round, and a
    frozen dataclass cost a microsecond each to build).

    ``kind`` is ``NgramKind.COPY`` (continues an earlier passage) or ``NgramKind.FOLLOWER`` (the
    most frequent follower of the last 3 tokens). ``evidence`` is, for a copy, the length of the matched
    context (capped at ``COPY_EVIDENCE_CAP``); for a follower, its follower count. These feed
    the bucket of Eq. (6)'s n-gram terms.
    """

    token: int
    kind: NgramKind
    evidence: int


class NgramIndex:
    """Suffix index of one request's committed text (§3.3 "N-gram candidates").

    Maintained incrementally: ``extend`` with each round's committed tokens. ``chain`` proposes
    a continuation of (committed text + an uncommitted suffix); ``predict_next`` is the top-1
    proposal at the anchor, used to measure the source precision p_src of Eq. (6).
    """

    __slots__ = ("_tokens", "_pos", "_follow", "_best", "_first", "_ambiguous", "_long", "_stop")

    def __init__(self, tokens: Sequence[int] = (), stop: Callable[[int], bool] | None = None) -> None:
        """``stop``: tokens no chain proposes; a chain ends before one (``Backend.is_control``).

        A reply that restates the user's message (a function's signature and docstring, a
        pasted passage) matches the end of that message, and the copy read on from there runs
        into the chat template's markers: end of turn, start of turn, the role. The target never
        writes those inside a reply, so every row after the first marker is wasted: on
        Qwen2.5-Coder-1.5B such a copy, cold-measured at 64 rows (26 plain steps), accepted 2.
        """
        self._stop = stop
        self._tokens: list[int] = []
        # _pos[L][last L tokens] = index of the token that most recently followed them
        self._pos: dict[int, dict[tuple[int, ...], int]] = {L: {} for L in COPY_CONTEXTS}
        # _follow[3-gram][token] = how often token followed it; _best[3-gram] = (token, count)
        self._follow: dict[tuple[int, ...], dict[int, int]] = {}
        self._best: dict[tuple[int, ...], tuple[int, int]] = {}
        self._first: tuple[int, NgramStep | None] = (-1, None)  # (length, first step) cache
        # contexts of NGRAM_MIN_COPY tokens that earlier passages continued with 2+ different tokens
        self._ambiguous: set[tuple[int, ...]] = set()
        self._long: tuple[int, int] = (-1, 0)  # (length, long_copy_rows at the anchor) cache
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

        stop = self._stop
        p = -1  # position of the next token of the passage being read on (-1: none)
        match = 0
        follow_ctx = NGRAM_FOLLOWER_CONTEXT
        while len(out) < max_depth:
            total = n + len(ext)
            if p >= 0:
                tok = get(p)
                if stop is not None and stop(tok):
                    break
                out.append(NgramStep(tok, NgramKind.COPY, match))
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
            if best is None or (stop is not None and stop(best[0])):
                break
            out.append(NgramStep(best[0], NgramKind.FOLLOWER, best[1]))
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

    def long_copy(self) -> int:
        """Rows ngram-mod's rule would verify from the end of the committed text (``long_copy_rows``
        of the anchor's chain followed to LONG_COPY_DEPTH), or 0 when it would not draft. Cached
        per length; the chain is only followed when the first step is a long enough copy."""
        n = len(self._tokens)
        if self._long[0] != n:
            # the chain is followed only where its first step could start a long copy
            rows = long_copy_rows(self.chain((), LONG_COPY_DEPTH)) if starts_long_copy(self.first_step()) else 0
            self._long = (n, rows)
        return self._long[1]

    def anchor_depth(self) -> int:
        """How deep the engine follows the anchor's chain: LONG_COPY_DEPTH where ngram-mod's rule
        fires (the copy is verified whole), else NGRAM_MAX_DEPTH."""
        return LONG_COPY_DEPTH if self.long_copy() else NGRAM_MAX_DEPTH

    def anchor_ambiguous(self) -> bool:
        """Whether the last NGRAM_MIN_COPY committed tokens occurred before followed by two or more
        different tokens. A copy proposed there was picked among passages that part ways at this
        very point, so it is much less likely right than its matched length says: on the long
        pastes, copies matched on 8-15 tokens were right first 54% of the time here, against 96%
        elsewhere (benchmarks/results/oracle/ngram_policy_ceiling_longpaste.md)."""
        toks = self._tokens
        return len(toks) >= NGRAM_MIN_COPY and tuple(toks[-NGRAM_MIN_COPY:]) in self._ambiguous

    def predict_next(self) -> int | None:
        """The source's top-1 proposal at the anchor (the end of the committed text), or None.

        Used for the precision p_src of Eq. (6): compare it with the token actually committed.
        """
        step = self.first_step()
        return step.token if step is not None else None
